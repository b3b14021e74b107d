package caddymodule_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/testrun"
)

// What each coding agent sends, as its sources show (see docs/agents.md's client
// table): the path, the headers and the body of turn n of conversation conv.
// Bodies grow as the agents' do: the whole history every turn.
type agentClient struct {
	name   string
	source string // warden.key_source expected
	turn   func(conv string, n int) agentRequest
}

type agentRequest struct {
	path   string
	header []string
	body   []byte
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// history is the messages of turn n (n replies so far), OpenAI chat style.
func chatHistory(system, conv string, n int) []map[string]any {
	msgs := []map[string]any{{"role": "system", "content": system}, {"role": "user", "content": "Task of " + conv + ": fix the failing test"}}
	for i := range n {
		msgs = append(msgs,
			map[string]any{"role": "assistant", "content": fmt.Sprintf("step %d of %s", i, conv)},
			map[string]any{"role": "user", "content": fmt.Sprintf("tool output %d", i)})
	}
	return msgs
}

func anthropicBody(conv string, n int, metadata map[string]any) []byte {
	msgs := []map[string]any{{"role": "user", "content": []any{map[string]any{"type": "text", "text": "<system-reminder>CLAUDE.md</system-reminder> task of " + conv}}}}
	for i := range n {
		msgs = append(msgs,
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": fmt.Sprintf("toolu_%s_%d", conv, i), "name": "Bash", "input": map[string]string{"command": "ls"}}}},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": fmt.Sprintf("toolu_%s_%d", conv, i), "content": "ok"}}})
	}
	// The latest message carries the cache breakpoint.
	last := msgs[len(msgs)-1]["content"].([]any)
	last[len(last)-1].(map[string]any)["cache_control"] = map[string]string{"type": "ephemeral"}
	body := map[string]any{"model": "m", "max_tokens": 8, "stream": true, "messages": msgs,
		"system": []any{map[string]any{"type": "text", "text": "You are Claude Code.", "cache_control": map[string]string{"type": "ephemeral"}}}}
	if metadata != nil {
		body["metadata"] = metadata
	}
	return mustJSON(body)
}

// responsesBody is Codex's request: instructions, input, then the rest, in
// the order its serialiser writes them.
func responsesBody(conv string, n int) []byte {
	input := []any{
		map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "<user_instructions>AGENTS.md</user_instructions>"}}},
		map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "task of " + conv}}},
	}
	for i := range n {
		input = append(input,
			map[string]any{"type": "reasoning", "summary": []any{}, "encrypted_content": fmt.Sprintf("enc-%d", i)},
			map[string]any{"type": "function_call", "name": "shell", "arguments": `{"command":["ls"]}`, "call_id": fmt.Sprintf("call_%s_%d", conv, i)},
			map[string]any{"type": "function_call_output", "call_id": fmt.Sprintf("call_%s_%d", conv, i), "output": "ok"})
	}
	var b bytes.Buffer
	b.WriteString(`{"model":"m","instructions":"You are Codex.","input":`)
	b.Write(mustJSON(input))
	b.WriteString(`,"tools":[],"tool_choice":"auto","parallel_tool_calls":false,"store":false,"stream":true,"include":[],"prompt_cache_key":"` + conv + `"}`)
	return b.Bytes()
}

func chatBody(conv string, n int, extra map[string]any) []byte {
	body := map[string]any{"model": "m", "stream": true, "messages": chatHistory("You are a coding agent. "+strings.Repeat("Rules. ", 500), conv, n)}
	for k, v := range extra {
		body[k] = v
	}
	return mustJSON(body)
}

