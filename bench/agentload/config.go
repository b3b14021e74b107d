// Package agentload generates the seed's Claude-Code-like workload and plays it
// against an LLM endpoint.
//
// It has three layers:
//
//   - a session model without I/O (Config, Generator, Session, Turn): a shared
//     system prompt, a unique first message per session, then short follow-up
//     turns that resend the whole history with the assistant's actual replies.
//     Everything is drawn from per-session random streams, so a seed gives the
//     same sessions whatever the timing; the virtual-time lab uses this layer
//     directly.
//   - an HTTP runner (Runner) that keeps N sessions busy in a closed loop over
//     Anthropic /v1/messages or OpenAI /v1/chat/completions streaming, and
//     records one Result per request.
//   - summary statistics (Summarize) over a slice of Results and a time window,
//     with the benchmark table's definitions (DESIGN §1).
//
// Texts are pseudo-words at BytesPerToken characters per token, matching the
// simulator's tokenizer, which maps every 4-byte chunk of text to one token.
package agentload

import (
	"errors"
	"flag"
	"fmt"
	"time"
)

// BytesPerToken is how many bytes of generated text make one token for the
// simulator's tokenizer; every generated text is a multiple of it.
const BytesPerToken = 4

// API names the wire protocol the runner speaks.
type API string

// The protocols the runner speaks.
const (
	// APIAnthropic is POST /v1/messages?beta=true streaming, as Claude Code sends it.
	APIAnthropic API = "anthropic"
	// APIOpenAI is POST /v1/chat/completions streaming with usage in the last chunk.
	APIOpenAI API = "openai"
)

// DefaultSessionHeader is the header Claude Code sends on every request of a session.
const DefaultSessionHeader = "X-Claude-Code-Session-Id"

// Config holds every number of the workload. Token counts are nominal; each
// spread is relative (0.1 = ±10%, drawn uniformly). DefaultConfig returns the
// seed's workload.
type Config struct {
	// SystemPromptTokens is the size of the system prompt shared by every
	// session of a run.
	SystemPromptTokens int
	// SystemPromptSpread varies the shared prompt's size from seed to seed
	// (drawn once per run).
	SystemPromptSpread float64
	// FirstMessageTokens is the size of each session's unique first message.
	FirstMessageTokens int
	// FirstMessageSpread varies the first message's size between sessions.
	FirstMessageSpread float64
	// Turns is the number of requests a session makes, the first included.
	Turns int
	// TurnsSpread varies the number of turns between sessions (at least 1).
	TurnsSpread float64
	// TurnTokens is the size of each new user message after the first.
	TurnTokens int
	// TurnTokensSpread varies each follow-up message's size.
	TurnTokensSpread float64
	// MaxOutputTokens is the largest max_tokens a turn asks for.
	MaxOutputTokens int
	// MaxOutputSpread lowers max_tokens per turn: it is drawn uniformly from
	// [MaxOutputTokens×(1-MaxOutputSpread), MaxOutputTokens], never above it.
	MaxOutputSpread float64
	// ThinkTime is the mean pause before each turn, the first included: the
	// time an agent spends running tools and reading between requests.
	ThinkTime time.Duration
	// ThinkSpread is the relative spread of the pause (1 = uniform in
	// [0, 2×ThinkTime]); it also staggers the sessions' starts.
	ThinkSpread float64

	// Seed makes the whole workload reproducible.
	Seed int64
	// Model is sent as the request's model field.
	Model string
	// SessionHeader carries the session ID on every request; empty sends none.
	SessionHeader string
	// API selects the wire protocol.
	API API
	// APIKey, when set, is sent as the client's credential: x-api-key over
	// the Anthropic API, Authorization: Bearer over the OpenAI one. A proxy
	// tells people apart by it.
	APIKey string

	// SmallModel, when set, receives side calls, as Claude Code sends its
	// titles and summaries to its small, fast model under the session's
	// identity: before every SideCallEvery-th turn of a session's main
	// agent (its first included), alongside that turn, one request of its
	// own. It holds a system prompt that every side call of the run shares
	// (SideCallSystemTokens) and SideCallTokens of the session's own text,
	// asks for at most SideCallOutputTokens, and its reply stays out of the
	// conversation.
	SmallModel           string
	SideCallEvery        int
	SideCallTokens       int
	SideCallOutputTokens int

	// NoSessionID sends no conversation ID anywhere: no session header, no
	// metadata.user_id, no agent headers or compaction hints, as Cline,
	// Aider or Qwen Code talk to an OpenAI-compatible server. A proxy can
	// only key such a conversation by its content.
	NoSessionID bool

	// Subagents is how many sub-agents a spawning turn starts (0: none).
	// After every SubagentEvery-th turn of a session (1-based, its last
	// excepted) the agent waits for Subagents children running in
	// parallel, as Claude Code's Task tool does, then goes on. Each child
	// is its own Claude Code agent: the session's header and metadata, its
	// own X-Claude-Code-Agent-Id (new per spawn), no
	// X-Claude-Code-Parent-Agent-Id (a top-level agent, spawned by the
	// session's main agent), the run's system prompt, a first message of
	// SubagentTokens of its own, then SubagentTurns-1 follow-ups of
	// TurnTokens; it sends its first turn at once and pauses ThinkTime
	// before the others.
	Subagents      int
	SubagentTurns  int
	SubagentEvery  int
	SubagentTokens int

	// CompactionEvery compacts a conversation after that many turns of its
	// current prefix (0: never), while turns remain: one summarising
	// request (the whole history plus a summarise instruction, asking for
	// CompactionSummaryTokens), then the conversation goes on from a new
	// prefix, the system prompt and one user message holding the summary
	// and the next turn's text. The summarising request is an extra
	// request: it does not count among Turns. With CompactionHints (and an
	// ID), the summarising request carries X-Claude-Code-Compaction and the
	// first request after it X-Claude-Code-Context-Compacted, as Claude
	// Code does with CLAUDE_CODE_GATEWAY_HINT_HEADERS=1.
	CompactionEvery         int
	CompactionSummaryTokens int
	CompactionHints         bool
}

