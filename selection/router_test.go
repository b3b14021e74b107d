package selection

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func servers(n int) []Replica {
	reps := make([]Replica, n)
	for i := range reps {
		addr := fmt.Sprintf("127.0.0.1:%d", 8001+i)
		reps[i] = Replica{ID: addr, Address: addr}
	}
	return reps
}

// testRouter is a router with one applied view, as one config load makes it.
type testRouter struct {
	*View
	*Router
}

// Disambiguate the embedded types' methods of the same name.
func (r testRouter) Pick(req Request) Decision { return r.View.Pick(req) }

func newTestRouter(n int, cfg Config) testRouter {
	cfg.Affinity = true
	router := NewRouter("m", t0)
	r := testRouter{Router: router}
	r.reload(cfg, servers(n))
	for _, rep := range r.Replicas() {
		r.SetLoad(rep.ID, Load{Known: true})
	}
	return r
}

// reload applies a new config as a reload does: a new view, applied.
func (r *testRouter) reload(cfg Config, replicas []Replica) {
	r.View = r.Router.View(cfg, replicas)
	r.Apply(r.View)
}

func pick(t testing.TB, r testRouter, key string) Decision {
	t.Helper()
	d := r.Pick(Request{Key: key, Now: t0})
	if d.Outcome == NoReplica {
		t.Fatalf("no replica for %q", key)
	}
	return d
}

func id(d Decision) string {
	rep, _ := d.Replica()
	return rep.ID
}

func spread(r testRouter) (lo, hi int64) {
	st := r.Status()
	lo, hi = st.Replicas[0].Sessions, st.Replicas[0].Sessions
	for _, rs := range st.Replicas {
		lo, hi = min(lo, rs.Sessions), max(hi, rs.Sessions)
	}
	return lo, hi
}

func TestConversationStaysOnItsReplica(t *testing.T) {
	r := newTestRouter(3, Config{})
	first := map[string]string{}
	for turn := range 5 {
		for c := range 40 {
			key := fmt.Sprintf("conv-%d", c)
			d := pick(t, r, key)
			if turn == 0 {
				if d.Outcome != Placed {
					t.Fatalf("first turn outcome %v", d.Outcome)
				}
				first[key] = id(d)
			} else if id(d) != first[key] || d.Outcome != Sticky {
				t.Fatalf("%s turn %d went to %s (%v), pinned to %s", key, turn, id(d), d.Outcome, first[key])
			}
			d.Release()
		}
	}
	if lo, hi := spread(r); hi-lo > 1 {
		t.Fatalf("conversations per replica spread %d..%d", lo, hi)
	}
	st := r.Status()
	if st.StickyPercent != 100 || st.InFlight != 0 {
		t.Fatalf("sticky %.1f%%, in flight %d", st.StickyPercent, st.InFlight)
	}
}

func TestConcurrentPlacementIsEven(t *testing.T) {
	r := newTestRouter(8, Config{})
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range 1000 {
		wg.Go(func() {
			<-start
			// held: still in flight. Not pick: FailNow must run on the test's goroutine.
			if d := r.Pick(Request{Key: fmt.Sprintf("session-%d", g), Now: t0}); d.Outcome == NoReplica {
				t.Errorf("no replica for session %d", g)
			}
		})
	}
	close(start)
	wg.Wait()
	if lo, hi := spread(r); hi-lo > 1 {
		t.Fatalf("conversations per replica spread %d..%d", lo, hi)
	}
	st := r.Status()
	if st.InFlight != 1000 || st.Sessions != 1000 {
		t.Fatalf("in flight %d, sessions %d, want 1000", st.InFlight, st.Sessions)
	}
}

func TestSpillAboveThresholdKeepsThePin(t *testing.T) {
	r := newTestRouter(3, Config{SpillThreshold: 2})
	home := id(pick(t, r, "a")) // 1 in flight on home
	pick(t, r, "a")             // 2
	pick(t, r, "a")             // 3: in flight was 2, not above threshold
	d := pick(t, r, "a")        // in flight 3 > 2: spills
	if d.Outcome != Spilled || id(d) == home {
		t.Fatalf("got %v on %s, want a spill away from %s", d.Outcome, id(d), home)
	}
	d.Release()
	st := r.Status()
	if spilled := total(st, func(rs ReplicaStatus) uint64 { return rs.SpilledIn }); spilled != 1 {
		t.Fatalf("spilled_in total %d, want 1", spilled)
	}
	if r.Status().InFlight != 3 {
		t.Fatalf("in flight %d after release, want 3", r.Status().InFlight)
	}
}