var agentClients = []agentClient{
	{"claude-code", "header", func(conv string, n int) agentRequest {
		userID := string(mustJSON(map[string]string{"device_id": "d", "account_uuid": "a", "session_id": conv}))
		return agentRequest{"/v1/messages?beta=true", []string{"X-Claude-Code-Session-Id", conv, "Anthropic-Version", "2023-06-01"},
			anthropicBody(conv, n, map[string]any{"user_id": userID})}
	}},
	{"codex", "header", func(conv string, n int) agentRequest {
		meta := fmt.Sprintf(`{"session_id":%q,"thread_id":%q,"turn_id":"turn-%d","window_id":"%s:0","request_kind":"turn"}`, conv, conv, n, conv)
		return agentRequest{"/v1/responses", []string{"Session-Id", conv, "Thread-Id", conv, "X-Client-Request-Id", conv,
			"X-Codex-Window-Id", conv + ":0", "X-Codex-Turn-Metadata", meta}, responsesBody(conv, n)}
	}},
	{"opencode", "header", func(conv string, n int) agentRequest {
		return agentRequest{"/v1/chat/completions", []string{"X-Session-Id", "ses_" + conv, "X-Session-Affinity", "ses_" + conv}, chatBody(conv, n, nil)}
	}},
	{"crush", "header", func(conv string, n int) agentRequest {
		h := fmt.Sprintf("%016x", len(conv)*7919+int(conv[len(conv)-1]))
		return agentRequest{"/v1/chat/completions", []string{"x-session-id", h, "x-session-affinity", h}, chatBody(conv, n, nil)}
	}},
	{"goose", "header", func(conv string, n int) agentRequest {
		return agentRequest{"/v1/chat/completions", []string{"agent-session-id", "20260809_" + conv}, chatBody(conv, n, nil)}
	}},
	// Caddy deletes the underscore header before warden sees it; the
	// fingerprint (instructions and first input items) keys it instead of the
	// prompt_cache_key, written after the whole input.
	{"codex-underscore", "fingerprint", func(conv string, n int) agentRequest {
		return agentRequest{"/v1/responses", []string{"session_id", conv}, responsesBody(conv, n)}
	}},
	{"openai-compatible-no-id", "fingerprint", func(conv string, n int) agentRequest {
		return agentRequest{"/v1/chat/completions", []string{"User-Agent", "QwenCode/0.9"}, chatBody(conv, n, nil)}
	}},
	{"anthropic-no-id", "fingerprint", func(conv string, n int) agentRequest {
		return agentRequest{"/v1/messages", nil, anthropicBody(conv, n, nil)}
	}},
	{"body-session-id", "body", func(conv string, n int) agentRequest {
		var b bytes.Buffer
		b.WriteString(`{"session_id":"` + conv + `",`)
		rest := chatBody(conv, n, nil)
		b.Write(rest[1:])
		return agentRequest{"/v1/chat/completions", nil, b.Bytes()}
	}},
}

// observedProxy makes the outcome and key source visible to the tests, in
// response headers.
const observedProxy = "header_down X-Warden-Outcome {http.vars.warden.outcome}\n\t\theader_down X-Warden-Key-Source {http.vars.warden.key_source}"

type served struct{ backend, outcome, source string }

// agentTurn sends one request of conversation conv and reads it whole.
func (f *fleet) agentTurn(t *testing.T, conv string, r agentRequest, header ...string) served {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+f.site+r.path, bytes.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(conversationHeader, conv)
	h := append(append([]string{}, r.header...), header...)
	for i := 0; i+1 < len(h); i += 2 {
		req.Header[http.CanonicalHeaderKey(h[i])] = []string{h[i+1]}
		if strings.Contains(h[i], "_") {
			req.Header[h[i]] = []string{h[i+1]} // sent as written
		}
	}
	resp, err := siteClient.Do(req)
	if err != nil {
		t.Error(err)
		return served{}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("%s: status %s", conv, resp.Status)
	}
	return served{resp.Header.Get("X-Backend"), resp.Header.Get("X-Warden-Outcome"), resp.Header.Get("X-Warden-Key-Source")}
}

// Every agent is keyed with no configuration: the turns of a conversation
// reach one replica, two conversations of the same client are placed on two.
func TestEveryAgentKeyedByDefault(t *testing.T) {
	for _, c := range agentClients {
		t.Run(c.name, func(t *testing.T) {
			backends := []*fakeVLLM{startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1), startFakeVLLM(t, "c", 1)}
			f, _ := runCaddy(t, caddySetup{modelBlock: "replicas {replicas}", proxyOptions: observedProxy}, addresses(backends)...)
			convs := []string{c.name + "-one", c.name + "-two"}
			homes := make([]served, len(convs))
			gate, open := newGate(t)
			var wg sync.WaitGroup
			for i := range convs {
				wg.Go(func() { homes[i] = f.agentTurn(t, convs[i], c.turn(convs[i], 0), gateHeader, gate) })
			}
			testrun.Eventually(t, 10*time.Second, "both first turns in flight", func() bool { return inFlight(backends...) == 2 })
			open()
			wg.Wait()
			if homes[0].backend == homes[1].backend {
				t.Errorf("two conversations both on %s", homes[0].backend)
			}
			for i, conv := range convs {
				if homes[i].outcome != "placed" || homes[i].source != c.source {
					t.Errorf("%s turn 1: %+v, want placed, keyed by %s", conv, homes[i], c.source)
				}
				for n := 1; n < 4; n++ {
					got := f.agentTurn(t, conv, c.turn(conv, n))
					if got.backend != homes[i].backend || got.source != c.source {
						t.Errorf("%s turn %d: %+v, want %s keyed by %s", conv, n+1, got, homes[i].backend, c.source)
					}
				}
			}
			for conv, engines := range sessionsSeen(backends...) {
				if len(engines) != 1 {
					t.Errorf("%s reached %v", conv, engines)
				}
			}
		})
	}
}

