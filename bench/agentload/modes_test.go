package agentload

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// captured is one request as a server received it.
type captured struct {
	path   string
	header http.Header
	body   []byte
	start  time.Time
	end    time.Time
}

// captureServer answers every request with a short streamed reply in the
// request's protocol and keeps what it received.
type captureServer struct {
	mu   sync.Mutex
	reqs []captured
	n    int
}

func (c *captureServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	got := captured{path: r.URL.Path, header: r.Header.Clone(), body: body, start: time.Now()}
	c.mu.Lock()
	c.n++
	reply := fmt.Sprintf("reply number %d. ", c.n)
	c.mu.Unlock()
	time.Sleep(2 * time.Millisecond) // parallel sub-agents overlap
	w.Header().Set("Content-Type", "text/event-stream")
	if strings.HasPrefix(r.URL.Path, "/v1/messages") {
		fmt.Fprintf(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"cache_read_input_tokens\":0}}}\n\n")
		fmt.Fprintf(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":%q}}\n\n", reply)
		fmt.Fprintf(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":4}}\n\n")
		fmt.Fprintf(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	} else {
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":%q}}]}\n\n", reply)
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":4}}\n\n")
		fmt.Fprintf(w, "data: [DONE]\n\n")
	}
	got.end = time.Now()
	c.mu.Lock()
	c.reqs = append(c.reqs, got)
	c.mu.Unlock()
}

// modesConfig is a small, fast workload with every mode on.
func modesConfig(api API) Config {
	cfg := DefaultConfig()
	cfg.API = api
	cfg.SystemPromptTokens, cfg.FirstMessageTokens, cfg.TurnTokens, cfg.MaxOutputTokens = 40, 30, 10, 8
	cfg.SubagentTokens, cfg.CompactionSummaryTokens = 20, 16
	cfg.Turns, cfg.ThinkTime = 4, 0
	cfg.Subagents, cfg.SubagentTurns, cfg.SubagentEvery = 3, 2, 2
	cfg.CompactionEvery = 2
	return cfg
}