func TestSpillStaysWhenPinIsLeastLoaded(t *testing.T) {
	r := newTestRouter(2, Config{SpillThreshold: 1})
	home := id(pick(t, r, "a"))
	pick(t, r, "a")
	for range 2 { // two scrapes in a row
		for _, rep := range r.Replicas() {
			r.SetLoad(rep.ID, Load{Known: true, Running: 30}) // home: our 2 + 28 others
		}
	}
	if d := pick(t, r, "a"); id(d) != home || d.Outcome != Sticky {
		t.Fatalf("got %v on %s; the other replica is as busy, want sticky on %s", d.Outcome, id(d), home)
	}
}

func TestAffinityOffSpreadsAndKeepsPins(t *testing.T) {
	r := newTestRouter(2, Config{})
	home := id(pick(t, r, "a")) // held in flight
	r.reload(Config{}, servers(2))
	d := pick(t, r, "a")
	if d.Outcome != Unpinned || id(d) == home {
		t.Fatalf("affinity off: %v on %s, want the idle replica", d.Outcome, id(d))
	}
	d.Release()
	r.reload(Config{Affinity: true}, servers(2))
	if d := pick(t, r, "a"); id(d) != home || d.Outcome != Sticky {
		t.Fatalf("affinity back on: %v on %s, want sticky on %s", d.Outcome, id(d), home)
	}
}

func TestUnknownLoadCountsAsFull(t *testing.T) {
	r := newTestRouter(3, Config{})
	stale := r.Replicas()[0].ID
	r.SetLoad(stale, Load{})
	for c := range 6 {
		d := pick(t, r, fmt.Sprintf("c%d", c))
		if id(d) == stale {
			t.Fatalf("conversation %d placed on the replica with unknown load", c)
		}
	}
}

func TestUnhealthyPinIsReplaced(t *testing.T) {
	r := newTestRouter(2, Config{})
	d := pick(t, r, "a")
	d.Release()
	home := id(d)
	r.SetHealthy(home, false)
	d = pick(t, r, "a")
	if d.Outcome != Replaced || id(d) == home {
		t.Fatalf("got %v on %s, want replaced away from %s", d.Outcome, id(d), home)
	}
	d.Release()
	r.SetHealthy(home, true)
	if d := pick(t, r, "a"); id(d) == home {
		t.Fatal("conversation went back to its old replica; the new pin should hold")
	}
	if replaced := total(r.Status(), func(rs ReplicaStatus) uint64 { return rs.Replaced }); replaced != 1 {
		t.Fatalf("replaced %d, want 1", replaced)
	}
}

func TestProxyUnusableUpstreamIsAvoided(t *testing.T) {
	r := newTestRouter(2, Config{})
	down := r.Replicas()[0].Address
	usable := func(addr string) bool { return addr != down }
	for c := range 4 {
		d := r.Pick(Request{Key: fmt.Sprintf("c%d", c), Now: t0, Usable: usable})
		if rep, _ := d.Replica(); rep.Address == down {
			t.Fatal("placed on an address the proxy cannot use")
		}
	}
	if d := r.Pick(Request{Key: "x", Now: t0, Usable: func(string) bool { return false }}); d.Outcome != NoReplica {
		t.Fatalf("nothing usable: got %v", d.Outcome)
	}
}

func TestSessionsExpireAndTableIsBounded(t *testing.T) {
	r := newTestRouter(2, Config{SessionTTL: time.Minute, MaxSessions: sessionShards * 2})
	for c := range sessionShards * 10 {
		pick(t, r, fmt.Sprintf("c%d", c)).Release()
	}
	st := r.Status()
	if st.Sessions > sessionShards*2 || st.Evicted == 0 {
		t.Fatalf("sessions %d (bound %d), evicted %d", st.Sessions, sessionShards*2, st.Evicted)
	}
	r.Sweep(t0.Add(2 * time.Minute))
	st = r.Status()
	if st.Sessions != 0 || st.Expired == 0 {
		t.Fatalf("after TTL: sessions %d, expired %d", st.Sessions, st.Expired)
	}
}

