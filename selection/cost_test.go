package selection

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// withRate is l as a scrape taken at t0+at seconds of an engine that has
// prefilled rate tokens per second of time to first token since t0.
func withRate(l Load, rate, at float64) Load {
	l.At = t0.Add(time.Duration(at * float64(time.Second)))
	l.Prefilled, l.TTFTSeconds = rate*at, at
	return l
}

// teachRate has every replica show base, and a prefill rate of rate
// tokens per second, in two scrapes.
func teachRate(r testRouter, rate float64, base Load) {
	for _, rep := range r.Replicas() {
		r.SetLoad(rep.ID, withRate(base, rate, 0))
		r.SetLoad(rep.ID, withRate(base, rate, 1))
	}
}

// teachTurns makes the turns' duration d, from requests without a
// conversation.
func teachTurns(r testRouter, d time.Duration) {
	for range 200 {
		r.Pick(Request{Now: t0}).End(t0.Add(d), loadcontrol.Reply{})
	}
}

// hold sends n requests of prompt tokens to the replica id, as a client
// that chose it would, and returns them in flight.
func hold(t *testing.T, r testRouter, id string, n, prompt int, at time.Duration) []Decision {
	t.Helper()
	var out []Decision
	for range n {
		d := r.Pick(Request{ClientReplica: id, PromptTokens: prompt, Now: t0.Add(at)})
		if d.Outcome != ClientPinned {
			t.Fatalf("holding %s: %v", id, d.Outcome)
		}
		out = append(out, d)
	}
	return out
}

func releaseAll(ds []Decision) {
	for _, d := range ds {
		d.Release()
	}
}

// other is the replica of a two-replica router that is not id.
func other(r testRouter, id string) string {
	if reps := r.Replicas(); reps[0].ID != id {
		return reps[0].ID
	}
	return r.Replicas()[1].ID
}

// The prefill rate is the most prompt tokens prefilled per second of time
// to first token seen in an interval between two scrapes: queueing only
// makes an interval's lower. Counters that went back teach nothing.
func TestPrefillRateIsTheBestSeen(t *testing.T) {
	r := newTestRouter(1, Config{})
	rep := r.Replicas()[0].ID
	if st := r.Status(); st.PrefillRate != 0 {
		t.Fatalf("before any scrape: rate %g", st.PrefillRate)
	}
	scrape := func(at, prefilled, ttft float64) {
		r.SetLoad(rep, Load{Known: true, At: t0.Add(time.Duration(at * float64(time.Second))), Prefilled: prefilled, TTFTSeconds: ttft})
	}
	scrape(0, 0, 0)
	scrape(1, 5000, 2)  // 2,500 a second: two requests queued behind each other
	scrape(2, 11000, 3) // 6,000
	scrape(3, 12000, 4) // 1,000
	if got := r.Status().PrefillRate; math.Abs(got-6000) > 30 {
		t.Fatalf("rate %g, want the best interval's 6,000 (slowly forgotten)", got)
	}
	scrape(4, 100, 0) // restarted: the interval teaches nothing
	scrape(5, 600, 0.1)
	if got := r.Status().PrefillRate; math.Abs(got-6000) > 30 {
		t.Fatalf("rate %g after a restart, want 6,000 still", got)
	}
}

// The backlog grows by each request's uncached part, drains at the
// prefill rate, is never more than its requests in flight had to compute,
// and is empty once they have all ended.
func TestBacklogDrainsAndEndsWithItsRequests(t *testing.T) {
	var b backlog
	ns := func(s float64) int64 { return int64(s * 1e9) }
	b.add(10000, ns(0), 5000)
	b.add(5000, ns(1), 5000)
	if got := b.at(ns(1), 5000); got != 10000 {
		t.Fatalf("after 1 s: %g, want 10,000", got)
	}
	if got := b.at(ns(2), 5000); got != 5000 {
		t.Fatalf("after 2 s: %g, want 5,000", got)
	}
	b.done(10000)
	if got := b.at(ns(1), 5000); got != 5000 {
		t.Fatalf("one request ended: %g, want at most its 5,000 left", got)
	}
	b.done(5000)
	if got := b.at(ns(1), 0); got != 0 {
		t.Fatalf("all ended: %g, want 0", got)
	}
}

