package agentload

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/server"
)

// runOnSim runs one session slot against the simulator until the first
// session is done and returns that session's results.
func runOnSim(t *testing.T, cfg Config) []Result {
	t.Helper()
	simCfg := server.DefaultConfig()
	simCfg.TimeScale = 100
	sim, err := server.New(simCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.Start(); err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	var mu sync.Mutex
	var results []Result
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runner := &Runner{Generator: mustGenerator(t, cfg), BaseURL: "http://" + sim.Addr(), Sessions: 1, Duration: 30 * time.Second, OnResult: func(r Result) {
		if r.SessionIndex != 0 {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		results = append(results, r)
		if r.SessionDone() {
			cancel()
		}
	}}
	if _, err := runner.Run(ctx); err != nil && err != context.Canceled {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(results) == 0 || !results[len(results)-1].SessionDone() {
		t.Fatalf("the session did not finish: %d results", len(results))
	}
	return results
}

// Against the simulator, every request of a conversation but its last gets
// a tool call, and the last (the session's last turn, a sub-agent's last, a
// summarising request) text that ends it.
func TestRepliesStopAsAnAgentsDo(t *testing.T) {
	stops := map[API][2]string{APIAnthropic: {"tool_use", "end_turn"}, APIOpenAI: {"tool_calls", "stop"}}
	for _, api := range []API{APIAnthropic, APIOpenAI} {
		t.Run(string(api), func(t *testing.T) {
			results := runOnSim(t, modesConfig(api))
			kinds := map[string]int{}
			for _, r := range results {
				if !r.OK() {
					t.Fatalf("request failed: %+v", r)
				}
				want := stops[api][0]
				if r.Final {
					want = stops[api][1]
				}
				if r.Stop != want {
					t.Errorf("%s request %d (%v, final %v): stop %q, want %q", r.Conversation(), r.Turn, r.Kind, r.Final, r.Stop, want)
				}
				kinds[fmt.Sprintf("%v/agent %v/final %v", r.Kind, r.Agent != "", r.Final)]++
			}
			// Every kind of request was seen.
			for _, k := range []string{"turn/agent false/final false", "turn/agent false/final true", "compacting/agent false/final true", "compacted/agent false/final false", "turn/agent true/final false", "turn/agent true/final true"} {
				if kinds[k] == 0 {
					t.Errorf("no request of kind %s: %v", k, kinds)
				}
			}
		})
	}
}

// A tool call's command is kept as the reply's text, so the next turn's
// prompt hits everything the simulator computed for it, as a text reply's
// would: the prompt and the reply but its last token (<|im_end|>), in whole
// blocks of 16.
func TestToolCallRepliesHitTheCache(t *testing.T) {
	for _, api := range []API{APIAnthropic, APIOpenAI} {
		cfg := modesConfig(api)
		cfg.Subagents, cfg.CompactionEvery = 0, 0
		results := runOnSim(t, cfg)
		for i := 1; i < len(results); i++ {
			prev, r := results[i-1], results[i]
			if want := (prev.PromptTokens + prev.OutputTokens - 1) / 16 * 16; r.CachedTokens != want {
				t.Errorf("%s turn %d: cached %d tokens, want %d (prompt %d + reply %d, stop %s)", api, r.Turn, r.CachedTokens, want, prev.PromptTokens, prev.OutputTokens, prev.Stop)
			}
		}
	}
}

// The body of every turn offers the tools and forces a call, but on the last
// request of a conversation, which forbids one.
func TestRequestsForceAToolCallButOnTheLast(t *testing.T) {
	for _, api := range []API{APIAnthropic, APIOpenAI} {
		cfg := modesConfig(api)
		s := mustGenerator(t, cfg).NewSession()
		for n := 0; ; n++ {
			turn, ok := s.Next()
			if !ok {
				break
			}
			req, err := newRequest(context.Background(), "http://127.0.0.1:9", cfg, s, turn)
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Tools []struct {
					Name        string          `json:"name"`
					InputSchema json.RawMessage `json:"input_schema"`
					Type        string          `json:"type"`
					Function    struct {
						Name       string          `json:"name"`
						Parameters json.RawMessage `json:"parameters"`
					} `json:"function"`
				} `json:"tools"`
				ToolChoice json.RawMessage `json:"tool_choice"`
			}
			decodeBody(t, req.Body, &body)
			choice, name, schema := string(body.ToolChoice), body.Tools[0].Name, body.Tools[0].InputSchema
			forced, none := `{"type":"any"}`, `{"type":"none"}`
			if api == APIOpenAI {
				name, schema = body.Tools[0].Function.Name, body.Tools[0].Function.Parameters
				forced, none = `"required"`, `"none"`
			}
			want := forced
			if turn.Final {
				want = none
			}
			if len(body.Tools) != 1 || name != "Bash" || string(schema) != string(bashSchema) || choice != want {
				t.Errorf("%s request %d (%v, last %v, final %v): tools %+v, tool_choice %s; want Bash and %s", api, n, turn.Kind, turn.Last, turn.Final, body.Tools, choice, want)
			}
			if turn.Last && choice != none {
				t.Errorf("%s: the session's last turn does not forbid a tool call", api)
			}
			s.Reply(fmt.Sprintf("reply %d", n))
		}
	}
}
