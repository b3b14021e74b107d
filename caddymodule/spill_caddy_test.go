package caddymodule_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/testrun"
)

// The auto spill threshold reads what Caddy routes: requests whose bodies
// say their prompts are a third of a replica's KV cache (the fake's 40,000
// tokens) bring it from a quarter of max_num_seqs (8) down to 3, and a
// pinned conversation's fifth concurrent request spills.
func TestAutoSpillThresholdFollowsRequestSizes(t *testing.T) {
	backends := []*fakeVLLM{startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1)}
	f := startFleet(t, "replicas {replicas}\n\t\t\tmax_num_seqs 32", backends...)
	if st := f.status(t); st.SpillThreshold != 8 || !st.SpillThresholdAuto || st.TypicalPromptTokens != 0 {
		t.Fatalf("before any request: threshold %d auto=%v, typical prompt %d; want 8 auto, 0",
			st.SpillThreshold, st.SpillThresholdAuto, st.TypicalPromptTokens)
	}
	// 50,000 bytes: 12,500 tokens estimated.
	body := []byte(fmt.Sprintf(`{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":%q}]}`,
		strings.Repeat("x", 50000-84)))
	if len(body) != 50000 {
		t.Fatalf("body is %d bytes", len(body))
	}
	var home string
	for range 3 {
		status, backend := f.post(t, body, "X-Claude-Code-Session-Id", "big")
		if status != http.StatusOK {
			t.Fatalf("status %d", status)
		}
		if home == "" {
			home = backend
		} else if backend != home {
			t.Fatalf("served by %s, pinned to %s", backend, home)
		}
	}
	st := f.status(t)
	if st.TypicalPromptTokens != 12500 || st.SpillThreshold != 3 || !st.SpillThresholdAuto {
		t.Fatalf("after 12,500-token prompts: typical prompt %d, threshold %d auto=%v; want 12500, 3 auto",
			st.TypicalPromptTokens, st.SpillThreshold, st.SpillThresholdAuto)
	}
	if got := scrapeMetrics(t, f)["caddy_warden_typical_prompt_tokens"]; got == nil || got.GetMetric()[0].GetGauge().GetValue() != 12500 {
		t.Errorf("caddy_warden_typical_prompt_tokens: %v", got)
	}

	// Five requests of the conversation at once, each held 1 s by the
	// replica: the first four stay (in flight 0..3 is not above 3), the
	// fifth finds 4 in flight and spills.
	served := make([]string, 5)
	var wg sync.WaitGroup
	for i := range served {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, served[i] = f.post(t, body, "X-Claude-Code-Session-Id", "big", holdHeader, "1s")
		}()
		testrun.Eventually(t, 5*time.Second, "the request in flight", func() bool { return f.status(t).InFlight == int64(i+1) })
	}
	wg.Wait()
	away := 0
	for _, b := range served {
		if b != home {
			away++
		}
	}
	if away != 1 {
		t.Errorf("served by %v, pinned to %s: %d away, want the fifth alone", served, home, away)
	}
}
