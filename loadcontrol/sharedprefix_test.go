package loadcontrol

import (
	"testing"
	"time"
)

// What a replica holds counts the shared prefix once, but never less than
// a mean prompt or the new one.
func TestDistinctCountsTheSharedPrefixOnce(t *testing.T) {
	f := newFakeRouting(1)
	f.shared = 50
	v := f.view(Config{Enabled: true})
	if got := v.distinct(residency{count: 3, tokens: 300}, 0); got != 200 {
		t.Errorf("3 residents of 100 tokens with 50 shared hold %d, want 200", got)
	}
	if got := v.distinct(residency{count: 3, tokens: 30}, 0); got != 10 {
		t.Errorf("3 residents of 10 tokens with 50 shared hold %d, want a mean prompt, 10", got)
	}
	if got := v.distinct(residency{count: 3, tokens: 30}, 100); got != 100 {
		t.Errorf("3 residents of 10 tokens with 50 shared and a prompt of 100 hold %d, want the prompt, 100", got)
	}
}

// However many conversations expire, the expiries remembered to tell late
// returns stay bounded.
func TestExpiriesRememberedStayBounded(t *testing.T) {
	v := newFakeRouting(1).view(Config{Enabled: true, CapacityTokens: 1 << 30, Linger: time.Second})
	for i := range expiriesKept + 100 {
		v.Admit(Turn{Key: uint64(i + 1), Now: t0}, Body{Bytes: fakeBytesPerToken}, nil).Done(t0)
	}
	v.Sweep(t0.Add(2 * time.Second))
	if n := len(v.gate.expired); n != expiriesKept {
		t.Errorf("%d expiries remembered, want %d", n, expiriesKept)
	}
}
