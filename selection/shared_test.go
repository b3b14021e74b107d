package selection

import (
	"sync"
	"testing"
	"time"
)

// memoryPins is a SharedPins in memory, counting calls; down makes it fail
// as an unreachable store does.
type memoryPins struct {
	mu     sync.Mutex
	pins   map[uint64]string
	calls  int
	down   bool
	repins []string // "from>to" of every successful Repin
}

func newMemoryPins() *memoryPins { return &memoryPins{pins: map[uint64]string{}} }

func (m *memoryPins) Claim(key uint64, replica string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	if m.down {
		return "", false
	}
	if p, ok := m.pins[key]; ok {
		return p, true
	}
	m.pins[key] = replica
	return replica, true
}

func (m *memoryPins) Repin(key uint64, from, to string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	if m.down {
		return "", false
	}
	if p, ok := m.pins[key]; ok && p != from {
		return p, true
	}
	m.pins[key] = to
	m.repins = append(m.repins, from+">"+to)
	return to, true
}

func (m *memoryPins) callCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls
}

// sharedRouters are n routers of the same fleet sharing one pin table, as
// Caddy instances behind one front do.
func sharedRouters(n, replicas int, pins SharedPins) []testRouter {
	out := make([]testRouter, n)
	for i := range out {
		out[i] = newTestRouter(replicas, Config{Shared: pins})
	}
	return out
}

func TestSharedPinFollowedByARouterThatNeverSawTheConversation(t *testing.T) {
	pins := newMemoryPins()
	rs := sharedRouters(2, 3, pins)
	a, b := rs[0], rs[1]
	d := pick(t, a, "conv")
	d.Release()
	if d.Outcome != Placed {
		t.Fatalf("first sight on a: %v", d.Outcome)
	}
	// b would place it elsewhere: other clients keep a's choice busy (two
	// scrapes in a row).
	for range 2 {
		b.SetLoad(id(d), Load{Known: true, Running: 3})
	}
	got := pick(t, b, "conv")
	got.Release()
	if got.Outcome != Adopted || id(got) != id(d) {
		t.Fatalf("b: %v on %s, want adopted on %s", got.Outcome, id(got), id(d))
	}
	calls := pins.callCount()
	for range 10 {
		again := pick(t, b, "conv")
		again.Release()
		if again.Outcome != Sticky || id(again) != id(d) {
			t.Fatalf("b again: %v on %s", again.Outcome, id(again))
		}
	}
	if pins.callCount() != calls {
		t.Fatalf("a conversation b knows cost %d shared-table calls", pins.callCount()-calls)
	}
	st := b.Status()
	for _, rs := range st.Replicas {
		if rs.InFlight != 0 {
			t.Fatalf("in flight left on %s: %d", rs.ID, rs.InFlight)
		}
		if want := uint64(0); rs.ID == id(d) {
			want = 1
			if rs.Adopted != want || rs.Placed != 0 {
				t.Fatalf("%s counts adopted %d placed %d", rs.ID, rs.Adopted, rs.Placed)
			}
		} else if rs.Placed != 0 || rs.Sessions != 0 {
			t.Fatalf("%s counts placed %d, holds %d sessions", rs.ID, rs.Placed, rs.Sessions)
		}
	}
}

func TestSharedPinOnAReplicaUnusableHereMovesByCompareAndSet(t *testing.T) {
	pins := newMemoryPins()
	r := sharedRouters(1, 2, pins)[0]
	key := HashKey("conv")
	pins.pins[key] = "127.0.0.1:9999" // a replica this config does not list
	d := pick(t, r, "conv")
	d.Release()
	if d.Outcome != Placed || pins.pins[key] != id(d) {
		t.Fatalf("outcome %v on %s, shared pin %s", d.Outcome, id(d), pins.pins[key])
	}
	if len(pins.repins) != 1 || pins.repins[0] != "127.0.0.1:9999>"+id(d) {
		t.Fatalf("repins %v", pins.repins)
	}

	// The pin goes down: the move is published as a compare-and-set.
	r.SetHealthy(id(d), false)
	moved := pick(t, r, "conv")
	moved.Release()
	if moved.Outcome != Replaced || pins.pins[key] != id(moved) || pins.repins[1] != id(d)+">"+id(moved) {
		t.Fatalf("outcome %v on %s, shared pin %s, repins %v", moved.Outcome, id(moved), pins.pins[key], pins.repins)
	}
}

