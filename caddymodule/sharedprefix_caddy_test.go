package caddymodule_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/testrun"
	"github.com/lmwarden/caddy-warden/panel"
)

// Conversations that start with one system prompt share it in the
// simulator's prefix cache, and load control learns so through Caddy from
// the cached part of a new conversation's first reply (warden_stop_reason):
// the admin JSON and the metric give the shared prefix, and the replica's
// residents count it once.
func TestSharedPrefixLearnedThroughCaddy(t *testing.T) {
	f := readingFleet(t)
	// 8,000 bytes of system prompt: 2,000 of the simulator's tokens. Every
	// reply calls a tool, so that no task ends and all stay resident.
	system := strings.Repeat("You are a careful agent. ", 320)
	body := func(task string) string {
		return `{"model":"m","max_tokens":8,"stream":true,"system":"` + system + `",` +
			`"tools":[{"name":"Bash","input_schema":{"type":"object","properties":{"command":{"type":"string"}}}}],` +
			`"tool_choice":{"type":"any"},"messages":[{"role":"user","content":"` + strings.Repeat(task+" ", 300) + `"}]}`
	}
	reply(t, f, "/v1/messages", "first", body("alpha"))
	if st := f.status(t); st.LoadControl.SharedPrefixTokens != nil {
		t.Fatalf("shared prefix %d after a first turn alone on its replica, want null", *st.LoadControl.SharedPrefixTokens)
	}
	for _, task := range []string{"bravo", "charlie", "delta", "echo"} { // load control waits for four
		reply(t, f, "/v1/messages", task, body(task))
	}

	// The requests' estimate stands for it until four replies told it.
	var shared int
	testrun.Eventually(t, 10*time.Second, "load_control.shared_prefix_tokens read from the replies", func() bool {
		lc := f.status(t).LoadControl
		if lc.SharedPrefixTokens != nil {
			shared = *lc.SharedPrefixTokens
		}
		return lc.SharedPrefixSource == "replies"
	})
	// The cache holds whole blocks of 16 tokens: the system prompt's, less
	// the block its end shares with the user's message.
	if shared < 2000-32 || shared > 2000+32 {
		t.Errorf("shared prefix %d tokens, want about 2,000 (the system prompt)", shared)
	}
	st := repliesRead(t, f, 5)
	prompts := int(st.LoadControl.Replies.NonResident.PromptTokens)
	if r := st.Replicas[0]; r.Residents != 5 || r.ResidentTokens != prompts-4*shared {
		t.Errorf("%d residents holding %d tokens, want 5 holding %d (their prompts %d, the shared prefix once)",
			r.Residents, r.ResidentTokens, prompts-4*shared, prompts)
	}
	families := scrapeMetrics(t, f)
	checkMetricsDocumented(t, families, func(name string) bool { return name == sharedPrefixSeries })
	if m := families[sharedPrefixSeries].GetMetric(); len(m) != 1 || int(m[0].GetGauge().GetValue()) != shared {
		t.Errorf("%s %v, want one sample of %d", sharedPrefixSeries, m, shared)
	}
}

// Without --enable-prompt-tokens-details (vLLM's default) the replies say
// nothing of what was cached, and load control reads the shared prefix
// from the requests through Caddy: the system prompt and tools new
// conversations' bodies share, wherever they stand in the body (Claude Code
// sends them after the messages), which reach the simulator intact.
func TestSharedPrefixReadFromRequestsThroughCaddy(t *testing.T) {
	f := readingFleet(t, "--enable-prompt-tokens-details=false")
	// 8,000 bytes of system prompt: 2,000 of the simulator's tokens.
	system := strings.Repeat("You are a careful agent. ", 320)
	body := func(task string) string {
		return `{"model":"m","max_tokens":8,"stream":true,` +
			`"messages":[{"role":"user","content":"` + strings.Repeat(task+" ", 300) + `"}],` +
			`"system":[{"type":"text","text":"` + system + `"}],` +
			`"tools":[{"name":"Bash","input_schema":{"type":"object","properties":{"command":{"type":"string"}}}}],` +
			`"tool_choice":{"type":"any"},"metadata":{"user_id":"u"}}`
	}
	for _, task := range []string{"alpha", "bravo", "charlie", "delta"} { // the first is compared with none
		reply(t, f, "/v1/messages", task, body(task))
	}
	if st := f.status(t); st.LoadControl.SharedPrefixTokens != nil || st.LoadControl.SharedPrefixSource != "unknown" {
		t.Fatalf("shared prefix %v from %q after 3 conversations compared, want null from \"unknown\"",
			*st.LoadControl.SharedPrefixTokens, st.LoadControl.SharedPrefixSource)
	}
	reply(t, f, "/v1/messages", "echo", body("echo"))
	st := repliesRead(t, f, 5)
	if st.LoadControl.Replies.CacheReported != 0 {
		t.Fatalf("%d replies reported their cached part, want none", st.LoadControl.Replies.CacheReported)
	}
	shared := st.LoadControl.SharedPrefixTokens
	if shared == nil || st.LoadControl.SharedPrefixSource != "requests" {
		t.Fatalf("shared prefix %v from %q, want it read from the requests", shared, st.LoadControl.SharedPrefixSource)
	}
	// The system prompt and the tool, at the bytes per token learned from
	// the replies' prompt sizes.
	if *shared < 1900 || *shared > 2200 {
		t.Errorf("shared prefix %d tokens, want about 2,000 (the system prompt and a tool)", *shared)
	}
	prompts := int(st.LoadControl.Replies.NonResident.PromptTokens)
	if r := st.Replicas[0]; r.Residents != 5 || r.ResidentTokens < prompts-4**shared-5 || r.ResidentTokens > prompts-4**shared+5 {
		t.Errorf("%d residents holding %d tokens, want 5 holding about %d (their prompts %d, the shared prefix once)",
			r.Residents, r.ResidentTokens, prompts-4**shared, prompts)
	}
}

// repliesRead waits until warden_stop_reason has read n replies and returns
// the status then: a reply's end reaches load control after its client read
// it, when Caddy's handler returns.
func repliesRead(t *testing.T, f *fleet, n uint64) panel.ModelStatus {
	t.Helper()
	var st panel.ModelStatus
	testrun.Eventually(t, 10*time.Second, fmt.Sprintf("%d replies read", n), func() bool {
		st = f.status(t)
		return st.LoadControl.Replies.Read >= n
	})
	return st
}
