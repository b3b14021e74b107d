package sessionkey

import (
	"net/http"
	"strings"
	"testing"
)

func TestFromHeaders(t *testing.T) {
	h := http.Header{}
	h.Set("Session-Id", "late")
	h.Set("X-Session-Id", "early")
	if got := FromHeaders(h, []string{"X-Claude-Code-Session-Id", "X-Session-Id", "Session-Id"}); got != "early" {
		t.Fatalf("got %q", got)
	}
	if got := FromHeaders(http.Header{}, []string{"X-Session-Id"}); got != "" {
		t.Fatalf("got %q from no headers", got)
	}
}

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

// What each agent sends, as its sources and captures show (see docs/agents.md's
// client table).
func TestDefaultHeadersPerClient(t *testing.T) {
	rules := NewRules(nil, true, true)
	const sess, agent, parent = "5f0c8e3a-1b2c-4d5e-8f90-0123456789ab", "a1b2c3", "p9"
	cases := []struct {
		name string
		h    http.Header
		want Identity
	}{
		{"Claude Code main agent", header("X-Claude-Code-Session-Id", sess),
			Identity{Key: Hash(sess), Source: Header}},
		{"Claude Code sub-agent", header("X-Claude-Code-Session-Id", sess, "X-Claude-Code-Agent-Id", agent),
			Identity{Key: Combine(Hash(sess), Hash(agent)), Parent: Hash(sess), Source: Header}},
		{"Claude Code nested sub-agent", header("X-Claude-Code-Session-Id", sess, "X-Claude-Code-Agent-Id", agent, "X-Claude-Code-Parent-Agent-Id", parent),
			Identity{Key: Combine(Hash(sess), Hash(agent)), Parent: Combine(Hash(sess), Hash(parent)), Source: Header}},
		{"Claude Code fork", header("X-Claude-Code-Session-Id", sess, "X-Claude-Code-Agent-Id", agent, "X-Claude-Code-Agent-Type", "fork"),
			Identity{Key: Combine(Hash(sess), Hash(agent)), Parent: Hash(sess), Continues: true, Source: Header}},
		{"Claude Code summarising request", header("X-Claude-Code-Session-Id", sess, "X-Claude-Code-Compaction", "auto"),
			Identity{Key: Hash(sess), Hint: Compacting, Source: Header}},
		{"Claude Code after compaction", header("X-Claude-Code-Session-Id", sess, "X-Claude-Code-Context-Compacted", "1"),
			Identity{Key: Hash(sess), Hint: Compacted, Source: Header}},
		{"Claude Code title", header("X-Claude-Code-Session-Id", sess, "X-Claude-Code-Request-Class", "auxiliary"),
			Identity{Key: Hash(sess), Auxiliary: true, Source: Header}},
		{"Claude Code main turn with hints", header("X-Claude-Code-Session-Id", sess, "X-Claude-Code-Request-Class", "main"),
			Identity{Key: Hash(sess), Source: Header}},
		{"Codex root thread", header("Session-Id", "T0", "Thread-Id", "T0", "X-Codex-Window-Id", "T0:0"),
			Identity{Key: Hash("T0"), Source: Header}},
		{"Codex sub-agent thread", header("Session-Id", "T0", "Thread-Id", "T1", "X-Openai-Subagent", "collab_spawn", "X-Codex-Parent-Thread-Id", "T0"),
			Identity{Key: Hash("T1"), Parent: Hash("T0"), Source: Header}},
		{"Codex nested thread", header("Session-Id", "T0", "Thread-Id", "T2", "X-Openai-Subagent", "collab_spawn", "X-Codex-Parent-Thread-Id", "T1"),
			Identity{Key: Hash("T2"), Parent: Hash("T1"), Source: Header}},
		{"Codex review sub-agent without parent header", header("Session-Id", "T0", "Thread-Id", "T3", "X-Openai-Subagent", "review"),
			Identity{Key: Hash("T3"), Parent: Hash("T0"), Source: Header}},
		{"Codex compaction", header("Session-Id", "T0", "Thread-Id", "T0", "X-Codex-Turn-Metadata",
			`{"session_id":"T0","thread_id":"T0","turn_id":"u","window_id":"T0:0","request_kind":"compaction","trigger":"auto"}`),
			Identity{Key: Hash("T0"), Hint: Compacting, Source: Header}},
		{"Codex ordinary turn metadata", header("Session-Id", "T0", "Thread-Id", "T0", "X-Codex-Turn-Metadata", `{"request_kind":"turn"}`),
			Identity{Key: Hash("T0"), Source: Header}},
		{"older Codex without Thread-Id", header("Session-Id", "S"), Identity{Key: Hash("S"), Source: Header}},
		{"OpenCode", header("X-Session-Id", "ses_1", "X-Session-Affinity", "ses_1"), Identity{Key: Hash("ses_1"), Source: Header}},
		{"OpenCode child session", header("X-Session-Id", "ses_2", "X-Session-Affinity", "ses_2", "X-Parent-Session-Id", "ses_1"),
			Identity{Key: Hash("ses_2"), Parent: Hash("ses_1"), Source: Header}},
		{"OpenCode with its own providers", header("X-Opencode-Session", "ses_3"), Identity{Key: Hash("ses_3"), Source: Header}},
		{"Crush", header("x-session-id", "9f2c", "x-session-affinity", "9f2c"), Identity{Key: Hash("9f2c"), Source: Header}},
		{"Goose", header("agent-session-id", "20260809_29"), Identity{Key: Hash("20260809_29"), Source: Header}},
		{"nothing", header("User-Agent", "aider"), Identity{}},
	}
	for _, c := range cases {
		if got := rules.FromHeaders(c.h); got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}

// With sub-agents and compaction off, a session is one conversation and
// hints are ignored.
func TestRulesOff(t *testing.T) {
	rules := NewRules(nil, false, false)
	h := header("X-Claude-Code-Session-Id", "s", "X-Claude-Code-Agent-Id", "a", "X-Claude-Code-Context-Compacted", "1")
	if got := rules.FromHeaders(h); got != (Identity{Key: Hash("s"), Source: Header}) {
		t.Errorf("got %+v", got)
	}
	// Custom names replace the defaults, in their order, case-insensitively.
	rules = NewRules([]string{"x-conversation", "X-TENANT-SESSION"}, true, true)
	if got := rules.FromHeaders(header("X-Claude-Code-Session-Id", "d", "X-Tenant-Session", "t")); got.Key != Hash("t") {
		t.Errorf("custom headers: %+v", got)
	}
}

func TestRequestKindScan(t *testing.T) {
	for m, want := range map[string]bool{
		`{"request_kind":"compaction"}`:                         true,
		`{"request_kind" : "compaction" }`:                      true,
		`{"a":"\"request_kind\":\"compaction\""}`:               false,
		`{"request_kind":"turn","x":"compaction"}`:              false,
		`{"request_kind":"turn"},{"request_kind":"compaction"}`: true,
		`"request_kind"`:                                        false,
		`"request_kind":`:                                       false,
		`garbage`:                                               false,
		``:                                                      false,
	} {
		if got := requestKindCompaction(m); got != want {
			t.Errorf("%s: %v, want %v", m, got, want)
		}
	}
}

// Hostile X-Codex-Turn-Metadata: huge, malformed, repeated; bounded work,
// no hint, no panic.
func TestHostileTurnMetadata(t *testing.T) {
	rules := NewRules(nil, true, true)
	huge := `{"x":"` + strings.Repeat("a", 1<<20) + `","request_kind":"compaction"}`
	for _, m := range []string{huge, strings.Repeat(`"request_kind"`, 1000), strings.Repeat(`"request_kind":`, 500), "\x00\xff{", `{"request_kind":`} {
		id := rules.FromHeaders(header("Thread-Id", "T", "X-Codex-Turn-Metadata", m))
		if id.Key != Hash("T") || id.Hint != NoHint {
			t.Errorf("metadata of %d bytes: %+v", len(m), id)
		}
	}
}

// The pinned lookup's key costs no allocation, with every header a busy
// agent sends.
func TestFromHeadersAllocs(t *testing.T) {
	rules := NewRules(nil, true, true)
	for _, h := range []http.Header{
		header("X-Claude-Code-Session-Id", "5f0c8e3a-1b2c-4d5e-8f90-0123456789ab", "X-Claude-Code-Agent-Id", "agent-1"),
		header("Session-Id", "T0", "Thread-Id", "T1", "X-Openai-Subagent", "collab_spawn", "X-Codex-Turn-Metadata",
			`{"session_id":"T0","thread_id":"T1","turn_id":"u","request_kind":"turn"}`),
		header("X-Session-Id", "ses_2", "X-Parent-Session-Id", "ses_1"),
	} {
		if n := testing.AllocsPerRun(100, func() { _ = rules.FromHeaders(h) }); n != 0 {
			t.Errorf("%v: %.0f allocations", h, n)
		}
	}
}

func BenchmarkFromHeadersClaude(b *testing.B) {
	rules := NewRules(nil, true, true)
	h := header("X-Claude-Code-Session-Id", "5f0c8e3a-1b2c-4d5e-8f90-0123456789ab", "User-Agent", "claude-cli/2.1.300")
	b.ReportAllocs()
	for b.Loop() {
		_ = rules.FromHeaders(h)
	}
}

func BenchmarkFromHeadersCodex(b *testing.B) {
	rules := NewRules(nil, true, true)
	h := header("Session-Id", "019a-t0", "Thread-Id", "019a-t0", "X-Codex-Turn-Metadata",
		`{"session_id":"019a-t0","thread_id":"019a-t0","turn_id":"019a-u","window_id":"019a-t0:0","request_kind":"turn"}`)
	b.ReportAllocs()
	for b.Loop() {
		_ = rules.FromHeaders(h)
	}
}

// Hash is a stored format: pin snapshots and shared pins keep its values,
// so it must not change from one version to the next.
func TestHashIsStable(t *testing.T) {
	for id, want := range map[string]uint64{"": 0xef46db3751d8e999, "5f0c8e3a-1b2c-4d5e-8f90-0123456789ab": 0xd7b060323dd705e7} {
		if got := Hash(id); got != want {
			t.Errorf("Hash(%q) = %#x, want %#x", id, got, want)
		}
	}
}
