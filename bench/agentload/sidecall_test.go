package agentload

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// sessionRequests runs one session slot of cfg against a capture server
// until session 0 is over, and returns the requests of session 0 as the
// server received them, in the order they ended.
func sessionRequests(t *testing.T, cfg Config) []captured {
	t.Helper()
	srv := &captureServer{}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	gen := mustGenerator(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	// One slot starts session 1 once session 0 and its side calls are over.
	runner := &Runner{Generator: gen, BaseURL: ts.URL, Sessions: 1, Duration: 10 * time.Second, OnResult: func(r Result) {
		if r.SessionIndex > 0 {
			once.Do(cancel)
		} else if !r.OK() {
			t.Errorf("request failed: %+v", r)
		}
	}}
	if _, err := runner.Run(ctx); err != nil && err != context.Canceled {
		t.Fatal(err)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	first := mustGenerator(t, cfg).NewSession().ID // session 0's
	var out []captured
	for _, c := range srv.reqs {
		if c.header.Get(DefaultSessionHeader) == first {
			out = append(out, c)
		}
	}
	return out
}

// lastMessage is the last message of a request's body, as sent.
func lastMessage(t *testing.T, body []byte) []byte {
	var req struct {
		Messages []json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil || len(req.Messages) == 0 {
		t.Fatalf("body without messages: %v", err)
	}
	return req.Messages[len(req.Messages)-1]
}

// With a small model, a side call goes beside every SideCallEvery-th turn
// of the session, the first included, to the small model under the
// session's identity and the client's key, marked auxiliary; the main
// turns' texts are those of the same workload without side calls.
func TestSideCalls(t *testing.T) {
	for _, api := range []API{APIAnthropic, APIOpenAI} {
		t.Run(string(api), func(t *testing.T) {
			cfg := smallWorkload(api)
			cfg.Turns, cfg.TurnsSpread, cfg.APIKey = 5, 0, "sk-person"
			without := sessionRequests(t, cfg)
			cfg.SmallModel, cfg.SideCallEvery, cfg.SideCallTokens, cfg.SideCallOutputTokens = "small-1", 2, 30, 8
			with := sessionRequests(t, cfg)

			var main, side []captured
			for _, c := range with {
				var body struct {
					Model     string `json:"model"`
					MaxTokens int    `json:"max_tokens"`
				}
				if err := json.Unmarshal(c.body, &body); err != nil {
					t.Fatal(err)
				}
				switch body.Model {
				case cfg.Model:
					main = append(main, c)
				case cfg.SmallModel:
					side = append(side, c)
					if body.MaxTokens != cfg.SideCallOutputTokens || c.header.Get(RequestClassHeader) != "auxiliary" {
						t.Errorf("side call: max_tokens %d, request class %q", body.MaxTokens, c.header.Get(RequestClassHeader))
					}
				default:
					t.Errorf("request for model %q", body.Model)
				}
				key := c.header.Get("x-api-key")
				if api == APIOpenAI {
					key = strings.TrimPrefix(c.header.Get("Authorization"), "Bearer ")
				}
				if key != cfg.APIKey {
					t.Errorf("credential %q, want %q", key, cfg.APIKey)
				}
			}
			if len(main) != 5 || len(side) != 3 { // beside turns 0, 2 and 4
				t.Fatalf("%d main turns and %d side calls, want 5 and 3", len(main), len(side))
			}
			if len(without) != len(main) {
				t.Fatalf("%d turns without side calls, %d with", len(without), len(main))
			}
			for i := range main {
				if got, want := lastMessage(t, main[i].body), lastMessage(t, without[i].body); !slices.Equal(got, want) {
					t.Errorf("turn %d's new message differs with side calls", i)
				}
			}
			if string(side[0].body) == string(side[1].body) {
				t.Error("two side calls of a session with the same text")
			}
		})
	}
}
