package selection

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// checkTable verifies the session table's invariants: each shard's list
// links back and forth and holds exactly its map, is ordered by last use,
// its active entries are a prefix ending at oldestActive, and every
// replica's session and active counts match the entries pinned to it.
func checkTable(t *testing.T, r *Router) {
	t.Helper()
	sessions, active := map[*replicaState]int64{}, map[*replicaState]int64{}
	for i := range r.sessions.shards {
		sh := &r.sessions.shards[i]
		n := 0
		var prev, lastActive *session
		inPrefix := true
		for e := sh.head; e != nil; prev, e = e, e.next {
			n++
			if e.prev != prev || sh.byKey[e.key] != e {
				t.Fatalf("shard %d: entry %x badly linked", i, e.key)
			}
			if prev != nil && prev.lastSeen < e.lastSeen {
				t.Fatalf("shard %d: entry %x used at %d after an entry used at %d", i, e.key, e.lastSeen, prev.lastSeen)
			}
			if e.active && !inPrefix {
				t.Fatalf("shard %d: active entry %x after an idle one", i, e.key)
			}
			inPrefix = e.active
			if e.active {
				lastActive = e
				active[e.pin]++
			}
			sessions[e.pin]++
		}
		if sh.tail != prev || n != len(sh.byKey) || sh.oldestActive != lastActive {
			t.Fatalf("shard %d: %d listed, %d mapped; tail or oldestActive wrong", i, n, len(sh.byKey))
		}
		if n > sh.capacity {
			t.Fatalf("shard %d: %d entries over capacity %d", i, n, sh.capacity)
		}
	}
	for _, s := range r.states {
		if s.sessions.Load() != sessions[s] || s.active.Load() != active[s] {
			t.Fatalf("%s counts %d sessions, %d active; the table has %d, %d", s.ID, s.sessions.Load(), s.active.Load(), sessions[s], active[s])
		}
	}
}

func activeSessions(st Status) (n int64) {
	for _, rs := range st.Replicas {
		n += rs.ActiveSessions
	}
	return n
}

// byKey indexes pins by key.
func byKey(pins []Pin) map[uint64]Pin {
	out := make(map[uint64]Pin, len(pins))
	for _, p := range pins {
		out[p.Key] = p
	}
	return out
}

// A table played by random requests, sweeps and reloads, snapshotted and
// restored into a new router with the same config, is the same table: the
// same pins, last uses, order, active sessions and counts; and the next turn
// of each conversation goes to its replica.
func TestSnapshotRestoreRoundTrip(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		cfg := Config{Affinity: true, SessionTTL: 10 * time.Minute, ActiveWindow: time.Minute, MaxSessions: MinMaxSessions * (2 + rng.IntN(10))}
		old := newTestRouter(2+rng.IntN(6), cfg)
		now := t0
		for range 3000 {
			now = now.Add(time.Duration(1+rng.IntN(500)) * time.Millisecond) // distinct times: a total order
			switch op := rng.IntN(100); {
			case op < 95:
				old.Pick(Request{Key: fmt.Sprint("conv-", rng.IntN(1000)), Now: now}).Release()
			case op < 98:
				old.Sweep(now)
			default: // one replica out and back: pins on a replica the view lost
				reps := old.Replicas()
				old.reload(cfg, slices.Delete(slices.Clone(reps), 0, 1))
				old.reload(cfg, reps)
			}
		}
		old.Sweep(now)
		checkTable(t, old.Router)
		pins := old.Router.Snapshot()
		before := old.Status()
		if int64(len(pins)) != before.Sessions {
			t.Fatalf("seed %d: snapshot of %d pins, the table holds %d", seed, len(pins), before.Sessions)
		}
		if active := activeSessions(before); active == 0 || active == before.Sessions {
			t.Fatalf("seed %d: %d of %d sessions active: the test needs both", seed, active, before.Sessions)
		}

		restarted := newTestRouter(len(old.Replicas()), cfg)
		st := restarted.Restore(pins, now)
		if st.Restored != len(pins) || st.Dropped() != 0 {
			t.Fatalf("seed %d: %+v restoring %d pins", seed, st, len(pins))
		}
		checkTable(t, restarted.Router)
		for i := range old.sessions.shards {
			a, b := &old.sessions.shards[i], &restarted.sessions.shards[i]
			for x, y := a.head, b.head; x != nil || y != nil; x, y = x.next, y.next {
				if x == nil || y == nil || x.key != y.key || x.lastSeen != y.lastSeen || x.pin.ID != y.pin.ID || x.active != y.active {
					t.Fatalf("seed %d shard %d: restored list differs from the original", seed, i)
				}
			}
		}
		after := restarted.Status()
		for i := range before.Replicas {
			b, a := before.Replicas[i], after.Replicas[i]
			if b.Sessions != a.Sessions || b.ActiveSessions != a.ActiveSessions {
				t.Errorf("seed %d %s: %d sessions, %d active before; %d, %d restored", seed, b.ID, b.Sessions, b.ActiveSessions, a.Sessions, a.ActiveSessions)
			}
		}
		home := byKey(pins)
		for c := range 1000 {
			key := fmt.Sprint("conv-", c)
			p, pinned := home[HashKey(key)]
			if !pinned {
				continue
			}
			d := restarted.Pick(Request{Key: key, Now: now})
			if d.Outcome != Sticky || id(d) != p.Replica {
				t.Fatalf("seed %d: %s %v on %s, pinned to %s", seed, key, d.Outcome, id(d), p.Replica)
			}
			d.Release()
		}
	}
}