func TestSharedPinsDownRoutesLocally(t *testing.T) {
	pins := newMemoryPins()
	pins.down = true
	r := sharedRouters(1, 3, pins)[0]
	for _, key := range []string{"a", "b", "c"} {
		d := pick(t, r, key)
		d.Release()
		if d.Outcome != Placed {
			t.Fatalf("%s: %v", key, d.Outcome)
		}
	}
	if lo, hi := spread(r); lo != 1 || hi != 1 {
		t.Fatalf("spread %d..%d", lo, hi)
	}
}

func TestAdoptMovesOrLearnsPinsOnHealthyListedReplicas(t *testing.T) {
	r := newTestRouter(3, Config{})
	d := pick(t, r, "conv")
	d.Release()
	key := HashKey("conv")
	reps := r.Replicas()
	other := reps[0].ID
	if other == id(d) {
		other = reps[1].ID
	}
	if r.Adopt(key, "127.0.0.1:9999", t0) {
		t.Fatal("adopted a replica the view does not list")
	}
	r.SetHealthy(other, false)
	if r.Adopt(key, other, t0) {
		t.Fatal("adopted an unhealthy replica")
	}
	r.SetHealthy(other, true)
	if r.Adopt(key, id(d), t0) {
		t.Fatal("adopting the pin in force changed something")
	}
	if !r.Adopt(key, other, t0) {
		t.Fatal("did not adopt")
	}
	again := pick(t, r, "conv")
	again.Release()
	if again.Outcome != Sticky || id(again) != other {
		t.Fatalf("after adopt: %v on %s", again.Outcome, id(again))
	}

	// A conversation another router placed is learnt: it counts as load
	// on its replica when this router places the next one.
	if !r.Adopt(HashKey("theirs"), other, t0) {
		t.Fatal("did not learn another router's pin")
	}
	for _, rs := range r.Status().Replicas {
		if rs.ID == other && (rs.Sessions != 2 || rs.ActiveSessions != 2 || rs.Adopted != 2) {
			t.Fatalf("%s after learning: %+v", other, rs)
		}
	}
	learnt := pick(t, r, "theirs")
	learnt.Release()
	if learnt.Outcome != Sticky || id(learnt) != other {
		t.Fatalf("learnt conversation: %v on %s", learnt.Outcome, id(learnt))
	}
}

func TestPinsUsedSinceListsRecentPinsOnly(t *testing.T) {
	r := newTestRouter(2, Config{})
	r.Pick(Request{Key: "old", Now: t0}).Release()
	r.Pick(Request{Key: "new", Now: t0.Add(10 * time.Second)}).Release()
	r.Pick(Request{Key: "newer", Now: t0.Add(20 * time.Second)}).Release()
	got := r.PinsUsedSince(t0.Add(10 * time.Second))
	if len(got) != 2 {
		t.Fatalf("got %d pins, want 2: %+v", len(got), got)
	}
	for _, p := range got {
		if p.Key == HashKey("old") {
			t.Fatalf("old pin listed: %+v", got)
		}
	}
}

// A turn of a conversation the router knows costs the shared table nothing:
// no call, no allocation.
func TestPinnedLookupWithSharedPinsCallsNothing(t *testing.T) {
	pins := newMemoryPins()
	r := sharedRouters(1, 4, pins)[0]
	pick(t, r, "conv").Release()
	calls := pins.callCount()
	allocs := testing.AllocsPerRun(1000, func() {
		r.Pick(Request{Key: "conv", Now: t0}).Release()
	})
	if allocs != 0 || pins.callCount() != calls {
		t.Fatalf("%v allocations and %d shared calls per known turn", allocs, pins.callCount()-calls)
	}
}
