package selection

import (
	"testing"
)

func TestCheckRule(t *testing.T) {
	for _, name := range []string{"", RuleSeed, RuleCacheFit} {
		if err := CheckRule(name); err != nil {
			t.Errorf("CheckRule(%q): %v", name, err)
		}
	}
	if CheckRule("warden2") == nil {
		t.Error("an unknown rule was accepted")
	}
	if got := newTestRouter(1, Config{}).Rule(); got != RuleSeed {
		t.Errorf("default rule %q, want %q", got, RuleSeed)
	}
}

// evictionScenario pins conversation a (400 tokens) to the first replica of
// two with 1,000 tokens of KV each, ends its turn, then, unless inFlight,
// makes that replica allocate 700 tokens for conversation b: more than the
// room left beside a. It returns a's next decision, made when the first
// replica is busier than the second.
func evictionScenario(t *testing.T, rule string, inFlight bool) (first string, next Decision) {
	t.Helper()
	r := newTestRouter(2, Config{Rule: rule, BytesPerToken: 1})
	reps := r.Replicas()
	setLoad := func(running0, running1 float64) {
		for range 2 { // other clients' traffic counts once two scrapes show it
			r.SetLoad(reps[0].ID, Load{Running: running0, KVCapacityTokens: 1000, Known: true})
			r.SetLoad(reps[1].ID, Load{Running: running1, KVCapacityTokens: 1000, Known: true})
		}
	}
	setLoad(0, 5) // new conversations go to the first replica
	a := r.Pick(Request{Key: "a", PromptBytes: 400, Now: t0})
	if !inFlight {
		a.Release()
	}
	b := r.Pick(Request{Key: "b", PromptBytes: 700, Now: t0})
	if id(a) != id(b) {
		t.Fatalf("a on %s, b on %s: the scenario needs one replica", id(a), id(b))
	}
	b.Release()
	setLoad(5, 0)
	return id(a), r.Pick(Request{Key: "a", PromptBytes: 450, Now: t0})
}

func TestCacheFitMovesAConversationItsPinEvicted(t *testing.T) {
	first, d := evictionScenario(t, RuleCacheFit, false)
	if d.Outcome != Moved || id(d) == first {
		t.Fatalf("cachefit: a's next turn %v on %s, first on %s; want moved elsewhere", d.Outcome, id(d), first)
	}
	first, d = evictionScenario(t, RuleSeed, false)
	if d.Outcome != Sticky || id(d) != first {
		t.Fatalf("seed: a's next turn %v on %s, first on %s; want sticky", d.Outcome, id(d), first)
	}
	// A request in flight holds its blocks: nothing evicts them.
	first, d = evictionScenario(t, RuleCacheFit, true)
	if d.Outcome != Sticky || id(d) != first {
		t.Fatalf("cachefit with a's turn in flight: %v on %s, first on %s; want sticky", d.Outcome, id(d), first)
	}
}

func TestCacheFitKeepsAConversationThatFits(t *testing.T) {
	r := newTestRouter(2, Config{Rule: RuleCacheFit, BytesPerToken: 1})
	for _, rep := range r.Replicas() {
		r.SetLoad(rep.ID, Load{KVCapacityTokens: 10_000, Known: true})
	}
	var pin string
	for turn := range 5 {
		d := r.Pick(Request{Key: "a", PromptBytes: int64(1000 + 300*turn), Now: t0})
		if turn == 0 {
			pin = id(d)
		} else if d.Outcome != Sticky || id(d) != pin {
			t.Fatalf("turn %d: %v on %s, pinned to %s", turn, d.Outcome, id(d), pin)
		}
		d.Release()
	}
	for _, rs := range r.Status().Replicas {
		if s := r.fleet.Load().byID[rs.ID]; s.held.Load() != 0 || rs.Moved != 0 {
			t.Fatalf("%s: %d tokens held after every release, %d moved", rs.ID, s.held.Load(), rs.Moved)
		}
	}
}
