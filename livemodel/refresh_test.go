package livemodel

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/selection"
)

// The prompts kept for refreshes stay within their budget, a turn's
// replacing its conversation's last, and are forgotten once their
// conversation has not been refreshed for keptPromptFor.
func TestKeptPromptsStayWithinTheirBudget(t *testing.T) {
	m := New("m", time.Second, zap.NewNop())
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	m.KeepPrompt(1, Prompt{Body: make([]byte, maxKeptPromptBytes-10)}, t0)
	m.KeepPrompt(2, Prompt{Body: make([]byte, 20)}, t0)
	if n, b := len(m.refresh.prompts), m.refresh.bytes; n != 1 || b != maxKeptPromptBytes-10 {
		t.Fatalf("%d prompts of %d bytes, want the first alone", n, b)
	}
	m.KeepPrompt(1, Prompt{Body: make([]byte, 100)}, t0)
	m.KeepPrompt(2, Prompt{Body: make([]byte, 20)}, t0.Add(time.Minute))
	if n, b := len(m.refresh.prompts), m.refresh.bytes; n != 2 || b != 120 {
		t.Fatalf("%d prompts of %d bytes, want 2 of 120", n, b)
	}
	m.refreshKept(context.Background(), t0.Add(keptPromptFor+time.Second))
	if _, kept := m.refresh.prompts[2]; len(m.refresh.prompts) != 1 || !kept || m.refresh.bytes != 20 {
		t.Fatalf("%d prompts of %d bytes after keptPromptFor, want the second alone", len(m.refresh.prompts), m.refresh.bytes)
	}
}

// A refresh asks for one token and no stream, in each API's own field,
// leaves out what would make the engine do more (or refuse it), and keeps
// the rest of the request as it was; a body that is not a JSON object
// gives none.
func TestRefreshBodyAsksForOneToken(t *testing.T) {
	cases := []struct {
		path, body string
		want       map[string]string // every field, as JSON
	}{
		{"/v1/messages", `{"model":"m","max_tokens":4096,"stream":true,"system":"s","messages":[{"role":"user","content":"hi"}]}`,
			map[string]string{"model": `"m"`, "max_tokens": "1", "stream": "false", "system": `"s"`, "messages": `[{"role":"user","content":"hi"}]`}},
		{"/v1/chat/completions", `{"model":"m","max_completion_tokens":500,"stream":true,"stream_options":{"include_usage":true},"n":2,"min_tokens":5,"prompt_logprobs":1,"kv_transfer_params":{"do_remote_prefill":true},"messages":[]}`,
			map[string]string{"model": `"m"`, "max_tokens": "1", "max_completion_tokens": "1", "stream": "false", "messages": "[]"}},
		{"/v1/responses", `{"model":"m","input":"hi","stream":true,"store":true,"background":true}`,
			map[string]string{"model": `"m"`, "input": `"hi"`, "max_output_tokens": "1", "stream": "false", "store": "false"}},
	}
	for _, c := range cases {
		out, ok := refreshBody(c.path, []byte(c.body))
		var got map[string]json.RawMessage
		if !ok || json.Unmarshal(out, &got) != nil {
			t.Fatalf("%s: %s, %v", c.path, out, ok)
		}
		fields := map[string]string{}
		for k, v := range got {
			fields[k] = string(v)
		}
		if !maps.Equal(fields, c.want) {
			t.Errorf("%s: %s, want the fields %v", c.path, out, c.want)
		}
	}
	for _, body := range []string{``, `[1]`, `null`, `{"model":`} {
		if out, ok := refreshBody("/v1/messages", []byte(body)); ok {
			t.Errorf("%q made %s, want none", body, out)
		}
	}
}

// A refresh sends the prompt rewritten, with its headers, to its replica,
// and keeps it rewritten for the next; a turn that replaced the prompt
// meanwhile is kept as it came; a refusal forgets the prompt.
func TestRefreshSendsThePromptRewrittenAndForgetsARefusedOne(t *testing.T) {
	var mu sync.Mutex
	var got []string
	status := http.StatusOK
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		got = append(got, r.URL.RequestURI()+" "+r.Header.Get("X-Api-Key")+" "+string(body))
		w.WriteHeader(status)
	}))
	defer replica.Close()
	rep := selection.Replica{ID: "r0", Address: strings.TrimPrefix(replica.URL, "http://")}
	m := New("m", time.Second, zap.NewNop())
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	prompt := Prompt{Path: "/v1/messages?beta=true", Header: http.Header{"X-Api-Key": {"key-1"}},
		Body: []byte(`{"model":"m","max_tokens":512,"stream":true,"messages":[]}`)}
	refresh := func() *keptPrompt {
		kp := m.refresh.prompts[1]
		kp.running = true
		m.refreshOne(context.Background(), 1, rep, kp)
		return kp
	}
	m.KeepPrompt(1, prompt, t0)
	kp := refresh()
	want := `/v1/messages?beta=true key-1 {"max_tokens":1,"messages":[],"model":"m","stream":false}`
	if len(got) != 1 || got[0] != want || !kp.rewritten || kp.running || m.refresh.bytes != len(kp.Body) {
		t.Fatalf("sent %q (rewritten %v, running %v, %d bytes kept), want %q", got, kp.rewritten, kp.running, m.refresh.bytes, want)
	}
	refresh()
	if len(got) != 2 || got[1] != want {
		t.Fatalf("sent %q, want the same refresh twice", got)
	}
	// A turn replaces the prompt while a refresh of the old one runs.
	old := m.refresh.prompts[1]
	old.running = true
	m.KeepPrompt(1, prompt, t0)
	m.refreshOne(context.Background(), 1, rep, old)
	if cur := m.refresh.prompts[1]; cur == old || cur.running || cur.rewritten || m.refresh.bytes != len(prompt.Body) {
		t.Fatalf("the turn's prompt: running %v, rewritten %v, %d bytes kept; want it as it came", cur.running, cur.rewritten, m.refresh.bytes)
	}
	status = http.StatusUnauthorized
	refresh()
	if sent, failed := m.Refreshes(); len(m.refresh.prompts) != 0 || m.refresh.bytes != 0 || sent != 3 || failed != 1 {
		t.Fatalf("after a refusal: %d prompts, %d bytes kept, %d sent, %d failed; want none kept, 3 and 1", len(m.refresh.prompts), m.refresh.bytes, sent, failed)
	}
}
