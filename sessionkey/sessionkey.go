// Package sessionkey finds the conversation a request belongs to: in the
// headers coding agents send (with their sub-agents and compaction hints), in
// the body of an Anthropic Messages, OpenAI Chat Completions or Responses
// request, or, for clients that send no ID at all, in a fingerprint of the
// conversation's head. Every key leaves this package hashed: raw IDs are
// never kept. The same walk of a body reads the model it names (Model), and
// Flow tells whose a request is, for load control's fair share.
package sessionkey

import (
	"net/http"
	"net/textproto"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Hash turns a conversation ID into the 64-bit key the session table
// stores (selection.HashKey is this function): xxhash, as Caddy's own
// hashing policies use, stable across processes, so pins made from a
// header, a body field or a snapshot agree and runs are reproducible. 0
// stands for "no key", so it is never returned.
func Hash(id string) uint64 {
	h := xxhash.Sum64String(id)
	if h == 0 {
		h = 1
	}
	return h
}

// Combine is the key of a conversation named within another, such as a
// sub-agent within its session: a mix of both keys, never 0.
func Combine(outer, inner uint64) uint64 {
	x := outer*0x9e3779b97f4a7c15 ^ inner
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	if x == 0 {
		x = 1
	}
	return x
}

// Source says where a request's key came from.
type Source uint8

// Sources of a key.
const (
	None Source = iota
	Header
	Body
	Fingerprint
)

var sourceNames = [...]string{"none", "header", "body", "fingerprint"}

func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "unknown"
}

// Hint is what a request says about its conversation's prefix.
type Hint uint8

// Compaction hints.
const (
	NoHint Hint = iota
	// Compacting is the request that summarises the conversation. Its
	// prompt is still the old history (the agents append the summary
	// instruction to it), so it belongs on the conversation's replica, where
	// that history is cached; the request after it starts a new prefix.
	Compacting
	// Compacted is the first request on the new, summarised prefix: no
	// replica holds it, so it is placed by load like a new conversation.
	Compacted
)

// Identity is what a request says about its conversation. Keys are hashed.
type Identity struct {
	// Key names the conversation; 0 when the request names none.
	Key uint64
	// Parent is the conversation this one was spawned by (a sub-agent's
	// agent) or continues (a fingerprinted conversation's first turn); 0
	// when none. A new conversation is placed beside its parent when the
	// parent's replica has room.
	Parent uint64
	// Continues is true when the conversation's prompt starts with its
	// parent's (a fork, or a fingerprinted conversation past its first
	// turn): the parent's replica holds its prefix.
	Continues bool
	// Renamed is true when Parent is this same conversation's earlier key
	// (a fingerprinted conversation's first turn).
	Renamed bool
	// Hint is the compaction hint the request carries.
	Hint Hint
	// Auxiliary: the agent says the request is a side call of the
	// conversation (Claude Code's request class "auxiliary": a title, a
	// classifier), whose prompt is its own and continues nothing; load
	// control lets it through untouched.
	Auxiliary bool
	// Source is where Key came from.
	Source Source
}

// Header names the rules read besides the session headers. They are in
// canonical form, so that they index an http.Header directly.
const (
	claudeSession     = "X-Claude-Code-Session-Id"
	claudeAgent       = "X-Claude-Code-Agent-Id"
	claudeParentAgent = "X-Claude-Code-Parent-Agent-Id"
	claudeAgentType   = "X-Claude-Code-Agent-Type"
	claudeCompaction  = "X-Claude-Code-Compaction"
	claudeCompacted   = "X-Claude-Code-Context-Compacted"
	claudeClass       = "X-Claude-Code-Request-Class"
	codexSession      = "Session-Id"
	codexThread       = "Thread-Id"
	codexParent       = "X-Codex-Parent-Thread-Id"
	codexSubagent     = "X-Openai-Subagent"
	codexTurnMetadata = "X-Codex-Turn-Metadata"
	parentSession     = "X-Parent-Session-Id"
)

// DefaultHeaders name the conversation, first present wins:
//
//   - X-Claude-Code-Session-Id: Claude Code, on every request (sub-agents
//     included; see the agent headers below).
//   - X-Session-Id, X-Session-Affinity: OpenCode (>= 1.17) and Crush, with
//     the same value; the convention of several gateways.
//   - X-Opencode-Session: OpenCode with its own providers, and clients that
//     copied it.
//   - Thread-Id before Session-Id: Codex. Its Session-Id names a thread
//     group, shared by the root thread and every sub-agent thread, while
//     each thread has its own history (prompt_cache_key is the thread id,
//     and OpenAI's own cache is keyed by it). The prefix a replica caches
//     is a thread's, so the thread is the conversation; on a root thread
//     both carry the same value.
//   - Agent-Session-Id: Goose.
//
// Underscore spellings (session_id, thread_id) are not listed: Caddy
// (v2.11.4 and later) deletes such headers before any handler runs.
var DefaultHeaders = []string{
	claudeSession, "X-Session-Id", "X-Session-Affinity", "X-Opencode-Session",
	codexThread, codexSession, "Agent-Session-Id",
}