// A conversation stays on its pin while the pin would start its turn as
// soon as the other replica once what moving recomputes is counted: three
// times where the other replica serves a conversation of its own and runs
// a request (the turn's own prefill, the turns queued behind it, the cache
// it evicts there), once where it is idle and serves none.
func TestConversationStaysWhileItsPinHasRoom(t *testing.T) {
	for _, otherServes := range []bool{true, false} {
		r := newTestRouter(2, Config{MaxNumSeqs: 32})
		teachRate(r, 5000, kvLoad(1000))
		teachTurns(r, 30*time.Second)
		home := id(turn(t, r, "a", 0))
		var busy []Decision
		if otherServes {
			busy = occupy(t, r, other(r, home), "b")
		}
		// 3 s of prefill queued on the pin; moving recomputes 2 s.
		busy = append(busy, hold(t, r, home, 2, 10000, time.Second)...)
		d := turn(t, r, "a", 2*time.Second)
		releaseAll(busy)
		switch {
		case otherServes && (d.Outcome != Sticky || id(d) != home):
			t.Errorf("pin with room: %v on %s, want sticky on %s", d.Outcome, id(d), home)
		case !otherServes && (d.Outcome != Spilled || id(d) == home):
			t.Errorf("other replica idle: %v on %s, want spilled off %s", d.Outcome, id(d), home)
		}
	}
}

// occupy places conv on the replica id, which must be where a new
// conversation goes, and keeps a small request in flight there.
func occupy(t *testing.T, r testRouter, id, conv string) []Decision {
	t.Helper()
	if got := turn(t, r, conv, 0); got.rep.ID != id {
		t.Fatalf("%s placed on %s, want %s", conv, got.rep.ID, id)
	}
	return hold(t, r, id, 1, 100, 0)
}

// A turn whose pin's KV cache is full with turns that last long moves
// where it starts at once, and the conversation stays there; with turns
// that end sooner, the wait is shorter than what moving recomputes, and it
// stays.
func TestTurnMovesOffAFullPinWhenTheWaitOutweighsTheRecompute(t *testing.T) {
	for _, c := range []struct {
		turns time.Duration
		moves bool
	}{{30 * time.Second, true}, {5 * time.Second, false}} {
		r := newTestRouter(2, Config{MaxNumSeqs: 32})
		teachRate(r, 5000, kvLoad(1000))
		teachTurns(r, c.turns)
		home := id(turn(t, r, "a", 0))
		// 33,000 of 40,000 tokens, their prefill done by the turn: a's
		// 10,000 do not fit beside them.
		busy := hold(t, r, home, 3, 11000, time.Second)
		d := r.Pick(Request{Key: "a", PromptTokens: 10000, Now: t0.Add(11 * time.Second)})
		d.Release()
		releaseAll(busy)
		if !c.moves {
			if d.Outcome != Sticky || id(d) != home {
				t.Errorf("turns of %v: %v on %s, want sticky on %s", c.turns, d.Outcome, id(d), home)
			}
			continue
		}
		if d.Outcome != Spilled || id(d) != other(r, home) {
			t.Fatalf("turns of %v: %v on %s, want spilled to %s", c.turns, d.Outcome, id(d), other(r, home))
		}
		if next := turn(t, r, "a", 12*time.Second); next.Outcome != Sticky || id(next) != id(d) {
			t.Errorf("next turn: %v on %s, want sticky on %s, where it moved", next.Outcome, id(next), id(d))
		}
	}
}

// A conversation whose pin has evicted its cache computes its prompt
// wherever it goes: it moves to a replica that starts it sooner, and stays
// on a pin no busier than the others (ties stay).
func TestEvictedConversationMovesOnlyToAShorterQueue(t *testing.T) {
	for _, queued := range []bool{true, false} {
		r := newTestRouter(2, Config{MaxNumSeqs: 32})
		teachRate(r, 5000, kvLoad(1000))
		teachTurns(r, 10*time.Second)
		home := id(turn(t, r, "a", 0))
		r.SetLoad(home, withRate(kvLoad(1000+100000), 5000, 2)) // evicted
		var busy []Decision
		if queued {
			busy = hold(t, r, home, 1, 20000, 3*time.Second) // 4 s of prefill ahead
		}
		d := turn(t, r, "a", 3*time.Second)
		releaseAll(busy)
		switch {
		case queued && (d.Outcome != Rehomed || id(d) == home):
			t.Errorf("prefill queued on its pin: %v on %s, want rehomed off %s", d.Outcome, id(d), home)
		case !queued && (d.Outcome != Sticky || id(d) != home):
			t.Errorf("nothing queued: %v on %s, want sticky on %s", d.Outcome, id(d), home)
		}
	}
}

