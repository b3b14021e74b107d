package selection

import (
	"fmt"
	"testing"
	"time"
)

func TestHashedKeyIsTheKey(t *testing.T) {
	r := newTestRouter(4, Config{})
	home := id(pick(t, r, "conv"))
	for range 3 {
		d := r.Pick(Request{Hash: HashKey("conv"), Now: t0})
		if id(d) != home || d.Outcome != Sticky {
			t.Fatalf("by hash: %v on %s, pinned to %s", d.Outcome, id(d), home)
		}
		d.Release()
	}
	if st := r.Status(); st.Sessions != 1 || st.Unkeyed != 0 {
		t.Errorf("sessions %d, unkeyed %d", st.Sessions, st.Unkeyed)
	}
}

// child is a sub-agent's first request, held in flight.
func child(r testRouter, key string, parent string, continues bool) Decision {
	return r.Pick(Request{Key: key, Parent: HashKey(parent), Continues: continues, Now: t0})
}

// A sub-agent is its own conversation. The first child of an idle agent
// joins its replica (the shared system prefix is cached there); children
// running in parallel spread over the other replicas instead of piling on
// it. Each keeps its own pin.
func TestSubAgentsJoinThenSpread(t *testing.T) {
	r := newTestRouter(4, Config{})
	d := pick(t, r, "agent")
	home := id(d)
	d.Release() // a foreground sub-agent: the agent waits

	first := child(r, "child-1", "agent", false)
	if first.Outcome != Joined || id(first) != home {
		t.Fatalf("first child: %v on %s, want joined on %s", first.Outcome, id(first), home)
	}
	used := map[string]bool{id(first): true}
	for _, k := range []string{"child-2", "child-3"} {
		d := child(r, k, "agent", false)
		if d.Outcome != Placed {
			t.Errorf("%s: %v, want placed by load", k, d.Outcome)
		}
		used[id(d)] = true
	}
	if len(used) != 3 {
		t.Errorf("3 parallel children on %d replicas, want 3", len(used))
	}
	// Each child keeps its pin; the agent keeps its own.
	for _, k := range []string{"child-1", "child-2", "child-3", "agent"} {
		if d := pick(t, r, k); d.Outcome != Sticky {
			t.Errorf("%s: %v, want sticky", k, d.Outcome)
		}
	}
	st := r.Status()
	var placed, joined uint64
	for _, rs := range st.Replicas {
		placed += rs.Placed
		joined += rs.Joined
	}
	if placed != 4 || joined != 1 || st.Sessions != 4 {
		t.Errorf("placed %d, joined %d, sessions %d; want 4, 1, 4", placed, joined, st.Sessions)
	}
}

// A parent's replica over its spill threshold takes no child, even one that
// continues the parent's conversation; below it, a continuation joins even
// when that replica is the busiest.
func TestContinuationJoinsUnlessOverThreshold(t *testing.T) {
	r := newTestRouter(3, Config{SpillThreshold: 2})
	home := id(pick(t, r, "head")) // 1 in flight, others idle
	pick(t, r, "head")             // 2
	if d := child(r, "fork", "head", true); d.Outcome != Joined || id(d) != home {
		t.Fatalf("continuation at 2 in flight: %v on %s, want joined on %s", d.Outcome, id(d), home)
	}
	// Now 3 in flight > 2.
	if d := child(r, "fork-2", "head", true); d.Outcome != Placed || id(d) == home {
		t.Fatalf("continuation over the threshold: %v on %s, want placed elsewhere", d.Outcome, id(d))
	}
	if d := child(r, "sub", "head", false); d.Outcome != Placed || id(d) == home {
		t.Fatalf("sub-agent over the threshold: %v on %s", d.Outcome, id(d))
	}
	// An unknown or expired parent: placed by load.
	if d := child(r, "orphan", "never-seen", false); d.Outcome != Placed {
		t.Fatalf("orphan: %v", d.Outcome)
	}
	// A parent on an unhealthy replica: placed by load.
	r2 := newTestRouter(2, Config{})
	d := pick(t, r2, "p")
	d.Release()
	r2.SetHealthy(id(d), false)
	if c := child(r2, "c", "p", true); c.Outcome != Placed || id(c) == id(d) {
		t.Fatalf("parent unhealthy: %v on %s", c.Outcome, id(c))
	}
}