// Pins past the TTL or on replicas the config no longer lists are dropped,
// and counted; a pin exactly at the TTL is kept, as a request would find it.
func TestRestoreDropsExpiredAndUnknown(t *testing.T) {
	r := newTestRouter(2, Config{SessionTTL: time.Minute})
	ids := r.Replicas()
	now := t0.Add(time.Hour)
	st := r.Restore([]Pin{
		{Key: 1, Replica: ids[0].ID, LastUse: now.Add(-time.Minute).UnixNano()},
		{Key: 2, Replica: ids[1].ID, LastUse: now.Add(-time.Minute - 1).UnixNano()},
		{Key: 3, Replica: "127.0.0.1:9999", LastUse: now.UnixNano()},
		{Key: 4, Replica: "127.0.0.1:9999", LastUse: 0},
	}, now)
	if want := (RestoreStats{Restored: 1, Expired: 2, UnknownReplica: 1}); st != want {
		t.Errorf("got %+v, want %+v", st, want)
	}
	checkTable(t, r.Router)
	if got := r.Snapshot(); len(got) != 1 || got[0].Key != 1 {
		t.Errorf("table after restore: %+v", got)
	}
}

// max_sessions holds: each shard keeps its most recent pins, as eviction
// would, and what a request placed since the start is never pushed out.
func TestRestoreKeepsTheMostRecentWithinMaxSessions(t *testing.T) {
	r := newTestRouter(3, Config{MaxSessions: 2 * MinMaxSessions})
	live := pick(t, r, "placed before the restore")
	live.Release()
	liveKey := HashKey("placed before the restore")
	var pins []Pin
	for i := range 1000 {
		pins = append(pins, Pin{Key: uint64(i + 2), Replica: r.Replicas()[i%3].ID, LastUse: t0.Add(-time.Duration(i) * time.Second).UnixNano()})
	}
	st := r.Restore(pins, t0)
	checkTable(t, r.Router)
	if st.Restored != 2*MinMaxSessions-1 || st.OverCapacity != 1000-st.Restored {
		t.Errorf("restored %d, %d over capacity; want %d and the rest", st.Restored, st.OverCapacity, 2*MinMaxSessions-1)
	}
	kept := byKey(r.Snapshot())
	if _, ok := kept[liveKey]; !ok {
		t.Error("the session placed before the restore was pushed out")
	}
	for i := range sessionShards {
		// The shard's pins, most recent first (pins are listed that way).
		var shard []Pin
		for _, p := range pins {
			if p.Key%sessionShards == uint64(i) {
				shard = append(shard, p)
			}
		}
		room := r.sessions.shards[i].capacity
		if liveKey%sessionShards == uint64(i) {
			room--
		}
		for j, p := range shard {
			if _, ok := kept[p.Key]; ok != (j < room) {
				t.Fatalf("shard %d: pin %d of %d (most recent first) kept=%v with room for %d", i, j, len(shard), ok, room)
			}
		}
	}
}