func TestActiveWindow(t *testing.T) {
	r := newTestRouter(2, Config{ActiveWindow: time.Minute})
	pick(t, r, "a").Release()
	pick(t, r, "b").Release()
	r.Sweep(t0.Add(30 * time.Second))
	if active := activeTotal(r); active != 2 {
		t.Fatalf("active %d, want 2", active)
	}
	r.Sweep(t0.Add(90 * time.Second))
	if active := activeTotal(r); active != 0 {
		t.Fatalf("active %d after the window, want 0", active)
	}
	d := r.Pick(Request{Key: "a", Now: t0.Add(100 * time.Second)})
	d.Release()
	if active := activeTotal(r); active != 1 || d.Outcome != Sticky {
		t.Fatalf("active %d, outcome %v after a new turn", active, d.Outcome)
	}
}

func activeTotal(r testRouter) int64 {
	return total(r.Status(), func(rs ReplicaStatus) int64 { return rs.ActiveSessions })
}

// total sums one counter over a status's replicas.
func total[T int64 | uint64](st Status, counter func(ReplicaStatus) T) (n T) {
	for _, rs := range st.Replicas {
		n += counter(rs)
	}
	return n
}

func TestReloadKeepsPinsAndCounters(t *testing.T) {
	r := newTestRouter(3, Config{})
	homes := map[string]string{}
	for c := range 9 {
		d := pick(t, r, fmt.Sprintf("c%d", c))
		d.Release()
		homes[fmt.Sprintf("c%d", c)] = id(d)
	}
	r.reload(Config{Affinity: true, SpillThreshold: 5}, servers(3))
	if n, auto := r.SpillThreshold(); n != 5 || auto {
		t.Fatalf("new view's threshold: %d auto=%v", n, auto)
	}
	for key, home := range homes {
		if d := pick(t, r, key); id(d) != home {
			t.Fatalf("%s moved from %s to %s on reload", key, home, id(d))
		}
	}
	if st := r.Status(); st.Requests != 18 || st.Sessions != 9 {
		t.Fatalf("counters after reload: requests %d sessions %d", st.Requests, st.Sessions)
	}
}

// Views of two configs live at once during a reload: each routes with its
// own settings, and one that is never applied changes nothing shared.
func TestEachViewRoutesWithItsOwnSettings(t *testing.T) {
	r := newTestRouter(2, Config{SpillThreshold: 1, MaxSessions: 2 * sessionShards})
	old := r.View
	rejected := r.Router.View(Config{Affinity: false, SpillThreshold: 9, MaxSessions: sessionShards}, servers(3))
	if n, _ := old.SpillThreshold(); n != 1 || !old.Affinity() {
		t.Fatalf("old view changed by a new one: threshold %d affinity %v", n, old.Affinity())
	}
	if d := rejected.Pick(Request{Key: "x", Now: t0}); d.Outcome != Unpinned {
		t.Fatalf("the new view routes with its own settings: got %v, want unpinned", d.Outcome)
	}
	third := servers(3)[2].ID
	r.SetLoad(third, Load{Known: true, Running: 5})
	if got := rejected.Status().Replicas[2].Load; got.Known {
		t.Fatal("a replica only an unapplied view lists took metrics")
	}
	for c := range 2 * sessionShards * 4 {
		pick(t, r, fmt.Sprintf("c%d", c)).Release()
	}
	if st := old.Status(); st.Sessions < sessionShards+1 {
		t.Fatalf("an unapplied view's max_sessions bounded the table: %d sessions", st.Sessions)
	}
}

func TestRemovedReplicaConversationsMove(t *testing.T) {
	r := newTestRouter(2, Config{})
	var onFirst string
	for c := range 4 {
		d := pick(t, r, fmt.Sprintf("c%d", c))
		d.Release()
		if id(d) == r.Replicas()[0].ID {
			onFirst = fmt.Sprintf("c%d", c)
		}
	}
	r.reload(Config{Affinity: true}, servers(2)[1:])
	d := pick(t, r, onFirst)
	if d.Outcome != Replaced || id(d) != servers(2)[1].ID {
		t.Fatalf("conversation of a removed replica: %v on %s", d.Outcome, id(d))
	}
}

