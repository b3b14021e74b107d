package lab

import (
	"math"
	"slices"
	"testing"
	"time"
)

// TestLoadControlEstimatesAgainstGroundTruth checks what load control
// believes of each turn against what the engines did: the prompt's size,
// estimated from the request's bytes, against its real token count, and
// "its conversation is resident" against the share of the prompt the engine
// found cached. The figures are logged for docs/research/policy.md (go test -v).
func TestLoadControlEstimatesAgainstGroundTruth(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Duration = 2 * time.Minute
	for _, sessions := range []int{16, 32} {
		env, policy := freshPolicy(t, cfg, PolicyAdmission, 1)
		p := policy.(*admissionPolicy)
		p.seen = []belief{}
		out, err := simulate(env, p, sessions, 1)
		if err != nil {
			t.Fatal(err)
		}
		type turn struct {
			key string
			at  time.Duration
		}
		beliefs := make(map[turn]belief, len(p.seen))
		for _, b := range p.seen {
			beliefs[turn{b.key, b.at}] = b
		}
		var sizeErrors []float64
		var residentCached, coldCached []float64
		for _, r := range out.sim.results {
			b, ok := beliefs[turn{r.SessionID, r.Start.Sub(epoch)}]
			if !ok || r.Status != 200 || r.PromptTokens == 0 || r.CachedTokens < 0 {
				continue
			}
			sizeErrors = append(sizeErrors, math.Abs(float64(b.tokens-r.PromptTokens))/float64(r.PromptTokens))
			cached := float64(r.CachedTokens) / float64(r.PromptTokens)
			if b.resident {
				residentCached = append(residentCached, cached)
			} else {
				coldCached = append(coldCached, cached)
			}
		}
		if len(sizeErrors) < 50 || len(residentCached) == 0 || len(coldCached) == 0 {
			t.Fatalf("%d sessions: %d turns matched, %d resident, %d not", sessions, len(sizeErrors), len(residentCached), len(coldCached))
		}
		slices.Sort(sizeErrors)
		sizeP95 := sizeErrors[len(sizeErrors)*95/100]
		resMean, coldMean := mean(residentCached), mean(coldCached)
		missed := share(residentCached, func(c float64) bool { return c < 0.5 })
		t.Logf("%d sessions, %d turns: size estimate error mean %.1f%%, p95 %.1f%%; resident turns %d, %.1f%% of their prompt cached (%.1f%% of them below half); other turns %d, %.1f%% cached",
			sessions, len(sizeErrors), 100*mean(sizeErrors), 100*sizeP95, len(residentCached), 100*resMean, 100*missed, len(coldCached), 100*coldMean)
		if sizeP95 > 0.25 {
			t.Errorf("%d sessions: the size estimate is off by more than 25%% for 5%% of turns (p95 %.1f%%)", sessions, 100*sizeP95)
		}
		if resMean < 0.8 || resMean < coldMean+0.2 {
			t.Errorf("%d sessions: resident turns found %.1f%% cached, others %.1f%%: residency does not tell cached prefixes apart", sessions, 100*resMean, 100*coldMean)
		}
	}
}

func mean(xs []float64) float64 {
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

func share(xs []float64, pred func(float64) bool) float64 {
	n := 0
	for _, x := range xs {
		if pred(x) {
			n++
		}
	}
	return float64(n) / float64(len(xs))
}