// IDHeaders are the headers the rules read whose values name or link a
// conversation: the default session headers, the agents' own and their
// parents', and Codex's turn metadata (which carries its session and thread
// IDs). A log filter that hashes these keeps every ID warden reads out of
// Caddy's logs (examples/Caddyfile.retries).
var IDHeaders = append(slices.Clone(DefaultHeaders),
	claudeAgent, claudeParentAgent, codexParent, parentSession, codexTurnMetadata)

// Rules read a request's conversation from its headers. Make them once per
// configuration with NewRules; they are immutable and safe for concurrent
// use.
type Rules struct {
	names      []string
	subagents  bool
	compaction bool
}

// NewRules reads the conversation from the first present header of names
// (DefaultHeaders when empty). With subagents, the agents' own headers split
// a session into one conversation per agent, each knowing its parent; with
// compaction, their compaction hints are read.
func NewRules(names []string, subagents, compaction bool) *Rules {
	if len(names) == 0 {
		names = DefaultHeaders
	}
	canon := make([]string, len(names))
	for i, n := range names {
		canon[i] = textproto.CanonicalMIMEHeaderKey(n)
	}
	return &Rules{names: canon, subagents: subagents, compaction: compaction}
}

// get is http.Header.Get for a canonical name, without canonicalising it
// again.
func get(h http.Header, canonicalName string) string {
	if v := h[canonicalName]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// FromHeaders reads the conversation named by the headers; Key is 0 when
// none names it. It does not allocate.
func (r *Rules) FromHeaders(h http.Header) Identity {
	for _, name := range r.names {
		v := get(h, name)
		if v == "" {
			continue
		}
		id := Identity{Key: Hash(v), Source: Header}
		if r.subagents {
			lineage(h, name, v, &id)
		}
		if r.compaction {
			id.Hint = compactionHint(h, name)
		}
		// Sent with the compaction hints (CLAUDE_CODE_GATEWAY_HINT_HEADERS=1).
		id.Auxiliary = name == claudeSession && strings.EqualFold(get(h, claudeClass), "auxiliary")
		return id
	}
	return Identity{}
}

// lineage splits sub-agents off their session and names their parent.
func lineage(h http.Header, name, value string, id *Identity) {
	switch name {
	case claudeSession:
		// Sub-agent requests carry the session's ID too, plus their own
		// agent ID (new for each spawn); a nested agent also names the agent
		// that spawned it, a top-level one was spawned by the session.
		agent := get(h, claudeAgent)
		if agent == "" {
			return
		}
		session := id.Key
		id.Key = Combine(session, Hash(agent))
		id.Parent = session
		if p := get(h, claudeParentAgent); p != "" && p != agent {
			id.Parent = Combine(session, Hash(p))
		}
		// A fork inherits the whole conversation of its parent (sent only
		// with CLAUDE_CODE_GATEWAY_HINT_HEADERS=1).
		id.Continues = strings.EqualFold(get(h, claudeAgentType), "fork")
	case codexThread:
		// A sub-agent thread names its parent thread; without that header,
		// a marked sub-agent was spawned by the thread group's root, whose
		// thread ID is the session ID.
		if p := get(h, codexParent); p != "" && p != value {
			id.Parent = Hash(p)
		} else if get(h, codexSubagent) != "" {
			if s := get(h, codexSession); s != "" && s != value {
				id.Parent = Hash(s)
			}
		}
	default:
		// OpenCode: a child session has its own ID and names its parent.
		if p := get(h, parentSession); p != "" && p != value {
			id.Parent = Hash(p)
		}
	}
}

// maxTurnMetadata bounds the Codex turn metadata read for a compaction hint
// (Codex sends a few hundred bytes); a longer header is ignored.
const maxTurnMetadata = 8 << 10

// compactionHint reads the compaction hints of the agent whose session
// header (name) named the conversation: Claude Code's (sent only with
// CLAUDE_CODE_GATEWAY_HINT_HEADERS=1), Codex's.
func compactionHint(h http.Header, name string) Hint {
	switch name {
	case claudeSession:
		if get(h, claudeCompacted) != "" {
			return Compacted
		}
		if get(h, claudeCompaction) != "" {
			return Compacting
		}
	case codexThread, codexSession:
		if strings.EqualFold(get(h, codexSubagent), "compact") {
			return Compacting
		}
		if m := get(h, codexTurnMetadata); m != "" && len(m) <= maxTurnMetadata && requestKindCompaction(m) {
			return Compacting
		}
	}
	return NoHint
}

// requestKindCompaction reports whether Codex's turn metadata (JSON) has
// "request_kind":"compaction". It scans rather than decodes, so that a turn
// costs no allocation: a malformed header is only a routing hint for the
// client's own conversation, and an escaped quote inside another string
// (\"request_kind\") does not match the pattern.
func requestKindCompaction(m string) bool {
	const key = `"request_kind"`
	for {
		i := strings.Index(m, key)
		if i < 0 {
			return false
		}
		m = strings.TrimLeft(m[i+len(key):], " \t\r\n")
		if rest, ok := strings.CutPrefix(m, ":"); ok {
			if strings.HasPrefix(strings.TrimLeft(rest, " \t\r\n"), `"compaction"`) {
				return true
			}
		}
	}
}

// FromHeaders returns the value of the first header of names that is present
// and not empty.
func FromHeaders(h http.Header, names []string) string {
	for _, name := range names {
		if v := h.Get(name); v != "" {
			return v
		}
	}
	return ""
}