// Claude Code, Codex and OpenCode sub-agents: each child is its own
// conversation; parallel children spread over the replicas, the first one
// beside its parent, and each then stays where it was placed.
func TestSubAgentsSpreadAndStay(t *testing.T) {
	type family struct {
		name   string
		parent func() agentRequest
		child  func(i int) agentRequest
	}
	families := []family{
		{"claude-code",
			func() agentRequest {
				return agentRequest{"/v1/messages", []string{"X-Claude-Code-Session-Id", "S"}, anthropicBody("S", 1, nil)}
			},
			func(i int) agentRequest {
				return agentRequest{"/v1/messages", []string{"X-Claude-Code-Session-Id", "S", "X-Claude-Code-Agent-Id", fmt.Sprintf("agent-%d", i)},
					anthropicBody(fmt.Sprintf("child-%d", i), 0, nil)}
			}},
		{"codex",
			func() agentRequest {
				return agentRequest{"/v1/responses", []string{"Session-Id", "T0", "Thread-Id", "T0"}, responsesBody("T0", 1)}
			},
			func(i int) agentRequest {
				thread := fmt.Sprintf("T%d", i+1)
				return agentRequest{"/v1/responses", []string{"Session-Id", "T0", "Thread-Id", thread, "X-Openai-Subagent", "collab_spawn",
					"X-Codex-Parent-Thread-Id", "T0"}, responsesBody(thread, 0)}
			}},
		{"opencode",
			func() agentRequest {
				return agentRequest{"/v1/chat/completions", []string{"X-Session-Id", "ses_p", "X-Session-Affinity", "ses_p"}, chatBody("p", 1, nil)}
			},
			func(i int) agentRequest {
				id := fmt.Sprintf("ses_c%d", i)
				return agentRequest{"/v1/chat/completions", []string{"X-Session-Id", id, "X-Session-Affinity", id, "X-Parent-Session-Id", "ses_p"},
					chatBody(id, 0, nil)}
			}},
	}
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			backends := []*fakeVLLM{startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1), startFakeVLLM(t, "c", 1)}
			f, _ := runCaddy(t, caddySetup{modelBlock: "replicas {replicas}", proxyOptions: observedProxy}, addresses(backends)...)
			home := f.agentTurn(t, "parent", fam.parent())
			// The agent waits for its children, spawned one after the other.
			children := make([]served, 3)
			gate, open := newGate(t)
			var wg sync.WaitGroup
			for i := range children {
				wg.Go(func() {
					children[i] = f.agentTurn(t, fmt.Sprintf("child-%d", i), fam.child(i), gateHeader, gate)
				})
				testrun.Eventually(t, 10*time.Second, fmt.Sprintf("child %d in flight", i), func() bool { return inFlight(backends...) == int64(i+1) })
			}
			open()
			wg.Wait()
			used := map[string]bool{}
			joined := 0
			for i, c := range children {
				used[c.backend] = true
				if c.outcome == "joined" {
					joined++
					if c.backend != home.backend {
						t.Errorf("child %d joined on %s, parent on %s", i, c.backend, home.backend)
					}
				}
			}
			if len(used) != 3 || joined != 1 {
				t.Errorf("3 parallel children on %d replicas, %d beside the parent: %+v (parent %+v)", len(used), joined, children, home)
			}
			for i := range children {
				if got := f.agentTurn(t, fmt.Sprintf("child-%d", i), fam.child(i)); got.backend != children[i].backend || got.outcome != "sticky" {
					t.Errorf("child %d next turn: %+v, placed on %s", i, got, children[i].backend)
				}
			}
			if got := f.agentTurn(t, "parent", fam.parent()); got.backend != home.backend || got.outcome != "sticky" {
				t.Errorf("parent next turn: %+v, placed on %s", got, home.backend)
			}
			var joinedCount uint64
			for _, r := range f.status(t).Replicas {
				joinedCount += r.Joined
			}
			if joinedCount != 1 {
				t.Errorf("admin JSON: joined %d, want 1", joinedCount)
			}
		})
	}
}

