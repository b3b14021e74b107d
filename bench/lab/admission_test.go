package lab

import (
	"testing"
	"time"
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
		hits[name] = out.row(name).PrefixHitPercent
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