// A pin already in the table, and the older of a key listed twice, lose to
// what the table holds.
func TestRestoreKeepsWhatTheTableHolds(t *testing.T) {
	r := newTestRouter(2, Config{})
	ids := r.Replicas()
	d := pick(t, r, "live")
	d.Release()
	other := ids[0].ID
	if other == id(d) {
		other = ids[1].ID
	}
	st := r.Restore([]Pin{
		{Key: HashKey("live"), Replica: other, LastUse: t0.UnixNano()},
		{Key: 7, Replica: ids[0].ID, LastUse: t0.Add(-2 * time.Second).UnixNano()},
		{Key: 7, Replica: ids[1].ID, LastUse: t0.Add(-time.Second).UnixNano()},
	}, t0)
	if want := (RestoreStats{Restored: 1, Present: 2}); st != want {
		t.Errorf("got %+v, want %+v", st, want)
	}
	checkTable(t, r.Router)
	pins := byKey(r.Snapshot())
	if pins[HashKey("live")].Replica != id(d) || pins[7].Replica != ids[1].ID {
		t.Errorf("table after restore: %+v", pins)
	}
}

// Restored sessions count as load for placement only within the active
// window, and leave it, then the table, as sweeps pass.
func TestRestoredSessionsActiveOnlyWithinTheWindow(t *testing.T) {
	r := newTestRouter(2, Config{ActiveWindow: time.Minute, SessionTTL: 10 * time.Minute})
	ids := r.Replicas()
	st := r.Restore([]Pin{
		{Key: 1, Replica: ids[0].ID, LastUse: t0.Add(-30 * time.Second).UnixNano()},
		{Key: 2, Replica: ids[0].ID, LastUse: t0.Add(-5 * time.Minute).UnixNano()},
		{Key: 3, Replica: ids[1].ID, LastUse: t0.Add(time.Hour).UnixNano()}, // from the future: now
	}, t0)
	if st.Restored != 3 {
		t.Fatalf("%+v", st)
	}
	checkTable(t, r.Router)
	active := func() (a, b int64) {
		s := r.Status()
		return s.Replicas[0].ActiveSessions, s.Replicas[1].ActiveSessions
	}
	if a, b := active(); a != 1 || b != 1 {
		t.Errorf("active sessions %d, %d; want 1, 1", a, b)
	}
	if p := byKey(r.Snapshot())[3]; p.LastUse != t0.UnixNano() {
		t.Errorf("a last use in the future restored as %d, want now", p.LastUse)
	}
	r.Sweep(t0.Add(61 * time.Second))
	checkTable(t, r.Router)
	if a, b := active(); a != 0 || b != 0 {
		t.Errorf("after the window: active sessions %d, %d", a, b)
	}
	r.Sweep(t0.Add(6 * time.Minute)) // past key 2's TTL only
	checkTable(t, r.Router)
	if n := r.Status().Sessions; n != 2 {
		t.Errorf("after the oldest's TTL: %d sessions, want 2", n)
	}
}

// Pins older than entries already in the table go behind them, newer ones
// in front, whatever the interleaving: sweeps and eviction rely on the order.
func TestRestoreInterleavesByLastUse(t *testing.T) {
	r := newTestRouter(2, Config{MaxSessions: MinMaxSessions * 100})
	ids := r.Replicas()
	var pins []Pin
	for i := range 400 {
		at := t0.Add(time.Duration(i) * time.Second)
		if i%3 == 0 {
			r.Pick(Request{Key: fmt.Sprint("live-", i), Now: at}).Release()
			continue
		}
		pins = append(pins, Pin{Key: HashKey(fmt.Sprint("old-", i)), Replica: ids[i%2].ID, LastUse: at.UnixNano()})
	}
	rand.Shuffle(len(pins), func(i, j int) { pins[i], pins[j] = pins[j], pins[i] })
	if st := r.Restore(pins, t0.Add(400*time.Second)); st.Restored != len(pins) {
		t.Fatalf("%+v", st)
	}
	checkTable(t, r.Router)
}

// Snapshots taken while requests are routed see a consistent entry each
// (the race detector checks the locking; make test runs it). Requests of
// different goroutines carry times out of order, as in a server, so the
// table's order is not checked.
func TestSnapshotWhileRouting(t *testing.T) {
	r := newTestRouter(4, Config{MaxSessions: 1000})
	known := map[string]bool{}
	for _, rep := range r.Replicas() {
		known[rep.ID] = true
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				r.Pick(Request{Key: fmt.Sprint("conv-", g, "-", i%3000), Now: t0.Add(time.Duration(i) * time.Millisecond)}).Release()
			}
		})
	}
	for range 50 {
		for _, p := range r.Router.Snapshot() {
			if !known[p.Replica] || p.LastUse < t0.UnixNano() {
				t.Errorf("pin %+v", p)
			}
		}
	}
	close(done)
	wg.Wait()
	if n := len(r.Router.Snapshot()); int64(n) != r.Status().Sessions {
		t.Errorf("snapshot of %d pins, the table holds %d", n, r.Status().Sessions)
	}
}