// A summarising request stays on the pin (its prompt is the old history);
// the next request is placed anew by load, counted as compacted, and the
// conversation stays there afterwards.
func TestCompactionPlacesTheNextTurnAnew(t *testing.T) {
	r := newTestRouter(2, Config{CompactionInterval: time.Minute})
	now := t0
	turn := func(key string, hint Compaction) Decision {
		return r.Pick(Request{Key: key, Compaction: hint, Now: now})
	}
	d := turn("conv", NoCompaction)
	home := id(d)
	d.Release()
	// Other clients load home (two scrapes in a row).
	for range 2 {
		r.SetLoad(home, Load{Known: true, Running: 5})
	}
	now = now.Add(2 * time.Minute)
	if d := turn("conv", Compacting); d.Outcome != Sticky || id(d) != home {
		t.Fatalf("summarising request: %v on %s, want sticky on %s", d.Outcome, id(d), home)
	} else {
		d.Release()
	}
	d = turn("conv", NoCompaction)
	if d.Outcome != Compacted || id(d) == home {
		t.Fatalf("after compaction: %v on %s, want compacted away from the busier %s", d.Outcome, id(d), home)
	}
	moved := id(d)
	d.Release()
	d = turn("conv", NoCompaction)
	if d.Outcome != Sticky || id(d) != moved {
		t.Fatalf("next turn: %v on %s, want sticky on %s", d.Outcome, id(d), moved)
	}
	d.Release()
	st := r.Status()
	var compacted uint64
	for _, rs := range st.Replicas {
		compacted += rs.Compacted
		if rs.Sessions < 0 || rs.ActiveSessions < 0 {
			t.Errorf("%s: sessions %d, active %d", rs.ID, rs.Sessions, rs.ActiveSessions)
		}
	}
	if compacted != 1 || st.Sessions != 1 || st.InFlight != 0 {
		t.Errorf("compacted %d, sessions %d, in flight %d; want 1, 1, 0", compacted, st.Sessions, st.InFlight)
	}
}

// A hint on every request (a buggy or hostile client) moves a conversation
// at most once per CompactionInterval.
func TestCompactionHintOnEveryRequestDoesNotThrash(t *testing.T) {
	r := newTestRouter(4, Config{CompactionInterval: time.Minute})
	now := t0
	moves := 0
	for i := range 600 { // ten minutes, a request a second
		hint := CompactedPrefix
		if i%2 == 0 {
			hint = Compacting
		}
		d := r.Pick(Request{Key: "noisy", Compaction: hint, Now: now})
		if d.Outcome == Compacted {
			moves++
		}
		d.Release()
		now = now.Add(time.Second)
	}
	if moves < 8 || moves > 10 {
		t.Errorf("%d re-placements in 10 minutes, want one a minute at most", moves)
	}
	if st := r.Status(); st.CompactionsIgnored < 280 { // of the 300 CompactedPrefix hints
		t.Errorf("ignored %d hints", st.CompactionsIgnored)
	}
}

// An explicit hint on the first request after compaction places it anew.
func TestCompactedPrefixHint(t *testing.T) {
	r := newTestRouter(3, Config{})
	d := r.Pick(Request{Key: "c", Now: t0})
	d.Release()
	later := t0.Add(time.Hour / 4)
	if d := r.Pick(Request{Key: "c", Compaction: CompactedPrefix, Now: later}); d.Outcome != Compacted {
		t.Fatalf("%v, want compacted", d.Outcome)
	}
	// Soon after, the hint repeated is ignored.
	if d := r.Pick(Request{Key: "c", Compaction: CompactedPrefix, Now: later.Add(time.Second)}); d.Outcome != Sticky {
		t.Fatalf("%v, want sticky", d.Outcome)
	}
}