// After a compaction (Claude Code's hint headers, Codex's turn metadata) the
// conversation is placed anew by load: away from a busy replica. Hints
// within compaction_interval of its last placement move it no more.
func TestCompactionPlacesAnew(t *testing.T) {
	type flow struct {
		name       string
		turn       func(n int) agentRequest
		summarise  []string // headers of the summarising request
		afterwards []string // headers of the first request after it
	}
	codexMeta := func(kind string) string {
		return `{"session_id":"T","thread_id":"T","turn_id":"u","window_id":"T:0","request_kind":"` + kind + `"}`
	}
	flows := []flow{
		{"claude-code", func(n int) agentRequest {
			return agentRequest{"/v1/messages", []string{"X-Claude-Code-Session-Id", "S"}, anthropicBody("S", n, nil)}
		}, []string{"X-Claude-Code-Compaction", "auto"}, []string{"X-Claude-Code-Context-Compacted", "1"}},
		{"codex", func(n int) agentRequest {
			return agentRequest{"/v1/responses", []string{"Session-Id", "T", "Thread-Id", "T"}, responsesBody("T", n)}
		}, []string{"X-Codex-Turn-Metadata", codexMeta("compaction")}, []string{"X-Codex-Turn-Metadata", codexMeta("turn")}},
	}
	for _, fl := range flows {
		t.Run(fl.name, func(t *testing.T) {
			backends := []*fakeVLLM{startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1)}
			// An interval of 1 ns: any later hint may move the conversation.
			f, _ := runCaddy(t, caddySetup{modelBlock: "replicas {replicas}", proxyOptions: observedProxy, fields: map[string]any{"compaction": true, "compaction_interval": "1ns"}}, addresses(backends)...)
			home := f.agentTurn(t, "conv", fl.turn(0))
			// Load home: a request of the conversation itself in flight.
			gate, open := newGate(t)
			done := make(chan struct{})
			go func() {
				defer close(done)
				f.agentTurn(t, "conv", fl.turn(0), gateHeader, gate)
			}()
			testrun.Eventually(t, 10*time.Second, "home busy", func() bool { return homeBusy(backends, home.backend) })
			if got := f.agentTurn(t, "conv", fl.turn(1), fl.summarise...); got.backend != home.backend || got.outcome != "sticky" {
				t.Errorf("summarising request: %+v, want sticky on %s (its prompt is cached there)", got, home.backend)
			}
			moved := f.agentTurn(t, "conv", fl.turn(0), fl.afterwards...)
			if moved.outcome != "compacted" || moved.backend == home.backend {
				t.Errorf("after compaction: %+v, want compacted away from the busy %s", moved, home.backend)
			}
			if got := f.agentTurn(t, "conv", fl.turn(1)); got.backend != moved.backend || got.outcome != "sticky" {
				t.Errorf("next turn: %+v, want sticky on %s", got, moved.backend)
			}
			open()
			<-done
			// A hint on every request within the interval moves nothing.
			if err := f.caddy.Do(http.MethodPost, "/config/apps/warden/models/m/compaction_interval", "1m", nil); err != nil {
				t.Fatal(err)
			}
			moves := 0
			for range 10 {
				if f.agentTurn(t, "conv", fl.turn(1), fl.summarise...).outcome == "compacted" {
					moves++
				}
				if f.agentTurn(t, "conv", fl.turn(1), fl.afterwards...).outcome == "compacted" {
					moves++
				}
			}
			st := f.status(t)
			var compacted uint64
			for _, r := range st.Replicas {
				compacted += r.Compacted
			}
			if moves != 0 || compacted != 1 {
				t.Errorf("hint on every request within compaction_interval: %d moves, admin JSON compacted %d; want none more than the first", moves, compacted)
			}
		})
	}
}

// homeBusy reports whether the fake behind backend has a request in flight.
func homeBusy(backends []*fakeVLLM, backend string) bool {
	for _, b := range backends {
		if b.name+"/0" == backend {
			return b.running[0].Load() > 0
		}
	}
	return false
}

