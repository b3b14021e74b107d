package lab

import (
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// TestLoadControlHoldsTurnsDeepInOverload runs the throughput mode where the
// conversations outgrow the caches: turns wait at the proxy, which buys
// prefix hits, and the run's end leaves no turn queued.
func TestLoadControlHoldsTurnsDeepInOverload(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Duration = time.Minute
	hits := map[string]float64{}
	for _, name := range []string{PolicyWarden, PolicyAdmission} {
		policy, out := runFresh(t, cfg, name, 32, 3)
		hits[name] = out.row(name, 0).PrefixHitPercent
		if p, ok := policy.(*admissionPolicy); ok {
			st := p.view.Status().Admission
			if st.Queued == 0 || st.Waiting != 0 || len(p.waiting) != 0 {
				t.Errorf("load control: %+v, %d turns still watched after the run", st, len(p.waiting))
			}
		}
	}
	if hits[PolicyAdmission] < hits[PolicyWarden]+20 {
		t.Errorf("prefix hits %.1f%% with load control, %.1f%% without: want at least 20 points more", hits[PolicyAdmission], hits[PolicyWarden])
	}
}

// Load control learns the shared prefix from the replies' cached part,
// and, when the engines leave it out (vLLM without
// --enable-prompt-tokens-details), from the system prompt the requests
// share: the seed's 3,500 tokens either way, within 1% (the block the
// prefix ends in; the bytes per token learned from whole bodies, JSON
// around the texts included).
func TestLoadControlLearnsTheSharedPrefix(t *testing.T) {
	for _, hide := range []bool{false, true} {
		cfg := DefaultConfig()
		cfg.Duration, cfg.Warmup, cfg.HideCachedTokens = 30*time.Second, 0, hide
		policy, _ := runFresh(t, cfg, PolicyAdmission, 16, 1)
		st := policy.(*admissionPolicy).view.Status().Admission
		want := map[bool]loadcontrol.SharedPrefixSource{false: loadcontrol.SharedFromReplies, true: loadcontrol.SharedFromRequests}[hide]
		system := cfg.Workload.SystemPromptTokens
		if st.SharedPrefixSource != want || st.SharedPrefix < system*99/100 || st.SharedPrefix > system*101/100 {
			t.Errorf("cached part hidden %v: shared prefix %d tokens from %v, want about %d from %v",
				hide, st.SharedPrefix, st.SharedPrefixSource, system, want)
		}
	}
}
