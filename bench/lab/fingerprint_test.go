package lab

import (
	"os"
	"strconv"
	"testing"

	"github.com/lmwarden/caddy-warden/selection"
	"github.com/lmwarden/caddy-warden/sessionkey"
)

// fingerprintPolicy is the warden policy as it routes clients that send no
// ID: keyed by the fingerprint of each conversation's head. Its first turn's
// key is the head's; from its first reply on, the key is the head and that
// reply, and its parent the head (sessionkey.ReadBody). The workload's first
// messages are unique to each session, so the head names the session, as in
// the proxy; here the key is derived from the turn count instead of a body.
type fingerprintPolicy struct {
	*wardenPolicy
	seen map[string]bool
	// rekeyed is the control: one key per session, but not its ID's, to
	// see how much of a difference the keys' tie-breaks alone make.
	rekeyed bool
}

func newFingerprintPolicy(env *Env) (Policy, error) {
	p, err := newWardenPolicy(true)(env)
	if err != nil {
		return nil, err
	}
	return &fingerprintPolicy{wardenPolicy: p.(*wardenPolicy), seen: map[string]bool{}}, nil
}

func (p *fingerprintPolicy) Pick(a Arrival) (int, func()) {
	head := sessionkey.Hash("head/" + a.Key)
	req := selection.Request{Hash: head, Now: virtualTime(a.Now)}
	if p.seen[a.Key] {
		req = selection.Request{Hash: sessionkey.Combine(head, sessionkey.Hash("reply/"+a.Key)), Parent: head, Continues: true, Renamed: true, Now: virtualTime(a.Now)}
	}
	p.seen[a.Key] = true
	if p.rekeyed {
		req = selection.Request{Hash: head, Now: virtualTime(a.Now)}
	}
	d := p.view.Pick(req)
	rep, ok := d.Replica()
	if !ok {
		return -1, nil
	}
	return p.index[rep.ID], d.Release
}

// TestFingerprintHitRate compares, on the seed's workload, sessions keyed by
// their ID (warden), by their fingerprint as if they sent none, and
// affinity off. WARDEN_LAB_FINGERPRINT=1 runs it (a few minutes of CPU).
func TestFingerprintHitRate(t *testing.T) {
	if os.Getenv("WARDEN_LAB_FINGERPRINT") == "" {
		t.Skip("WARDEN_LAB_FINGERPRINT=1 runs the fingerprint comparison")
	}
	const fingerprint, rekeyed = "fingerprint", "rekeyed"
	policyFactories[fingerprint] = newFingerprintPolicy
	policyFactories[rekeyed] = func(env *Env) (Policy, error) {
		p, err := newFingerprintPolicy(env)
		if err == nil {
			p.(*fingerprintPolicy).rekeyed = true
		}
		return p, err
	}
	defer delete(policyFactories, fingerprint)
	defer delete(policyFactories, rekeyed)
	seeds := []int64{1}
	if n, err := strconv.Atoi(os.Getenv("WARDEN_LAB_SEEDS")); err == nil {
		seeds = seeds[:0]
		for i := range n {
			seeds = append(seeds, int64(i+1))
		}
	}
	plan := Plan{Policies: []string{PolicyWarden, rekeyed, fingerprint, PolicyOff}, Levels: []int{4, 8, 16}, Seeds: seeds}
	rows, err := Sweep(DefaultConfig(), plan, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	type cell struct {
		policy   string
		sessions int
	}
	hits, n := map[cell]float64{}, map[cell]int{}
	for _, r := range rows {
		t.Logf("seed %d %-12s sessions %2d: hits %5.1f%%  stayed %5.1f%%  tok/min %7.0f  TTFB p50 %5.2fs p95 %5.2fs",
			r.Seed, r.Policy, r.Sessions, r.PrefixHitPercent, r.StayedPercent, r.OutputTokensPerMin, r.TTFBP50S, r.TTFBP95S)
		c := cell{r.Policy, r.Sessions}
		hits[c] += r.PrefixHitPercent
		n[c]++
	}
	for _, l := range plan.Levels {
		keyed, fp := hits[cell{PolicyWarden, l}]/float64(n[cell{PolicyWarden, l}]), hits[cell{fingerprint, l}]/float64(n[cell{fingerprint, l}])
		t.Logf("%d sessions, mean over %d seeds: keyed %.1f%%, rekeyed %.1f%%, fingerprint %.1f%% (%.0f%% of keyed), off %.1f%%", l, len(seeds),
			keyed, hits[cell{rekeyed, l}]/float64(len(seeds)), fp, 100*fp/keyed, hits[cell{PolicyOff, l}]/float64(len(seeds)))
		// The control shows how much keys alone move the result (the
		// rendezvous tie-breaks): the fingerprint must not cost more than
		// that, nor fall below 97% of the keyed run beyond it.
		control := hits[cell{rekeyed, l}] / float64(len(seeds))
		if fp < control-1 || fp < 0.97*min(keyed, control) {
			t.Errorf("%d sessions: fingerprint hits %.1f%%, keyed %.1f%%, rekeyed control %.1f%%", l, fp, keyed, control)
		}
	}
}