// Hostile input against agent-aware keying.
func TestHostileAgentInput(t *testing.T) {
	backends := []*fakeVLLM{startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1), startFakeVLLM(t, "c", 1)}
	f, _ := runCaddy(t, caddySetup{modelBlock: "replicas {replicas}", proxyOptions: observedProxy, fields: map[string]any{"max_sessions": 64}}, addresses(backends)...)

	// IDs are bearer-like: a body (or header) that names another
	// conversation's ID is routed to that conversation's replica, and that is
	// all it gets. Routing is the only thing an ID decides: the request's
	// answer is computed from its own prompt, and the victim's pin stays.
	t.Run("a body claiming another conversation's ID", func(t *testing.T) {
		victim := f.agentTurn(t, "victim", agentClients[0].turn("victim-id", 1))
		forged := []byte(`{"session_id":"victim-id","model":"m","stream":true,"messages":[{"role":"user","content":"mine"}]}`)
		got := f.agentTurn(t, "forger", agentRequest{"/v1/chat/completions", nil, forged})
		if got.backend != victim.backend || got.source != "body" || got.outcome != "sticky" {
			t.Errorf("forged body: %+v, victim on %s", got, victim.backend)
		}
		if again := f.agentTurn(t, "victim", agentClients[0].turn("victim-id", 2)); again.backend != victim.backend || again.outcome != "sticky" {
			t.Errorf("victim after the forgery: %+v, want sticky on %s", again, victim.backend)
		}
	})

	// Caddy refuses headers past its own limit (431); what reaches warden is
	// read up to 8 KiB, by a scan that allocates nothing and decides only a
	// hint: the conversation stays where it is.
	t.Run("a huge or malformed X-Codex-Turn-Metadata", func(t *testing.T) {
		home := f.agentTurn(t, "codex", agentClients[1].turn("thread-h", 0))
		for _, meta := range []string{
			`{"request_kind":"compaction","x":"` + strings.Repeat("a", 200<<10) + `"}`,
			`{"x":"` + strings.Repeat("a", 9<<10) + `","request_kind":"compaction"}`, // past the 8 KiB read: ignored
			strings.Repeat(`"request_kind":`, 300),
			`{"request_kind":` + strings.Repeat("[", 3000),
			`{"request_kind":"compac`,
			`}{"request_kind" "compaction"`,
		} {
			req, _ := http.NewRequest(http.MethodPost, "http://"+f.site+"/v1/responses", bytes.NewReader(responsesBody("thread-h", 1)))
			for k, v := range map[string]string{"Session-Id": "thread-h", "Thread-Id": "thread-h", "X-Codex-Turn-Metadata": meta, conversationHeader: "codex"} {
				req.Header.Set(k, v)
			}
			resp, err := siteClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusRequestHeaderFieldsTooLarge && len(meta) > 8<<10:
			case resp.StatusCode != http.StatusOK:
				t.Errorf("metadata of %d bytes: %s", len(meta), resp.Status)
			case resp.Header.Get("X-Backend") != home.backend || resp.Header.Get("X-Warden-Outcome") != "sticky":
				t.Errorf("metadata of %d bytes: %s %s, want sticky on %s", len(meta), resp.Header.Get("X-Backend"), resp.Header.Get("X-Warden-Outcome"), home.backend)
			}
			if got := f.agentTurn(t, "codex", agentClients[1].turn("thread-h", 2)); got.backend != home.backend || got.outcome != "sticky" {
				t.Errorf("after metadata of %d bytes: %+v, want sticky on %s", len(meta), got, home.backend)
			}
		}
	})

	// Distinct header-less conversations, far more than max_sessions: the
	// table stays bounded, the oldest are evicted, every request is served.
	t.Run("a flood of fingerprints", func(t *testing.T) {
		const flood = 600
		var mu sync.Mutex
		next := 0
		testrun.Concurrently(6, func(int) {
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= flood {
					return
				}
				conv := fmt.Sprintf("flood-%d", i)
				if got := f.agentTurn(t, conv, agentRequest{"/v1/chat/completions", nil, chatBody(conv, i%3, nil)}); got.source != "fingerprint" {
					t.Errorf("%s: %+v", conv, got)
					return
				}
			}
		})
		st := f.status(t)
		if st.Sessions > 64 || st.SessionsEvicted < flood-64 {
			t.Errorf("%d sessions (max 64), %d evicted after %d conversations", st.Sessions, st.SessionsEvicted, flood)
		}
	})
}
