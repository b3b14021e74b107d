package agentload

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Message is one entry of the conversation history.
type Message struct {
	// Role is "user" or "assistant".
	Role string
	// Content is the message text, verbatim.
	Content string
}

// TurnKind says what a request does to its conversation's prefix.
type TurnKind uint8

// Kinds of request.
const (
	// TurnNormal resends the history with a new user message.
	TurnNormal TurnKind = iota
	// TurnCompacting is the summarising request: the whole history plus
	// a summarise instruction.
	TurnCompacting
	// TurnCompacted is the first request on the summarised prefix.
	TurnCompacted
)

var turnKindNames = [...]string{"turn", "compacting", "compacted"}

func (k TurnKind) String() string {
	if int(k) < len(turnKindNames) {
		return turnKindNames[k]
	}
	return "unknown"
}

// Turn is one request of a session: what to send and how much to ask for.
type Turn struct {
	// Index counts the requests of the turn's conversation from 0: its
	// agent's (the session's, or a sub-agent's), since its last compaction.
	// A summarising request is the last of the conversation it summarises.
	Index int
	// Last is true on the session's final turn (never on a sub-agent's).
	Last bool
	// Final is true on the last request of the turn's conversation: the
	// session's last turn, a sub-agent's last turn, a summarising request.
	Final bool
	// Segment counts the compactions of the conversation before this turn.
	Segment int
	// Kind says whether the turn summarises its conversation or is the
	// first on a summarised prefix.
	Kind TurnKind
	// Spawns is how many sub-agents the agent starts once this turn is
	// answered (see Session.Spawn), and waits for before its next turn.
	Spawns int
	// System is the run's shared system prompt.
	System string
	// Messages is the full history to send, ending with the new user message.
	// It shares storage with the session: read it, do not modify it.
	Messages []Message
	// MaxTokens is the request's max_tokens.
	MaxTokens int
	// NewTokens is the size of the new user text in tokens (a compacted
	// turn's summary and a summarise instruction's preamble left out).
	NewTokens int
	// Think is the pause before sending the turn.
	Think time.Duration
	// Side marks a side call to Config.SmallModel (Session.SideCall).
	Side bool
}

// model is the model the turn asks for.
func (t Turn) model(cfg Config) string {
	if t.Side {
		return cfg.SmallModel
	}
	return cfg.Model
}

// compactionPromptTokens is the size of the summarise instruction's
// drawn text; CompactedPreamble opens the first message after a compaction.
const (
	compactionPromptTokens = 300
	compactionPromptStart  = "Your task is to create a detailed summary of the conversation so far. "
	// CompactedPreamble opens the first user message of a compacted
	// conversation, before the summary, as Claude Code's does.
	CompactedPreamble = "This session is being continued from a previous conversation that ran out of context. The conversation is summarized below:\n\n"
)

// Generator hands out the sessions of one run. Session i is the same for a
// given Config whatever order or goroutine asks for it.
type Generator struct {
	cfg           Config
	system        string
	sideSystem    string
	compactPrompt string
	deviceID      string
	accountUUID   string

	mu   sync.Mutex
	next int
}

// NewGenerator validates cfg and draws the run's shared system prompt.
func NewGenerator(cfg Config) (*Generator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("agentload: %w", err)
	}
	rng := streamFor("system", cfg.Seed, 0)
	tokens := spreadAround(rng, cfg.SystemPromptTokens, cfg.SystemPromptSpread)
	return &Generator{
		cfg:           cfg,
		system:        pseudoText(rng, tokens),
		sideSystem:    pseudoText(streamFor("side-system", cfg.Seed, 0), SideCallSystemTokens),
		compactPrompt: compactionPromptStart + pseudoText(streamFor("compaction", cfg.Seed, 0), compactionPromptTokens),
		deviceID:      hex.EncodeToString(digest("device", cfg.Seed, 0)),
		accountUUID:   uuidFrom(digest("account", cfg.Seed, 0)),
	}, nil
}

// Config returns the workload the generator draws from.
func (g *Generator) Config() Config { return g.cfg }

// SystemPrompt returns the system prompt shared by every session of the run.
func (g *Generator) SystemPrompt() string { return g.system }

// SideCallSystemPrompt returns the system prompt every side call of the run
// shares (Session.SideCall).
func (g *Generator) SideCallSystemPrompt() string { return g.sideSystem }

// CompactionPrompt returns the summarise instruction a summarising request
// appends to the history.
func (g *Generator) CompactionPrompt() string { return g.compactPrompt }