// Until the replicas' counters have shown the prefill rate, nothing moves
// for load.
func TestNoPrefillRateNoMoves(t *testing.T) {
	r := newTestRouter(2, Config{MaxNumSeqs: 32})
	for _, rep := range r.Replicas() {
		r.SetLoad(rep.ID, kvLoad(1000))
	}
	teachTurns(r, time.Minute)
	home := id(turn(t, r, "a", 0))
	busy := hold(t, r, home, 4, 10000, time.Second)
	defer releaseAll(busy)
	if d := turn(t, r, "a", 2*time.Second); d.Outcome != Sticky || id(d) != home {
		t.Fatalf("%v on %s, want sticky on %s", d.Outcome, id(d), home)
	}
}

// Over a manual spill threshold a conversation moves to the replica that
// would start its turn soonest among those under it, whatever the gain.
func TestManualThresholdCapsThePin(t *testing.T) {
	r := newTestRouter(3, Config{SpillThreshold: 2})
	home := id(pick(t, r, "a"))
	busy := hold(t, r, home, 2, 1000, 0) // 3 in flight on the pin
	defer releaseAll(busy)
	d := pick(t, r, "a")
	d.Release()
	if d.Outcome != Spilled || id(d) == home {
		t.Fatalf("over the threshold: %v on %s, want spilled off %s", d.Outcome, id(d), home)
	}
	if next := pick(t, r, "a"); next.Outcome != Sticky || id(next) != id(d) {
		t.Fatalf("next turn: %v on %s, want sticky on %s", next.Outcome, id(next), id(d))
	}
}

// Among replicas as loaded as each other, a new conversation goes where
// its first turn starts soonest: not behind another's long prefill.
func TestNewConversationStartsWhereItStartsSoonest(t *testing.T) {
	r := newTestRouter(2, Config{MaxNumSeqs: 32})
	teachRate(r, 5000, kvLoad(1000))
	reps := r.Replicas()
	long := hold(t, r, reps[0].ID, 1, 30000, 0)
	short := hold(t, r, reps[1].ID, 1, 1000, 0)
	defer releaseAll(append(long, short...))
	if d := turn(t, r, "new", time.Second); d.Outcome != Placed || id(d) != reps[1].ID {
		t.Fatalf("%v on %s, want placed on %s, whose prefill ends first", d.Outcome, id(d), reps[1].ID)
	}
}

// Unless configured, a conversation counts as active while it has been
// silent less than three of the conversations' usual gaps between turns.
func TestActiveWindowFollowsTheGapsBetweenTurns(t *testing.T) {
	r := newTestRouter(1, Config{})
	// A title request a second before its turn, then a few turns: too
	// few gaps to shorten the window.
	turn(t, r, "a", 0)
	for i := 1; i < minGaps; i++ {
		turn(t, r, "a", time.Duration(i)*time.Second)
	}
	if w := r.activeWindow(); w != DefaultActiveWindow {
		t.Fatalf("after %d gaps of 1 s: active window %v, want the default %v", minGaps-1, w, DefaultActiveWindow)
	}
	r = newTestRouter(1, Config{})
	for i := range 100 {
		turn(t, r, "a", time.Duration(i)*5*time.Second)
	}
	if w := r.activeWindow(); w < 14*time.Second || w > 16*time.Second {
		t.Fatalf("active window %v, want 3 gaps of 5 s", w)
	}
	last := 99 * 5 * time.Second
	r.Sweep(t0.Add(last + 10*time.Second))
	if n := r.Status().Replicas[0].ActiveSessions; n != 1 {
		t.Fatalf("10 s after its turn: %d active, want 1", n)
	}
	r.Sweep(t0.Add(last + 20*time.Second))
	if n := r.Status().Replicas[0].ActiveSessions; n != 0 {
		t.Fatalf("20 s after its turn: %d active, want 0", n)
	}
	configured := newTestRouter(1, Config{ActiveWindow: time.Hour})
	if w := configured.activeWindow(); w != time.Hour {
		t.Fatalf("configured: %v", w)
	}
}

