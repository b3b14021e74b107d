package selection

import (
	"fmt"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// touchReplica is one replica with room for 1000 tokens, a, b and c
// resident there (300 tokens each), a and b idle since seconds 1 and 2,
// and c's task ended at second 3; sec is a clock in seconds.
func touchReplica(t *testing.T, touch bool) (testRouter, func(s int) time.Time) {
	return touchReplicaStaggered(t, touch, 0)
}

// touchReplicaStaggered is touchReplica with a stagger.
func touchReplicaStaggered(t *testing.T, touch bool, stagger time.Duration) (testRouter, func(s int) time.Time) {
	t.Helper()
	r := holding(newTestRouter(1, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 1000, Fill: 1, Linger: time.Minute, Quantum: -1, Touch: touch, Stagger: stagger,
	}}))
	sec := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	var tickets []*loadcontrol.Ticket
	for _, key := range []string{"a", "b", "c"} {
		tk := r.admitKey(HashKey(key), loadcontrol.Body{Bytes: 300 * BytesPerToken}, nil, sec(0), nil)
		mustState(t, tk, loadcontrol.Admitted)
		tickets = append(tickets, tk)
	}
	tickets[0].Done(sec(1))
	tickets[1].Done(sec(2))
	tickets[2].End(sec(3), loadcontrol.Reply{TaskEnded: true})
	return r, sec
}

// A newcomer that would overflow the cache with the departed's blocks
// waits until every resident idle since before the departure has begun a
// turn again: the engine's LRU would evict theirs first.
func TestTouchHoldsANewcomerUntilTheIdleResidentsReturn(t *testing.T) {
	r, sec := touchReplica(t, true)
	d := r.admitKey(HashKey("d"), loadcontrol.Body{Bytes: 300 * BytesPerToken}, nil, sec(3), nil)
	mustState(t, d, loadcontrol.Waiting) // 600 resident + 300 departed + 300 > 1000
	mustState(t, r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 300 * BytesPerToken}, nil, sec(4), nil), loadcontrol.Admitted)
	r.Sweep(sec(4))
	mustState(t, d, loadcontrol.Waiting) // b is still idle since before c left
	mustState(t, r.admitKey(HashKey("b"), loadcontrol.Body{Bytes: 300 * BytesPerToken}, nil, sec(5), nil), loadcontrol.Admitted)
	r.Sweep(sec(5))
	mustState(t, d, loadcontrol.Admitted)
}

// A newcomer that fits with the departed's blocks is admitted at once, and
// so is any without Touch.
func TestTouchLetsInWhatFits(t *testing.T) {
	r, sec := touchReplica(t, true)
	mustState(t, r.admitKey(HashKey("d"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, sec(3), nil), loadcontrol.Admitted)
	r, sec = touchReplica(t, false)
	mustState(t, r.admitKey(HashKey("d"), loadcontrol.Body{Bytes: 300 * BytesPerToken}, nil, sec(3), nil), loadcontrol.Admitted)
}

// The wait is at most Linger: the idle residents' residencies expire.
func TestTouchWaitsAtMostLinger(t *testing.T) {
	r, sec := touchReplica(t, true)
	d := r.admitKey(HashKey("d"), loadcontrol.Body{Bytes: 300 * BytesPerToken}, nil, sec(3), nil)
	mustState(t, d, loadcontrol.Waiting)
	r.Sweep(sec(3 + 60))
	mustState(t, d, loadcontrol.Admitted)
}

// A conversation coming back to its pin passes a head that waits only for
// touch, with or without a stagger: its own blocks were freed last.
func TestTouchLetsAReturningConversationPass(t *testing.T) {
	for _, stagger := range []time.Duration{0, time.Nanosecond} {
		r, sec := touchReplicaStaggered(t, true, stagger) // c left, still pinned
		mustState(t, r.admitKey(HashKey("d"), loadcontrol.Body{Bytes: 300 * BytesPerToken}, nil, sec(3), nil), loadcontrol.Waiting)
		if c := r.admitKey(HashKey("c"), loadcontrol.Body{Bytes: 300 * BytesPerToken}, nil, sec(4), nil); c.State() != loadcontrol.Admitted {
			t.Errorf("stagger %v: c, back to its pin, waits behind d", stagger)
		}
	}
}

// A newcomer's cost does not grow with the idle residents of the other
// replicas, touch on or off.
func BenchmarkTouchNewcomerBesideManyIdle(b *testing.B) {
	for _, touch := range []bool{false, true} {
		for _, n := range []int{100, 100_000} {
			b.Run(fmt.Sprintf("touch=%v/idle=%d", touch, n), func(b *testing.B) {
				r := newTestRouter(2, Config{Admission: loadcontrol.Config{Enabled: true, CapacityTokens: 1 << 30,
					Linger: time.Hour, Quantum: -1, Touch: touch}})
				only := func(id string) func(string) bool { return func(s string) bool { return s == id } }
				r0, r1 := only("127.0.0.1:8001"), only("127.0.0.1:8002")
				for i := range n {
					r.admitKey(uint64(i+1), loadcontrol.Body{Bytes: 4}, r0, t0, nil).Done(t0.Add(time.Duration(i)))
				}
				at := t0.Add(time.Second)
				r.admitKey(1<<40, loadcontrol.Body{Bytes: 4}, r1, at, nil).Done(at)
				at = at.Add(time.Second)
				r.admitKey(1<<40+1, loadcontrol.Body{Bytes: 4}, r1, at, nil).End(at, loadcontrol.Reply{TaskEnded: true})
				now := at.Add(time.Second)
				key := uint64(1 << 41)
				b.ReportAllocs()
				for b.Loop() {
					key++
					tk := r.admitKey(key, loadcontrol.Body{Bytes: 4}, r1, now, nil)
					if tk.State() != loadcontrol.Admitted {
						b.Fatal("not admitted")
					}
					tk.End(now, loadcontrol.Reply{TaskEnded: true})
				}
			})
		}
	}
}