// NewSession returns the next session of the run. It is safe for concurrent use.
func (g *Generator) NewSession() *Session {
	g.mu.Lock()
	index := g.next
	g.next++
	g.mu.Unlock()

	rng := streamFor("session", g.cfg.Seed, index)
	id := uuidFrom(digest("session", g.cfg.Seed, index))
	userID, err := json.Marshal(struct {
		DeviceID    string `json:"device_id"`
		AccountUUID string `json:"account_uuid"`
		SessionID   string `json:"session_id"`
	}{g.deviceID, g.accountUUID, id})
	if err != nil {
		panic(err) // three strings always marshal
	}
	return &Session{
		ID:     id,
		Index:  index,
		UserID: string(userID),
		gen:    g,
		rng:    rng,
		turns:  spreadAround(rng, g.cfg.Turns, g.cfg.TurnsSpread),
	}
}

// Session is one conversation: it yields turns and takes the assistant's
// replies. The session's main agent is a Session; so is each sub-agent it
// spawns (Spawn), with the session's identity and an AgentID of its own. A
// Session is not safe for concurrent use; its sub-agents are independent of
// it and of each other.
type Session struct {
	// ID is the session's UUID, sent in the session header and metadata.
	ID string
	// Index is the session's rank in the run (0 for the first handed out).
	Index int
	// UserID is Claude Code's metadata.user_id: a JSON string with
	// device_id, account_uuid and session_id.
	UserID string
	// AgentID is a sub-agent's own ID, sent in X-Claude-Code-Agent-Id; ""
	// for the session's main agent.
	AgentID string

	gen   *Generator
	rng   *rand.Rand
	turns int
	// history is the current prefix's conversation.
	history []Message
	// answered counts the user turns answered (summarising requests not
	// included); sinceCompaction those since the last compaction; requests
	// the requests of the current prefix, summarising ones included.
	answered        int
	sinceCompaction int
	requests        int
	segment         int
	// summary is the last compaction's summary, while the turn that
	// carries it has not been drawn yet (compacted says so).
	summary   string
	compacted bool
	spawned   int
	pending   Turn
	awaiting  bool
}

// Turns returns how many user turns the agent makes in all (summarising
// requests not counted).
func (s *Session) Turns() int { return s.turns }

// Done reports whether every turn has been answered.
func (s *Session) Done() bool { return !s.awaiting && s.answered >= s.turns }

func (s *Session) subagent() bool { return s.AgentID != "" }

// Next returns the turn to send, or false when the session is over. Until
// Reply is called it keeps returning the same turn, so a caller may resend it.
func (s *Session) Next() (Turn, bool) {
	if s.awaiting {
		return s.pending, true
	}
	if s.answered >= s.turns {
		return Turn{}, false
	}
	cfg := s.gen.cfg
	if cfg.CompactionEvery > 0 && !s.subagent() && s.sinceCompaction >= cfg.CompactionEvery {
		s.pending = s.summarising()
	} else {
		s.pending = s.userTurn()
	}
	if cfg.ThinkTime > 0 && !(s.subagent() && s.answered == 0) {
		// Drawn only then, so that a workload without pauses keeps its
		// texts. A sub-agent starts at once: its parent just spawned it.
		s.pending.Think = time.Duration(float64(cfg.ThinkTime) * (1 + cfg.ThinkSpread*(2*s.rng.Float64()-1)))
	}
	s.awaiting = true
	return s.pending, true
}

// userTurn draws the next user message and appends it to the history.
func (s *Session) userTurn() Turn {
	cfg := s.gen.cfg
	base, spread := cfg.TurnTokens, cfg.TurnTokensSpread
	if s.answered == 0 {
		base, spread = cfg.FirstMessageTokens, cfg.FirstMessageSpread
		if s.subagent() {
			base = cfg.SubagentTokens
		}
	}
	tokens := spreadAround(s.rng, base, spread)
	text := pseudoText(s.rng, tokens)
	kind := TurnNormal
	if s.compacted {
		text = CompactedPreamble + s.summary + "\n\n" + text
		kind = TurnCompacted
		s.summary, s.compacted = "", false
	}
	s.history = append(s.history, Message{Role: "user", Content: text})
	last := s.answered == s.turns-1
	t := Turn{
		Index:   s.requests,
		Last:    last && !s.subagent(),
		Final:   last,
		Segment: s.segment,
		Kind:    kind,
		System:  s.gen.system,
		// The capacity limit keeps a caller's append from writing into the
		// session's own history.
		Messages:  s.history[:len(s.history):len(s.history)],
		MaxTokens: spreadBelow(s.rng, cfg.MaxOutputTokens, cfg.MaxOutputSpread),
		NewTokens: tokens,
	}
	if cfg.Subagents > 0 && !s.subagent() && !last && (s.answered+1)%cfg.SubagentEvery == 0 {
		t.Spawns = cfg.Subagents
	}
	return t
}

