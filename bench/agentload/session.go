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

// Turn is one request of a session: what to send and how much to ask for.
type Turn struct {
	// Index counts the session's turns from 0.
	Index int
	// Last is true on the session's final turn.
	Last bool
	// System is the run's shared system prompt.
	System string
	// Messages is the full history to send, ending with the new user message.
	// It shares storage with the session: read it, do not modify it.
	Messages []Message
	// MaxTokens is the request's max_tokens.
	MaxTokens int
	// NewTokens is the size of the new user message in tokens.
	NewTokens int
	// Think is the pause before sending the turn.
	Think time.Duration
}

// Generator hands out the sessions of one run. Session i is the same for a
// given Config whatever order or goroutine asks for it.
type Generator struct {
	cfg         Config
	system      string
	deviceID    string
	accountUUID string

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
		cfg:         cfg,
		system:      pseudoText(rng, tokens),
		deviceID:    hex.EncodeToString(digest("device", cfg.Seed, 0)),
		accountUUID: uuidFrom(digest("account", cfg.Seed, 0)),
	}, nil
}

// Config returns the workload the generator draws from.
func (g *Generator) Config() Config { return g.cfg }

// SystemPrompt returns the system prompt shared by every session of the run.
func (g *Generator) SystemPrompt() string { return g.system }

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
// replies. A Session is not safe for concurrent use.
type Session struct {
	// ID is the session's UUID, sent in the session header and metadata.
	ID string
	// Index is the session's rank in the run (0 for the first handed out).
	Index int
	// UserID is Claude Code's metadata.user_id: a JSON string with
	// device_id, account_uuid and session_id.
	UserID string

	gen      *Generator
	rng      *rand.Rand
	turns    int
	history  []Message
	pending  Turn
	awaiting bool
}

// Turns returns how many requests the session makes in all.
func (s *Session) Turns() int { return s.turns }

// Done reports whether every turn has been answered.
func (s *Session) Done() bool { return !s.awaiting && s.answered() >= s.turns }

func (s *Session) answered() int { return len(s.history) / 2 }

// Next returns the turn to send, or false when the session is over. Until
// Reply is called it keeps returning the same turn, so a caller may resend it.
func (s *Session) Next() (Turn, bool) {
	if s.awaiting {
		return s.pending, true
	}
	index := s.answered()
	if index >= s.turns {
		return Turn{}, false
	}
	cfg := s.gen.cfg
	base, spread := cfg.TurnTokens, cfg.TurnTokensSpread
	if index == 0 {
		base, spread = cfg.FirstMessageTokens, cfg.FirstMessageSpread
	}
	tokens := spreadAround(s.rng, base, spread)
	s.history = append(s.history, Message{Role: "user", Content: pseudoText(s.rng, tokens)})
	s.pending = Turn{
		Index:  index,
		Last:   index == s.turns-1,
		System: s.gen.system,
		// The capacity limit keeps a caller's append from writing into the
		// session's own history.
		Messages:  s.history[:len(s.history):len(s.history)],
		MaxTokens: spreadBelow(s.rng, cfg.MaxOutputTokens, cfg.MaxOutputSpread),
		NewTokens: tokens,
	}
	if cfg.ThinkTime > 0 { // drawn only then, so that a workload without pauses keeps its texts
		s.pending.Think = time.Duration(float64(cfg.ThinkTime) * (1 + cfg.ThinkSpread*(2*s.rng.Float64()-1)))
	}
	s.awaiting = true
	return s.pending, true
}

// Reply records the assistant's answer to the pending turn; it is appended to
// the history verbatim and resent with every later turn. It panics if no
// turn is pending, which is a caller bug.
func (s *Session) Reply(text string) {
	if !s.awaiting {
		panic("agentload: Reply without a pending turn")
	}
	s.history = append(s.history, Message{Role: "assistant", Content: text})
	s.awaiting = false
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