// DefaultConfig returns the seed's workload: a 3.5k-token system prompt, a
// 7.3k-token first message, five more turns of 400 tokens, at most 256 output
// tokens per turn, over Anthropic streaming with Claude Code's session header.
//
// The pause before each turn averages 3 s. The seed's note calls its load a
// closed loop, but its own table says its sessions were idle about 30% of
// the time: with affinity on at 4 sessions it completed 240 sessions/h (a
// 10 s cycle per turn) while a turn's work (0.4 s to the first token, then
// ~256 tokens at ~25 ms) takes about 7 s, and 4 sessions kept only 2.83
// replicas busy. Without the pause, sessions on a rotating balancer stay in
// lockstep and keep their replica by accident.
func DefaultConfig() Config {
	return Config{
		SystemPromptTokens: 3500,
		FirstMessageTokens: 7300,
		FirstMessageSpread: 0.1,
		Turns:              6,
		TurnTokens:         400,
		TurnTokensSpread:   0.1,
		MaxOutputTokens:    256,
		MaxOutputSpread:    0.1,
		ThinkTime:          3 * time.Second,
		ThinkSpread:        1,
		Seed:               1,
		Model:              "Qwen/Qwen3-4B-Instruct-2507",
		SessionHeader:      DefaultSessionHeader,
		API:                APIAnthropic,

		SubagentTurns:           3,
		SubagentEvery:           3,
		SubagentTokens:          1000,
		CompactionSummaryTokens: 1024,
		CompactionHints:         true,

		SideCallEvery:        3,
		SideCallTokens:       300,
		SideCallOutputTokens: 32,
	}
}

// SideCallSystemTokens is the size of the system prompt the side calls of
// a run share: an instruction such as "write a title for this prompt".
const SideCallSystemTokens = 500

// Validate reports the first setting that cannot produce a workload.
func (c Config) Validate() error {
	var errs []error
	for _, n := range []struct {
		name  string
		value int
	}{
		{"system prompt tokens", c.SystemPromptTokens},
		{"first message tokens", c.FirstMessageTokens},
		{"turns", c.Turns},
		{"turn tokens", c.TurnTokens},
		{"max output tokens", c.MaxOutputTokens},
	} {
		if n.value < 1 {
			errs = append(errs, fmt.Errorf("%s must be at least 1, got %d", n.name, n.value))
		}
	}
	for _, s := range []struct {
		name  string
		value float64
	}{
		{"system prompt spread", c.SystemPromptSpread},
		{"first message spread", c.FirstMessageSpread},
		{"turns spread", c.TurnsSpread},
		{"turn tokens spread", c.TurnTokensSpread},
		{"max output spread", c.MaxOutputSpread},
	} {
		if s.value < 0 || s.value >= 1 {
			errs = append(errs, fmt.Errorf("%s must be in [0, 1), got %g", s.name, s.value))
		}
	}
	if c.ThinkTime < 0 || c.ThinkSpread < 0 || c.ThinkSpread > 1 {
		errs = append(errs, fmt.Errorf("think time must not be negative and its spread in [0, 1], got %v and %g", c.ThinkTime, c.ThinkSpread))
	}
	if c.Subagents < 0 || c.CompactionEvery < 0 {
		errs = append(errs, fmt.Errorf("sub-agents and compaction-every must not be negative, got %d and %d", c.Subagents, c.CompactionEvery))
	}
	if c.Subagents > 0 && (c.SubagentTurns < 1 || c.SubagentEvery < 1 || c.SubagentTokens < 1) {
		errs = append(errs, fmt.Errorf("with sub-agents, their turns, spacing and first message tokens must be at least 1, got %d, %d and %d", c.SubagentTurns, c.SubagentEvery, c.SubagentTokens))
	}
	if c.CompactionEvery > 0 && c.CompactionSummaryTokens < 1 {
		errs = append(errs, fmt.Errorf("with compaction, summary tokens must be at least 1, got %d", c.CompactionSummaryTokens))
	}
	if c.SmallModel != "" && (c.SideCallEvery < 1 || c.SideCallTokens < 1 || c.SideCallOutputTokens < 1) {
		errs = append(errs, fmt.Errorf("with a small model, side-call-every, side-call-tokens and side-call-output-tokens must be at least 1, got %d, %d and %d", c.SideCallEvery, c.SideCallTokens, c.SideCallOutputTokens))
	}
	if c.API != APIAnthropic && c.API != APIOpenAI {
		errs = append(errs, fmt.Errorf("api must be %q or %q, got %q", APIAnthropic, APIOpenAI, c.API))
	}
	if c.Model == "" {
		errs = append(errs, errors.New("model must be set"))
	}
	return errors.Join(errs...)
}