func TestClientPinning(t *testing.T) {
	r := newTestRouter(3, Config{})
	want := r.Replicas()[2].ID
	d := r.Pick(Request{Key: "a", ClientReplica: want, Now: t0})
	if d.Outcome != ClientPinned || id(d) != want {
		t.Fatalf("got %v on %s", d.Outcome, id(d))
	}
	if d := r.Pick(Request{Key: "a", ClientReplica: "nope", Now: t0}); d.Outcome != Placed {
		t.Fatalf("unknown client replica: %v", d.Outcome)
	}
}

func TestUnkeyedRequestsSpreadByLoad(t *testing.T) {
	r := newTestRouter(4, Config{})
	seen := map[string]int{}
	for range 8 {
		seen[id(pick(t, r, ""))]++ // held
	}
	for rep, n := range seen {
		if n != 2 {
			t.Fatalf("replica %s got %d of 8 held unkeyed requests: %v", rep, n, seen)
		}
	}
	if st := r.Status(); st.Unkeyed != 8 || st.Sessions != 0 {
		t.Fatalf("unkeyed %d sessions %d", st.Unkeyed, st.Sessions)
	}
}

func TestAllUnhealthyFallsBackToReachable(t *testing.T) {
	r := newTestRouter(2, Config{})
	for _, rep := range r.Replicas() {
		r.SetHealthy(rep.ID, false)
	}
	if d := r.Pick(Request{Key: "a", Now: t0}); d.Outcome == NoReplica {
		t.Fatal("every replica unhealthy by metrics: requests should still be served")
	}
}

func TestHashKeyIsStableAndNonZero(t *testing.T) {
	if HashKey("abc") != HashKey("abc") || HashKey("abc") == HashKey("abd") {
		t.Fatal("hash not stable or not discriminating")
	}
	if HashKey("") == 0 {
		t.Fatal("hash of empty key is 0")
	}
}

func TestOtherClientsLoadCounts(t *testing.T) {
	r := newTestRouter(2, Config{})
	busy := r.Replicas()[0].ID
	r.SetLoad(busy, Load{Known: true, Running: 20})
	r.SetLoad(busy, Load{Known: true, Running: 20}) // a second scrape confirms it
	for c := range 4 {
		if d := pick(t, r, fmt.Sprintf("c%d", c)); id(d) == busy {
			t.Fatalf("conversation %d placed on the replica busy with 20 requests from elsewhere", c)
		}
	}
}

func TestOwnFinishedRequestsDoNotLingerInLoad(t *testing.T) {
	r := newTestRouter(2, Config{})
	first := r.Replicas()[0].ID
	var held []Decision
	for range 3 {
		held = append(held, r.Pick(Request{ClientReplica: first, Now: t0}))
	}
	r.SetLoad(first, Load{Known: true, Running: 3}) // scraped while our 3 ran
	for _, d := range held {
		d.Release()
	}
	seen := map[string]bool{}
	for range 2 {
		seen[id(pick(t, r, ""))] = true // held
	}
	if len(seen) != 2 {
		t.Fatalf("finished requests still counted as load: both went to %v", seen)
	}
}

func TestSessionTableHoldsExactlyMaxSessions(t *testing.T) {
	r := newTestRouter(2, Config{MaxSessions: 100})
	for c := range 5000 {
		pick(t, r, fmt.Sprintf("c%d", c)).Release()
	}
	if st := r.Status(); st.Sessions != 100 || st.Evicted != 4900 {
		t.Fatalf("sessions %d, evicted %d; want exactly 100 kept", st.Sessions, st.Evicted)
	}
}

func TestOneScrapeOfOtherTrafficIsNotEnough(t *testing.T) {
	r := newTestRouter(2, Config{})
	first := r.Replicas()[0].ID
	r.SetLoad(first, Load{Known: true, Running: 1}) // e.g. our own request, ended since
	seen := map[string]bool{}
	for range 2 {
		seen[id(pick(t, r, ""))] = true // held
	}
	if len(seen) != 2 {
		t.Fatalf("a single scrape's leftover counted as load: both requests went to %v", seen)
	}
}