// A count_tokens request goes to its conversation's replica but is no
// turn: it neither places nor moves the conversation, nor counts as
// prefill or as a turn's duration.
func TestCountOnlyRequestIsNoTurn(t *testing.T) {
	r := newTestRouter(2, Config{})
	teachRate(r, 5000, kvLoad(1000))
	first := r.Pick(Request{Key: "a", PromptTokens: 10000, Now: t0})
	first.End(t0.Add(time.Second), loadcontrol.Reply{})
	home := id(first)
	r.SetLoad(home, kvLoad(1000+36000+5000)) // 5,000 of a's 10,000 evicted
	count := func(key string) Decision {
		return r.Pick(Request{Key: key, PromptTokens: 30000, CountOnly: true, Now: t0.Add(time.Second)})
	}
	d := count("a")
	if d.Outcome != Sticky || id(d) != home {
		t.Fatalf("count of a: %v on %s, want %s", d.Outcome, id(d), home)
	}
	if got := r.byID[home].backlog.at(t0.Add(time.Second).UnixNano(), 0); got != 0 {
		t.Errorf("backlog %g after a count, want 0", got)
	}
	d.End(t0.Add(time.Hour), loadcontrol.Reply{})
	if got := r.Status().TurnSeconds; got != 1 {
		t.Errorf("turn duration %g s after a count of an hour, want the turn's 1 s", got)
	}
	if got := cachedNow(r, "a"); got != 5000 {
		t.Errorf("a's cache %d after a count, want the 5,000 the writes left", got)
	}
	if d := count("new"); d.Outcome != Unpinned {
		t.Fatalf("count of an unknown conversation: %v, want unpinned", d.Outcome)
	}
	if r.knows(HashKey("new")) {
		t.Error("a count pinned its conversation")
	}
}

// A conversation restored from a snapshot (the proxy restarted, not the
// replica) counts its last prompt as cached at its pin: a short queue
// there does not move it. Restored without its prompt's size, the same
// queue moves it, as nothing tells its pin from another.
func TestRestoredConversationKeepsItsCache(t *testing.T) {
	for _, kept := range []bool{true, false} {
		before := newTestRouter(2, Config{MaxNumSeqs: 32})
		home := id(turn(t, before, "a", 0))
		pins := before.Snapshot()
		if !kept {
			for i := range pins {
				pins[i].Prompt = 0
			}
		}
		r := newTestRouter(2, Config{MaxNumSeqs: 32, SessionTTL: time.Hour})
		if st := r.Restore(pins, t0.Add(time.Second)); st.Restored != 1 {
			t.Fatalf("restored %+v", st)
		}
		teachRate(r, 5000, kvLoad(1000))
		teachTurns(r, 10*time.Second)
		busy := hold(t, r, home, 1, 5000, 2*time.Second) // 1 s of prefill ahead
		d := r.Pick(Request{Key: "a", PromptTokens: 10500, Now: t0.Add(2 * time.Second)})
		d.Release()
		releaseAll(busy)
		switch {
		case kept && (d.Outcome != Sticky || id(d) != home):
			t.Errorf("restored with its prompt: %v on %s, want sticky on %s", d.Outcome, id(d), home)
		case !kept && id(d) == home:
			t.Errorf("restored without its prompt: %v on %s, want moved off it", d.Outcome, id(d))
		}
	}
}

// Among replicas where its first turn would start as soon, a new
// conversation goes to the least loaded: beside a silent conversation
// rather than beside one whose request runs, with whom it would share every
// step.
func TestNewConversationGoesBesideASilentOneRatherThanARunningOne(t *testing.T) {
	for i := range 8 {
		r := newTestRouter(2, Config{MaxNumSeqs: 32})
		teachRate(r, 5000, kvLoad(1000))
		silent := turn(t, r, "silent", 0)
		running := r.Pick(Request{Key: "running", PromptTokens: 10000, Now: t0})
		if id(running) == id(silent) {
			t.Fatalf("both conversations on %s", id(silent))
		}
		conv := fmt.Sprintf("new-%d", i)
		d := turn(t, r, conv, 10*time.Second)
		running.Release()
		if d.Outcome != Placed || id(d) != id(silent) {
			t.Fatalf("%s: %v on %s, want placed on %s beside the silent conversation, not beside the running one", conv, d.Outcome, id(d), id(silent))
		}
	}
}

// A new conversation goes where fewer conversations are active, however
// full the KV cache is there: the fill is the context of the requests
// running at that instant, not what the replica will hold.
func TestNewConversationIgnoresTheCacheFill(t *testing.T) {
	r := newTestRouter(2, Config{MaxNumSeqs: 32})
	teachRate(r, 5000, kvLoad(1000))
	home := id(turn(t, r, "old", 0))
	other := r.Replicas()[0].ID
	if other == home {
		other = r.Replicas()[1].ID
	}
	full := kvLoad(1000)
	full.KVUsage = 0.9
	r.SetLoad(other, withRate(full, 5000, 2))
	if d := turn(t, r, "new", time.Second); d.Outcome != Placed || id(d) != other {
		t.Fatalf("%v on %s, want placed on %s, where no conversation is active", d.Outcome, id(d), other)
	}
}