// playRunner runs one session slot against a capture server until at least
// one session is complete, and returns the requests and results.
func playRunner(t *testing.T, cfg Config) ([]captured, []Result, *Generator) {
	t.Helper()
	srv := &captureServer{}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	gen := mustGenerator(t, cfg)
	var mu sync.Mutex
	var results []Result
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runner := &Runner{Generator: gen, BaseURL: ts.URL, Sessions: 1, Duration: 10 * time.Second, OnResult: func(r Result) {
		mu.Lock()
		defer mu.Unlock()
		results = append(results, r)
		if r.SessionDone() && r.SessionIndex == 0 {
			close(done)
		}
	}}
	go func() { <-done; cancel() }()
	if _, err := runner.Run(ctx); err != nil && err != context.Canceled {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	srv.mu.Lock()
	defer srv.mu.Unlock()
	var first []Result
	for _, r := range results {
		if r.SessionIndex == 0 {
			if !r.OK() {
				t.Fatalf("request failed: %+v", r)
			}
			first = append(first, r)
		}
	}
	var reqs []captured
	for _, c := range srv.reqs {
		if strings.Contains(string(c.body), gen.SystemPrompt()) && len(reqs) < len(first) {
			reqs = append(reqs, c)
		}
	}
	return reqs, first, gen
}

// A header-less run sends no ID anywhere: no session, agent or hint
// header, no metadata, in either protocol, sub-agents and compactions
// included.
func TestNoSessionIDSendsNoID(t *testing.T) {
	for _, api := range []API{APIAnthropic, APIOpenAI} {
		t.Run(string(api), func(t *testing.T) {
			cfg := modesConfig(api)
			cfg.NoSessionID = true
			reqs, results, gen := playRunner(t, cfg)
			// 4 turns, a summarising request, one spawn of 3 sub-agents × 2 turns.
			if len(results) != 4+1+6 {
				t.Fatalf("%d requests for session 0, want 11", len(results))
			}
			s := gen.NewSession() // a later session: its identity shape
			ids := map[string]bool{s.UserID: true}
			for _, r := range results {
				ids[r.SessionID] = true
				if r.Agent != "" {
					ids[r.Agent] = true
				}
			}
			for _, c := range reqs {
				for name, values := range c.header {
					if strings.HasPrefix(strings.ToLower(name), "x-claude-code") {
						t.Errorf("header %s sent", name)
					}
					for _, v := range values {
						for id := range ids {
							if strings.Contains(v, id) {
								t.Errorf("header %s carries an ID: %s", name, v)
							}
						}
					}
				}
				for id := range ids {
					if strings.Contains(string(c.body), id) {
						t.Errorf("body carries ID %s", id)
					}
				}
				var fields map[string]json.RawMessage
				if err := json.Unmarshal(c.body, &fields); err != nil {
					t.Fatal(err)
				}
				for _, f := range []string{"metadata", "user", "session_id", "prompt_cache_key"} {
					if _, ok := fields[f]; ok {
						t.Errorf("body has the identity field %q", f)
					}
				}
			}
		})
	}
}

// Sub-agents: the session header and metadata of their session, an agent ID
// of their own, no parent-agent header (spawned by the main agent), the
// run's system prompt and a first message of their own; the parent waits
// for all of them.
func TestSubagentRequests(t *testing.T) {
	cfg := modesConfig(APIAnthropic)
	cfg.CompactionEvery = 0
	reqs, results, gen := playRunner(t, cfg)
	if len(results) != 4+6 {
		t.Fatalf("%d requests, want 10 (4 turns, 3 sub-agents × 2)", len(results))
	}
	session := results[0].SessionID
	type body struct {
		System   []struct{ Text string }
		Messages []struct {
			Role    string
			Content []struct{ Text string }
		}
		Metadata *struct {
			UserID string `json:"user_id"`
		}
	}
	agents := map[string][]body{}
	var mainFirst string
	var spawnedAt, lastChildEnd, resumedAt time.Time
	for _, c := range reqs {
		var b body
		if err := json.Unmarshal(c.body, &b); err != nil {
			t.Fatal(err)
		}
		if got := c.header.Get(DefaultSessionHeader); got != session {
			t.Errorf("session header %q, want %q", got, session)
		}
		if b.Metadata == nil || !strings.Contains(b.Metadata.UserID, session) {
			t.Errorf("metadata %+v lacks the session", b.Metadata)
		}
		if b.System[0].Text != gen.SystemPrompt() {
			t.Error("a request does not share the run's system prompt")
		}
		if c.header.Get("X-Claude-Code-Parent-Agent-Id") != "" {
			t.Error("a top-level sub-agent names a parent agent")
		}
		agent := c.header.Get(AgentHeader)
		agents[agent] = append(agents[agent], b)
		switch {
		case agent == "" && len(b.Messages) == 1:
			mainFirst = b.Messages[0].Content[0].Text
		case agent == "" && len(b.Messages) == 3:
			spawnedAt = c.end // the reply to turn 2 spawns them
		case agent == "" && len(b.Messages) == 5:
			resumedAt = c.start
		case agent != "" && c.end.After(lastChildEnd):
			lastChildEnd = c.end
		}
	}
	if len(agents) != 4 || len(agents[""]) != 4 {
		t.Fatalf("requests per agent: %d agents, %d main requests", len(agents), len(agents[""]))
	}
	firsts := map[string]bool{mainFirst: true}
	for id, bs := range agents {
		if id == "" {
			continue
		}
		if len(bs) != 2 || len(bs[0].Messages) != 1 || len(bs[1].Messages) != 3 {
			t.Errorf("agent %s: %d requests", id, len(bs))
			continue
		}
		first := bs[0].Messages[0].Content[0].Text
		if tokens := len(first) / BytesPerToken; firsts[first] || tokens < 18 || tokens > 22 {
			t.Errorf("agent %s: first message not its own (%d bytes)", id, len(first))
		}
		firsts[first] = true
		if bs[1].Messages[0].Content[0].Text != first {
			t.Errorf("agent %s does not resend its history", id)
		}
	}
	if spawnedAt.IsZero() || lastChildEnd.Before(spawnedAt) || resumedAt.Before(lastChildEnd) {
		t.Errorf("spawned after %v, last child ended %v, parent resumed %v", spawnedAt, lastChildEnd, resumedAt)
	}
	conversations := map[string]bool{}
	for _, r := range results {
		conversations[r.Conversation()] = true
		if r.Agent != "" && (r.LastTurn || r.SessionDone()) {
			t.Errorf("a sub-agent's turn ends the session: %+v", r)
		}
	}
	if len(conversations) != 4 {
		t.Errorf("%d conversations, want 4: %v", len(conversations), conversations)
	}
}

// Compaction: a summarising request (the history plus the instruction, the
// compaction hint), then a new prefix holding the summary (the compacted
// hint on its first request), and the Turn bookkeeping of each.
func TestCompactionShapes(t *testing.T) {
	cfg := modesConfig(APIAnthropic)
	cfg.Subagents, cfg.Turns = 0, 5
	g := mustGenerator(t, cfg)
	s := g.NewSession()
	type step struct {
		kind    TurnKind
		index   int
		segment int
		final   bool
	}
	want := []step{
		{TurnNormal, 0, 0, false}, {TurnNormal, 1, 0, false}, {TurnCompacting, 2, 0, true},
		{TurnCompacted, 0, 1, false}, {TurnNormal, 1, 1, false}, {TurnCompacting, 2, 1, true},
		{TurnCompacted, 0, 2, true},
	}
	var got []step
	var prev Turn
	for n := 0; ; n++ {
		turn, ok := s.Next()
		if !ok {
			break
		}
		got = append(got, step{turn.Kind, turn.Index, turn.Segment, turn.Final})
		last := turn.Messages[len(turn.Messages)-1].Content
		switch turn.Kind {
		case TurnCompacting:
			if len(turn.Messages) != len(prev.Messages)+2 || last != g.CompactionPrompt() || turn.MaxTokens != cfg.CompactionSummaryTokens {
				t.Errorf("request %d: summarising request of %d messages ending %.40q, max %d", n, len(turn.Messages), last, turn.MaxTokens)
			}
		case TurnCompacted:
			if len(turn.Messages) != 1 || !strings.HasPrefix(last, CompactedPreamble+fmt.Sprintf("summary %d", n-1)) {
				t.Errorf("request %d: compacted prefix %d messages, %.60q", n, len(turn.Messages), last)
			}
		}
		for _, hints := range []bool{true, false} {
			c := cfg
			c.CompactionHints = hints
			req, err := newRequest(context.Background(), "http://127.0.0.1:9", c, s, turn)
			if err != nil {
				t.Fatal(err)
			}
			compaction, compacted := req.Header.Get(CompactionHeader) != "", req.Header.Get(CompactedHeader) != ""
			if want := hints && turn.Kind == TurnCompacting; compaction != want {
				t.Errorf("request %d (%v), hints %v: compaction header %v", n, turn.Kind, hints, compaction)
			}
			if want := hints && turn.Kind == TurnCompacted; compacted != want {
				t.Errorf("request %d (%v), hints %v: compacted header %v", n, turn.Kind, hints, compacted)
			}
			if req.Header.Get(DefaultSessionHeader) != s.ID {
				t.Errorf("request %d: no session header", n)
			}
		}
		prev = turn
		s.Reply(fmt.Sprintf("summary %d", n))
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("requests:\n got %v\nwant %v", got, want)
	}
	if !s.Done() {
		t.Error("session not done")
	}
}

// The modes change nothing without their flags, and with them a seed still
// gives the same sub-agents.
func TestModesAreSeeded(t *testing.T) {
	cfg := modesConfig(APIAnthropic)
	spawn := func() []*Session {
		s := mustGenerator(t, cfg).NewSession()
		for {
			turn, _ := s.Next()
			s.Reply("ok")
			if turn.Spawns > 0 {
				return s.Spawn()
			}
		}
	}
	a, b := spawn(), spawn()
	if len(a) != cfg.Subagents {
		t.Fatalf("%d sub-agents, want %d", len(a), cfg.Subagents)
	}
	ids := map[string]bool{}
	for i := range a {
		ta, _ := a[i].Next()
		tb, _ := b[i].Next()
		if a[i].AgentID != b[i].AgentID || !reflect.DeepEqual(ta, tb) {
			t.Errorf("sub-agent %d differs between two runs of one seed", i)
		}
		if !uuidV4.MatchString(a[i].AgentID) || ids[a[i].AgentID] || a[i].ID != a[0].ID {
			t.Errorf("sub-agent %d: agent %q session %q", i, a[i].AgentID, a[i].ID)
		}
		ids[a[i].AgentID] = true
		if ta.Think != 0 || ta.Last || ta.Spawns != 0 {
			t.Errorf("sub-agent %d first turn: %+v", i, ta)
		}
	}
}

func TestModesValidate(t *testing.T) {
	for _, mutate := range []func(*Config){
		func(c *Config) { c.Subagents = -1 },
		func(c *Config) { c.Subagents, c.SubagentTurns = 2, 0 },
		func(c *Config) { c.Subagents, c.SubagentEvery = 2, 0 },
		func(c *Config) { c.CompactionEvery = -1 },
		func(c *Config) { c.CompactionEvery, c.CompactionSummaryTokens = 3, 0 },
	} {
		cfg := DefaultConfig()
		mutate(&cfg)
		if cfg.Validate() == nil {
			t.Errorf("accepted %+v", cfg)
		}
	}
}

func TestConversationName(t *testing.T) {
	for _, c := range []struct {
		r    Result
		want string
	}{
		{Result{SessionID: "s"}, "s"},
		{Result{SessionID: "s", Agent: "a"}, "s/a"},
		{Result{SessionID: "s", Segment: 2}, "s#2"},
		{Result{SessionID: "s", Agent: "a", Segment: 1}, "s/a#1"},
	} {
		if got := c.r.Conversation(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.r, got, c.want)
		}
	}
}
