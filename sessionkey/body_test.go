package sessionkey

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

func TestFromBody(t *testing.T) {
	cases := []struct{ name, body, want string }{
		{"claude code metadata", `{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":{"user_id":"{\"device_id\":\"d\",\"account_uuid\":\"a\",\"session_id\":\"s-1\"}"},"stream":true}`, "s-1"},
		{"legacy user_id", `{"metadata":{"user_id":"user_abc_account_def_session_s-2"}}`, "s-2"},
		{"plain user_id", `{"metadata":{"user_id":"someone"}}`, "someone"},
		{"openai user", `{"model":"m","user":"u-3","messages":[]}`, "u-3"},
		{"vllm session_id beats user", `{"user":"u","session_id":"s-4"}`, "s-4"},
		{"session_id beats a plain user_id", `{"metadata":{"user_id":"someone"},"session_id":"s-4b"}`, "s-4b"},
		{"codex prompt_cache_key beats client_metadata", `{"model":"m","input":[],"client_metadata":{"session_id":"S"},"prompt_cache_key":"T1"}`, "T1"},
		{"codex client_metadata", `{"client_metadata":{"session_id":"S","thread_id":"T"}}`, "S"},
		{"qwen code dashscope metadata", `{"metadata":{"sessionId":"q-1","promptId":"p"}}`, "q-1"},
		{"cut short after the key", `{"user":"u-5","messages":[{"role":"user","content":"aaaa`, "u-5"},
		{"cut short before the key", `{"messages":[{"role":"user","content":"aaaa`, ""},
		{"not json", `garbage`, ""},
		{"array", `[1,2]`, ""},
		{"wrong type", `{"metadata":{"user_id":42},"user":"u-6"}`, "u-6"},
		{"empty", ``, ""},
	}
	for _, c := range cases {
		if got := FromBody([]byte(c.body)); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

// conversation builds the body an agent sends at a turn: the same head, the
// history so far, the new message; api picks the shape.
type conversation struct {
	api            string // "anthropic", "chat", "responses"
	system, first  string
	replies, users []string // replies[i] answers turn i; users[i] opens turn i+1
	after          string   // fields after the conversation, e.g. a late ID
	before         string   // fields before it
}

func (c conversation) body(turn int) []byte {
	var msgs []map[string]any
	text := func(role, s string, last bool) map[string]any {
		if c.api == "anthropic" {
			block := map[string]any{"type": "text", "text": s}
			if last {
				block["cache_control"] = map[string]string{"type": "ephemeral"} // moves each turn
			}
			return map[string]any{"role": role, "content": []any{block}}
		}
		if c.api == "responses" {
			kind := "input_text"
			if role == "assistant" {
				kind = "output_text"
			}
			return map[string]any{"type": "message", "role": role, "content": []any{map[string]any{"type": kind, "text": s}}}
		}
		return map[string]any{"role": role, "content": s}
	}
	if c.api == "chat" {
		msgs = append(msgs, text("system", c.system, false))
	}
	msgs = append(msgs, text("user", c.first, turn == 0))
	for i := 0; i < turn; i++ {
		reply := text("assistant", c.replies[i], false)
		if c.api == "anthropic" && i == turn-1 {
			// The latest reply keeps its thinking block; older ones lose it.
			reply["content"] = append([]any{map[string]any{"type": "thinking", "thinking": "hmm", "signature": "sig"}}, reply["content"].([]any)...)
		}
		msgs = append(msgs, reply, text("user", c.users[i], i == turn-1))
	}
	conv, _ := json.Marshal(msgs)
	sys, _ := json.Marshal(c.system)
	var b strings.Builder
	b.WriteString(`{"model":"m",` + c.before)
	switch c.api {
	case "anthropic":
		b.WriteString(`"system":[{"type":"text","text":` + string(sys) + `,"cache_control":{"type":"ephemeral"}}],"messages":` + string(conv))
	case "chat":
		b.WriteString(`"messages":` + string(conv))
	case "responses":
		b.WriteString(`"instructions":` + string(sys) + `,"input":` + string(conv))
	}
	b.WriteString(`,"stream":true` + c.after + `}`)
	return []byte(b.String())
}

func newConversation(api, system, first string, seed int) conversation {
	c := conversation{api: api, system: system, first: first}
	for i := range 8 {
		c.replies = append(c.replies, fmt.Sprintf("reply %d of conversation %d", i, seed))
		c.users = append(c.users, fmt.Sprintf("follow-up %d of conversation %d", i, seed))
	}
	return c
}

// A header-less conversation keeps one key from its second turn on, and its
// first turn's key is its parent, for every API; the key survives the
// markers clients move (cache_control) and what they drop (thinking).
func TestFingerprintStableAcrossTurns(t *testing.T) {
	for _, api := range []string{"anthropic", "chat", "responses"} {
		t.Run(api, func(t *testing.T) {
			c := newConversation(api, "You are a coding agent. "+strings.Repeat("Rules. ", 200), "Fix the bug in main.go", 1)
			first := ReadBody(c.body(0), true, true)
			if first.Key == 0 || first.Source != Fingerprint || first.Parent != 0 {
				t.Fatalf("turn 1: %+v", first)
			}
			second := ReadBody(c.body(1), true, true)
			if second.Key == 0 || second.Key == first.Key || second.Parent != first.Key || !second.Continues {
				t.Fatalf("turn 2: %+v, turn 1 key %x", second, first.Key)
			}
			for turn := 2; turn < 8; turn++ {
				if got := ReadBody(c.body(turn), true, true); got != second {
					t.Errorf("turn %d: %+v, want %+v", turn+1, got, second)
				}
			}
		})
	}
}

// Two conversations that share the system prompt and the first message
// (one template, one opening) share only their first turn's key: from
// their first reply on each has its own. Any difference in the first
// message separates them at once.
func TestFingerprintNoFalseMerge(t *testing.T) {
	for _, api := range []string{"anthropic", "chat", "responses"} {
		a := newConversation(api, "Shared system prompt", "Review the pull request", 1)
		b := newConversation(api, "Shared system prompt", "Review the pull request", 2)
		ka, kb := ReadBody(a.body(0), true, true), ReadBody(b.body(0), true, true)
		if ka != kb {
			t.Errorf("%s: identical first turns keyed apart", api)
		}
		for turn := 1; turn < 4; turn++ {
			ka, kb := ReadBody(a.body(turn), true, true), ReadBody(b.body(turn), true, true)
			if ka.Key == kb.Key {
				t.Errorf("%s turn %d: merged", api, turn+1)
			}
			if ka.Parent != kb.Parent {
				t.Errorf("%s turn %d: parents differ, want the shared first turn", api, turn+1)
			}
		}
		c := newConversation(api, "Shared system prompt", "Review the pull request #2", 3)
		if ReadBody(c.body(0), true, true).Key == ka.Key {
			t.Errorf("%s: a different first message shares the key", api)
		}
		d := newConversation(api, "Another system prompt", "Review the pull request", 4)
		if ReadBody(d.body(0), true, true).Key == ka.Key {
			t.Errorf("%s: a different system prompt (before the messages) shares the key", api)
		}
	}
}

// Qwen Code opens every conversation with the same exchange: its context
// (date, directory, files) as a user message and a canned reply. Two
// conversations in one directory on one day then share head and first
// reply; the message after the reply keeps them apart, and each keeps its
// key on every turn.
func TestFingerprintCannedOpeningExchange(t *testing.T) {
	opening := `{"role":"user","content":"Today is Tuesday. My directory is /src. Files: main.go"},` +
		`{"role":"assistant","content":"Got it. Thanks for the context!"}`
	body := func(turns ...string) []byte {
		msgs := opening
		for i, t := range turns {
			msgs += `,{"role":"user","content":` + strconv.Quote(t) + `}`
			if i < len(turns)-1 {
				msgs += `,{"role":"assistant","content":"answer to ` + t + `"}`
			}
		}
		return []byte(`{"model":"m","messages":[{"role":"system","content":"You are Qwen Code."},` + msgs + `]}`)
	}
	a1, a2, a3 := ReadBody(body("fix a"), true, true), ReadBody(body("fix a", "then b"), true, true), ReadBody(body("fix a", "then b", "then c"), true, true)
	b1 := ReadBody(body("write docs"), true, true)
	if a1.Key == 0 || a1 != a2 || a2 != a3 {
		t.Fatalf("conversation a keyed %+v, %+v, %+v: want one key", a1, a2, a3)
	}
	if b1.Key == a1.Key {
		t.Fatal("two conversations behind one canned opening share a key")
	}
	if a1.Parent != b1.Parent || a1.Parent == 0 {
		t.Fatalf("parents %x and %x: want the shared opening", a1.Parent, b1.Parent)
	}
}

func TestReadBodyPrecedence(t *testing.T) {
	c := newConversation("chat", "sys", "hello", 1)
	fp := ReadBody(c.body(2), true, true)

	// An ID before the conversation is read on every turn: it wins.
	early := c
	early.before = `"session_id":"S-early",`
	if got := ReadBody(early.body(2), true, true); got != (Identity{Key: Hash("S-early"), Source: Body}) {
		t.Errorf("early ID: %+v", got)
	}
	// One after it is out of reach once the conversation is long, so the
	// fingerprint names the conversation on every turn instead.
	late := c
	late.after = `,"prompt_cache_key":"T-late","user":"u"`
	if got := ReadBody(late.body(2), true, true); got != fp {
		t.Errorf("late ID with fingerprint: %+v, want the fingerprint %+v", got, fp)
	}
	// Without fingerprints, as before: any conversation ID, then the user.
	if got := ReadBody(late.body(2), true, false); got != (Identity{Key: Hash("T-late"), Source: Body}) {
		t.Errorf("late ID without fingerprint: %+v", got)
	}
	if got := ReadBody([]byte(`{"messages":[{"role":"user","content":"x`), true, false); got != (Identity{}) {
		t.Errorf("cut short: %+v", got)
	}
	// No conversation to fingerprint: the IDs after it still count.
	if got := ReadBody([]byte(`{"messages":[],"user":"u"}`), true, true); got != (Identity{Key: Hash("u"), Source: Body}) {
		t.Errorf("empty messages: %+v", got)
	}
	// A user ID is weaker than a fingerprint (it may hold many conversations).
	if got := ReadBody([]byte(`{"user":"u","messages":[{"role":"user","content":"x"}]}`), true, true); got.Source != Fingerprint {
		t.Errorf("user before messages: %+v, want the fingerprint", got)
	}
}

// The head and the first reply must be read whole: a scan cut inside them
// yields no key (and cuts at the same place on every turn, as they do not
// change). One cut inside the message after the reply keys the
// conversation on the two alone.
func TestFingerprintCutShort(t *testing.T) {
	c := newConversation("responses", "instructions", strings.Repeat("long first message ", 100), 1)
	body := c.body(3)
	full := ReadBody(body, true, true)
	withoutNext := ReadBody(body[:strings.Index(string(body), "follow-up 0")], true, true)
	if withoutNext.Key == 0 || withoutNext.Key == full.Key || withoutNext.Parent != full.Parent {
		t.Fatalf("cut inside the message after the first reply: %+v, full body %+v", withoutNext, full)
	}
	comma := strings.LastIndex(string(body[:strings.Index(string(body), "follow-up 0")]), ",")
	if got := ReadBody(body[:comma], true, true); got != withoutNext {
		t.Fatalf("cut right after the first reply: %+v, want %+v", got, withoutNext)
	}
	for cut := 0; cut < len(body); cut += 7 {
		got := ReadBody(body[:cut], true, true)
		if got.Key != 0 && got != full && got != withoutNext {
			t.Fatalf("cut at %d of %d: %+v, want %+v, %+v or nothing", cut, len(body), got, full, withoutNext)
		}
	}
	// Once the first reply and the message after it are read, the rest of
	// the body does not matter.
	i := strings.Index(string(body), "reply 1")
	if got := ReadBody(body[:i], true, true); got != full {
		t.Errorf("cut after the message that follows the first reply: %+v, want %+v", got, full)
	}
}

// A first tool call that reads a large file puts a message of hundreds of
// KiB after the first reply, which the scan cuts on every turn: the
// conversation still keeps one key from its second turn on.
func TestFingerprintLongMessageAfterTheFirstReply(t *testing.T) {
	const scan = 256 << 10
	for _, api := range []string{"anthropic", "chat", "responses"} {
		c := newConversation(api, "You are a coding agent.", "Read main.go and fix it", 1)
		c.users[0] = strings.Repeat("package main // ", 300<<10/16)
		first := ReadBody(c.body(0), true, true)
		var second Identity
		for turn := 1; turn < 8; turn++ {
			body := c.body(turn)
			got := ReadBody(body[:min(len(body), scan)], true, true)
			if turn == 1 {
				second = got
			}
			if got.Key == 0 || got != second || got.Parent != first.Key {
				t.Errorf("%s turn %d: %+v, want the key of turn 2 (%+v), child of turn 1's %x", api, turn+1, got, second, first.Key)
			}
		}
	}
}

// Not conversations: no key, no entry in the session table.
func TestFingerprintIgnores(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","input":"embed this"}`,
		`{"model":"m","input":["a","b"]}`,
		`{"model":"m","prompt":"complete this"}`,
		`{"messages":[{"role":"assistant","content":"no prompt"}]}`,
		`{"messages":{"role":"user"}}`,
		`{"messages":[1,2,3]}`,
	} {
		if got := ReadBody([]byte(body), true, true); got.Key != 0 {
			t.Errorf("%s: %+v", body, got)
		}
	}
}

// A million distinct conversations: no crash, every key distinct, and
// nothing kept (the bound of the session table is selection's).
func TestManyFingerprints(t *testing.T) {
	n := 1_000_000
	if testing.Short() {
		n = 20_000
	}
	seen := make(map[uint64]struct{}, n)
	for i := range n {
		body := fmt.Appendf(nil, `{"model":"m","messages":[{"role":"system","content":"same"},{"role":"user","content":"task %d"}]}`, i)
		id := ReadBody(body, true, true)
		if id.Key == 0 {
			t.Fatalf("conversation %d: no key", i)
		}
		seen[id.Key] = struct{}{}
	}
	if len(seen) != n {
		t.Errorf("%d keys for %d conversations", len(seen), n)
	}
}

func BenchmarkReadBody(b *testing.B) {
	for _, size := range []int{8 << 10, 64 << 10} {
		c := newConversation("chat", strings.Repeat("system prompt ", size/28), strings.Repeat("first message ", size/28), 1)
		body := c.body(5)
		b.Run(fmt.Sprintf("chat-%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				_ = ReadBody(body, true, true)
			}
		})
	}
}

// With body IDs off, only the fingerprint counts, even after an early ID.
func TestReadBodyWithoutIDs(t *testing.T) {
	c := newConversation("chat", "sys", "hello", 1)
	c.before = `"session_id":"S-early",`
	got := ReadBody(c.body(1), false, true)
	if got.Source != Fingerprint {
		t.Errorf("%+v, want the fingerprint", got)
	}
	if got := ReadBody([]byte(`{"session_id":"s"}`), false, true); got.Key != 0 {
		t.Errorf("%+v, want nothing", got)
	}
}