func TestNoRoomPlacesByPromptTokensInFlight(t *testing.T) {
	r := newTestRouter(2, Config{SpillThreshold: 1})
	send := func(key string, tokens int) Decision {
		t.Helper()
		d := r.Pick(Request{Key: key, PromptTokens: tokens, Now: t0})
		if d.Outcome == NoReplica {
			t.Fatalf("no replica for %q", key)
		}
		return d
	}
	long := send("long", 12000) // held: one long prefill on its replica
	short1 := send("short1", 1000)
	short2 := send("short2", 1000)
	if id(short1) == id(long) || id(short2) == id(long) {
		t.Fatalf("short conversations on %s and %s, want both beside the long one's %s", id(short1), id(short2), id(long))
	}
	// Both replicas are at the threshold: the one with two short prompts in
	// flight starts a new prefill sooner than the one with a long prompt.
	d := send("new", 4000)
	if id(d) == id(long) {
		t.Fatalf("new conversation on %s, behind the 12,000-token prefill, want %s", id(d), id(short1))
	}
	for _, d := range []Decision{long, short1, short2, d} {
		d.Release()
	}
	for _, s := range r.View.replicas {
		if n := s.pending.Load(); n != 0 {
			t.Fatalf("%s: %d prompt tokens pending after every release", s.ID, n)
		}
	}
}

// A client may announce any Content-Length and send nothing: its prompt
// counts at most MaxPromptTokens, so the prompts in flight on a replica
// still add up (four such added up to a negative sum, and the replica
// looked emptiest).
func TestForgedBodySizeIsBounded(t *testing.T) {
	r := newTestRouter(2, Config{MaxNumSeqs: 32})
	forged := r.EstimateTokens(math.MaxInt64)
	if forged != MaxPromptTokens {
		t.Fatalf("a body of 8 EiB: %d tokens, want %d", forged, MaxPromptTokens)
	}
	if got := r.EstimateTokens(4000); got != 1000 {
		t.Errorf("4,000 bytes: %d tokens, want 1,000 at 4 bytes a token", got)
	}
	var pending int64
	for range 4 {
		d := r.Pick(Request{Key: "forged", PromptTokens: forged, Now: t0})
		pending = d.rep.pending.Load()
	}
	if pending != 4*MaxPromptTokens {
		t.Errorf("four forged prompts in flight on one replica: %d tokens pending, want %d", pending, 4*MaxPromptTokens)
	}
}

// A flood of new conversations evicts idle pins, not the pin of a
// conversation whose request is still running.
func TestFloodKeepsTheConversationsAtWork(t *testing.T) {
	r := newTestRouter(2, Config{SessionTTL: time.Hour, MaxSessions: sessionShards * 2})
	atWork := pick(t, r, "at work")
	idle := pick(t, r, "idle")
	idle.Release()
	for c := range 100_000 {
		pick(t, r, fmt.Sprintf("flood %d", c)).Release()
	}
	if d := r.Pick(Request{Key: "at work", Now: t0}); d.Outcome != Sticky || id(d) != id(atWork) {
		t.Errorf("after the flood, the conversation at work: %v on %s, want sticky on %s", d.Outcome, id(d), id(atWork))
	}
	if d := r.Pick(Request{Key: "idle", Now: t0}); d.Outcome == Sticky {
		t.Error("after the flood, the idle conversation kept its pin: the flood evicted nothing")
	}
	if st := r.Status(); st.Sessions > sessionShards*2 {
		t.Errorf("%d sessions, bound %d", st.Sessions, sessionShards*2)
	}
	atWork.Release()
}

// A request that reaches a replaced config's view after the change is
// routed by the change (affinity off here); a view made later that has not
// been applied (a config not started yet, or whose start failed) routes by
// its own settings, and re-applying the old view makes it current again.
func TestReplacedViewFollowsTheAppliedOne(t *testing.T) {
	r := newTestRouter(3, Config{})
	old := r.View
	if d := r.Pick(Request{Key: "a", Now: t0}); d.Outcome != Placed {
		t.Fatalf("first turn: %v", d.Outcome)
	}
	off := r.Router.View(Config{Affinity: false}, r.Replicas())
	if old.Current() != old || off.Current() != off {
		t.Fatal("a view made but not applied replaced the applied one")
	}
	r.Apply(off)
	if old.Current() != off {
		t.Fatal("the replaced view does not follow the applied one")
	}
	if d := old.Current().Pick(Request{Key: "a", Now: t0.Add(time.Second)}); d.Outcome != Unpinned {
		t.Errorf("after affinity went off: %v, want unpinned", d.Outcome)
	}
	r.Apply(old) // the newer config's start failed: the old one is applied again
	if old.Current() != old || off.Current() != off {
		t.Error("re-applying the old view did not give routing back to it")
	}
}