// SideCall returns the side call that goes alongside the pending turn t
// (Config.SmallModel), and false when none does. Its text is drawn from a
// stream of its own, so that side calls leave the conversation's as it is.
func (s *Session) SideCall(t Turn) (Turn, bool) {
	cfg := s.gen.cfg
	if cfg.SmallModel == "" || s.subagent() || t.Kind == TurnCompacting || s.answered%cfg.SideCallEvery != 0 {
		return Turn{}, false
	}
	rng := streamFor(fmt.Sprintf("side/%d", s.Index), cfg.Seed, s.answered)
	return Turn{
		Index:     s.answered / cfg.SideCallEvery,
		Side:      true,
		System:    s.gen.sideSystem,
		Messages:  []Message{{Role: "user", Content: pseudoText(rng, cfg.SideCallTokens)}},
		MaxTokens: cfg.SideCallOutputTokens,
		NewTokens: cfg.SideCallTokens,
	}, true
}

// summarising is the request that compacts the conversation: its history
// and the summarise instruction, which is not kept in the history.
func (s *Session) summarising() Turn {
	messages := append(s.history[:len(s.history):len(s.history)], Message{Role: "user", Content: s.gen.compactPrompt})
	return Turn{
		Index:     s.requests,
		Final:     true,
		Segment:   s.segment,
		Kind:      TurnCompacting,
		System:    s.gen.system,
		Messages:  messages,
		MaxTokens: s.gen.cfg.CompactionSummaryTokens,
		NewTokens: compactionPromptTokens + len(compactionPromptStart)/BytesPerToken,
	}
}

// Reply records the assistant's answer to the pending turn; it is appended to
// the history verbatim and resent with every later turn. The answer to a
// summarising request is the summary: the conversation goes on from a new
// prefix that holds it. Reply panics if no turn is pending, which is a
// caller bug.
func (s *Session) Reply(text string) {
	if !s.awaiting {
		panic("agentload: Reply without a pending turn")
	}
	s.awaiting = false
	if s.pending.Kind == TurnCompacting {
		s.history = nil
		s.summary, s.compacted = text, true
		s.segment++
		s.requests, s.sinceCompaction = 0, 0
		return
	}
	s.history = append(s.history, Message{Role: "assistant", Content: text})
	s.answered++
	s.sinceCompaction++
	s.requests++
}

// Spawn returns the sub-agents started by the turn just answered (its
// Spawns of them): each runs Config.SubagentTurns turns of its own with the
// session's identity and a new AgentID. It is deterministic: the n-th
// spawn of a session always yields the same sub-agents.
func (s *Session) Spawn() []*Session {
	cfg := s.gen.cfg
	label := fmt.Sprintf("agent/%d/%d", s.Index, s.spawned)
	s.spawned++
	children := make([]*Session, cfg.Subagents)
	for j := range children {
		children[j] = &Session{
			ID:      s.ID,
			Index:   s.Index,
			UserID:  s.UserID,
			AgentID: uuidFrom(digest(label, cfg.Seed, j)),
			gen:     s.gen,
			rng:     streamFor(label, cfg.Seed, j),
			turns:   cfg.SubagentTurns,
		}
	}
	return children
}

// digest hashes a label, the seed and an index into 32 bytes: the root of
// every identifier and random stream, so each is independent of the others.
func digest(label string, seed int64, index int) []byte {
	sum := sha256.Sum256(fmt.Appendf(nil, "agentload/%s/%d/%d", label, seed, index))
	return sum[:]
}

// streamFor returns a random stream of its own for (label, seed, index).
func streamFor(label string, seed int64, index int) *rand.Rand {
	d := digest(label, seed, index)
	return rand.New(rand.NewPCG(binary.LittleEndian.Uint64(d[:8]), binary.LittleEndian.Uint64(d[8:16])))
}

// uuidFrom formats the first 16 bytes of b as a version-4 UUID.
func uuidFrom(b []byte) string {
	var u [16]byte
	copy(u[:], b)
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	h := hex.EncodeToString(u[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