// RegisterFlags adds one flag per workload number, plus the protocol flags
// (api, session-header, model), with c's current values as defaults. It leaves
// Seed to the caller, whose --seed usually drives more than the workload.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.SystemPromptTokens, "system-tokens", c.SystemPromptTokens, "tokens in the system prompt shared by all sessions")
	fs.Float64Var(&c.SystemPromptSpread, "system-spread", c.SystemPromptSpread, "relative spread of the system prompt size (drawn once per seed)")
	fs.IntVar(&c.FirstMessageTokens, "first-tokens", c.FirstMessageTokens, "tokens in each session's unique first message")
	fs.Float64Var(&c.FirstMessageSpread, "first-spread", c.FirstMessageSpread, "relative spread of the first message size")
	fs.IntVar(&c.Turns, "turns", c.Turns, "requests per session, the first included")
	fs.Float64Var(&c.TurnsSpread, "turns-spread", c.TurnsSpread, "relative spread of the number of turns")
	fs.IntVar(&c.TurnTokens, "turn-tokens", c.TurnTokens, "new tokens per follow-up turn")
	fs.Float64Var(&c.TurnTokensSpread, "turn-spread", c.TurnTokensSpread, "relative spread of the follow-up size")
	fs.IntVar(&c.MaxOutputTokens, "max-output-tokens", c.MaxOutputTokens, "largest max_tokens per turn")
	fs.Float64Var(&c.MaxOutputSpread, "output-spread", c.MaxOutputSpread, "max_tokens is drawn from [max×(1-spread), max]")
	fs.DurationVar(&c.ThinkTime, "think-time", c.ThinkTime, "mean pause before each turn (tools, reading)")
	fs.Float64Var(&c.ThinkSpread, "think-spread", c.ThinkSpread, "relative spread of the pause (1: uniform in [0, 2×mean])")
	fs.StringVar(&c.Model, "model", c.Model, "model name sent in requests")
	fs.StringVar(&c.SessionHeader, "session-header", c.SessionHeader, "header carrying the session ID (empty: none)")
	fs.StringVar((*string)(&c.API), "api", string(c.API), "wire protocol: anthropic or openai")
	fs.BoolVar(&c.NoSessionID, "no-session-id", c.NoSessionID, "send no conversation ID anywhere (no header, no metadata.user_id), as header-less clients do")
	fs.IntVar(&c.Subagents, "subagents", c.Subagents, "sub-agents spawned in parallel after every --subagent-every-th turn of a session (0: none)")
	fs.IntVar(&c.SubagentTurns, "subagent-turns", c.SubagentTurns, "turns of each sub-agent")
	fs.IntVar(&c.SubagentEvery, "subagent-every", c.SubagentEvery, "a session spawns its sub-agents after every this-many turns (its last excepted)")
	fs.IntVar(&c.SubagentTokens, "subagent-tokens", c.SubagentTokens, "tokens in a sub-agent's own first message")
	fs.IntVar(&c.CompactionEvery, "compaction-every", c.CompactionEvery, "compact a conversation after this many turns of its current prefix (0: never)")
	fs.IntVar(&c.CompactionSummaryTokens, "compaction-summary-tokens", c.CompactionSummaryTokens, "max_tokens of the summarising request")
	fs.BoolVar(&c.CompactionHints, "compaction-hints", c.CompactionHints, "send Claude Code's hint headers, compaction and side calls' request class (CLAUDE_CODE_GATEWAY_HINT_HEADERS=1)")
	fs.StringVar(&c.SmallModel, "small-model", c.SmallModel, "model name of the side calls (titles, summaries) sent beside the main turns (empty: none)")
	fs.IntVar(&c.SideCallEvery, "side-call-every", c.SideCallEvery, "with --small-model, a side call beside every this-many turns of a session's main agent, its first included")
	fs.IntVar(&c.SideCallTokens, "side-call-tokens", c.SideCallTokens, "tokens of a side call's own text (beside the side calls' shared system prompt)")
	fs.IntVar(&c.SideCallOutputTokens, "side-call-output-tokens", c.SideCallOutputTokens, "max_tokens of a side call")
}

// LevelSeed is the workload seed of one concurrency level of a benchmark
// seeded with seed: each level draws its own sessions, so that a level
// never finds the previous level's conversations in a warm cache, while
// every policy measured at that level gets the same ones.
func LevelSeed(seed int64, sessions int) int64 {
	return seed*1_000_003 + int64(sessions)
}