// Concurrent first requests after a compaction place the conversation once.
func TestConcurrentCompactionPlacesOnce(t *testing.T) {
	r := newTestRouter(4, Config{})
	d := r.Pick(Request{Key: "c", Now: t0})
	d.Release()
	later := t0.Add(time.Hour / 4)
	done := make(chan Outcome, 8)
	for range 8 {
		go func() {
			d := r.Pick(Request{Key: "c", Compaction: CompactedPrefix, Now: later})
			done <- d.Outcome
			d.Release()
		}()
	}
	n := 0
	for range 8 {
		if <-done == Compacted {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d compactions, want 1", n)
	}
}

// A million header-less conversations, each with its first turn and its
// continuation (two keys, the second naming the first as parent) and a
// compaction hint now and then: the table holds its bound, the counts stay
// consistent, nothing is left in flight.
func TestMillionFingerprintFlood(t *testing.T) {
	n := 1_000_000
	if testing.Short() {
		n = 50_000
	}
	const maxSessions = 1000
	r := newTestRouter(4, Config{MaxSessions: maxSessions})
	now := t0
	for i := range n {
		head := HashKey(fmt.Sprintf("head-%d", i))
		r.Pick(Request{Hash: head, Now: now}).Release()
		hint := NoCompaction
		if i%97 == 0 {
			hint = CompactedPrefix
		}
		r.Pick(Request{Hash: head ^ 0x9e3779b97f4a7c15, Parent: head, Continues: true, Compaction: hint, Now: now}).Release()
		if i%10_000 == 0 {
			now = now.Add(time.Second)
		}
	}
	st := r.Status()
	var sessions, active int64
	for _, rs := range st.Replicas {
		sessions += rs.Sessions
		active += rs.ActiveSessions
	}
	if st.Sessions != maxSessions || sessions != maxSessions || active > maxSessions || st.InFlight != 0 {
		t.Errorf("sessions %d (sum %d), active %d, in flight %d; want %d sessions", st.Sessions, sessions, active, st.InFlight, maxSessions)
	}
	if st.Evicted != uint64(2*n-maxSessions) {
		t.Errorf("evicted %d, want %d", st.Evicted, 2*n-maxSessions)
	}
}

// A header-less conversation's second turn joins its first turn's key, which
// then stops counting as a conversation of its own; the active counts stay
// exact through sweeps and through a new use of the old key.
func TestRenamedConversationCountsOnce(t *testing.T) {
	r := newTestRouter(2, Config{ActiveWindow: time.Minute})
	head := HashKey("head")
	r.Pick(Request{Hash: head, Now: t0}).Release()
	d := r.Pick(Request{Hash: HashKey("head+reply"), Parent: head, Continues: true, Renamed: true, Now: t0})
	d.Release()
	if d.Outcome != Joined || activeTotal(r) != 1 || r.Status().Sessions != 2 {
		t.Fatalf("%v, active %d, sessions %d; want joined, 1 active, 2 entries", d.Outcome, activeTotal(r), r.Status().Sessions)
	}
	// Another conversation with the same head: the old key is used again.
	r.Pick(Request{Hash: head, Now: t0.Add(time.Second)}).Release()
	if activeTotal(r) != 2 {
		t.Fatalf("active %d after the head's reuse, want 2", activeTotal(r))
	}
	r.Sweep(t0.Add(2 * time.Minute))
	if activeTotal(r) != 0 {
		t.Fatalf("active %d after the window, want 0", activeTotal(r))
	}
	r.Pick(Request{Hash: head, Now: t0.Add(3 * time.Minute)}).Release()
	d = r.Pick(Request{Hash: HashKey("other+reply"), Parent: head, Continues: true, Renamed: true, Now: t0.Add(3 * time.Minute)})
	d.Release()
	r.Sweep(t0.Add(5 * time.Minute))
	for _, rs := range r.Status().Replicas {
		if rs.ActiveSessions != 0 {
			t.Errorf("%s: %d active after the window", rs.ID, rs.ActiveSessions)
		}
	}
}
