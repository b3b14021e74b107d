package selection

import (
	"testing"
	"time"
)

// touchReplica is one replica with room for 1000 tokens, a, b and c
// resident there (300 tokens each), a and b idle since seconds 1 and 2,
// and c's task ended at second 3; sec is a clock in seconds.
func touchReplica(t *testing.T, touch bool) (testRouter, func(s int) time.Time) {
	t.Helper()
	r := newTestRouter(1, Config{Admission: AdmissionConfig{
		Enabled: true, CapacityTokens: 1000, Fill: 1, Linger: time.Minute, Quantum: -1, Touch: touch,
	}})
	sec := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	var tickets []*Ticket
	for _, key := range []string{"a", "b", "c"} {
		tk := r.Admit(HashKey(key), Body{Bytes: 300 * BytesPerToken}, nil, sec(0), nil)
		mustState(t, tk, Admitted)
		tickets = append(tickets, tk)
	}
	tickets[0].Done(sec(1))
	tickets[1].Done(sec(2))
	tickets[2].End(sec(3), Reply{TaskEnded: true})
	return r, sec
}

// A newcomer that would overflow the cache with the departed's blocks
// waits until every resident idle since before the departure has begun a
// turn again: the engine's LRU would evict theirs first.
func TestTouchHoldsANewcomerUntilTheIdleResidentsReturn(t *testing.T) {
	r, sec := touchReplica(t, true)
	d := r.Admit(HashKey("d"), Body{Bytes: 300 * BytesPerToken}, nil, sec(3), nil)
	mustState(t, d, Waiting) // 600 resident + 300 departed + 300 > 1000
	mustState(t, r.Admit(HashKey("a"), Body{Bytes: 300 * BytesPerToken}, nil, sec(4), nil), Admitted)
	r.Sweep(sec(4))
	mustState(t, d, Waiting) // b is still idle since before c left
	mustState(t, r.Admit(HashKey("b"), Body{Bytes: 300 * BytesPerToken}, nil, sec(5), nil), Admitted)
	r.Sweep(sec(5))
	mustState(t, d, Admitted)
}

// A newcomer that fits with the departed's blocks is admitted at once, and
// so is any without Touch.
func TestTouchLetsInWhatFits(t *testing.T) {
	r, sec := touchReplica(t, true)
	mustState(t, r.Admit(HashKey("d"), Body{Bytes: 100 * BytesPerToken}, nil, sec(3), nil), Admitted)
	r, sec = touchReplica(t, false)
	mustState(t, r.Admit(HashKey("d"), Body{Bytes: 300 * BytesPerToken}, nil, sec(3), nil), Admitted)
}

// The wait is at most Linger: the idle residents' residencies expire.
func TestTouchWaitsAtMostLinger(t *testing.T) {
	r, sec := touchReplica(t, true)
	d := r.Admit(HashKey("d"), Body{Bytes: 300 * BytesPerToken}, nil, sec(3), nil)
	mustState(t, d, Waiting)
	r.Sweep(sec(3 + 60))
	mustState(t, d, Admitted)
}
