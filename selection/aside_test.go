package selection

import (
	"fmt"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// asideRouter is admissionRouter (two replicas of 100 tokens, linger 10 s)
// with other settings, and a clock.
type asideRouter struct {
	testRouter
	now time.Time
}

func newAsideRouter(cfg loadcontrol.Config) *asideRouter {
	cfg.Enabled, cfg.CapacityTokens, cfg.Fill, cfg.Linger = true, 100, 1, 10*time.Second
	return &asideRouter{testRouter: holding(newTestRouter(2, Config{Admission: cfg})), now: t0}
}

// holding engages r's load control as many turns that lacked room would
// (aside.go), for the tests of how it holds turns.
func holding(r testRouter) testRouter {
	r.gate.Engage()
	return r
}

func (r *asideRouter) admit(key string, tokens int) *loadcontrol.Ticket {
	return r.admitKey(HashKey(key), loadcontrol.Body{Bytes: int64(tokens * BytesPerToken)}, nil, r.now, nil)
}

func (r *asideRouter) lc() loadcontrol.Status { return r.Status().Admission }

// stepAside sends rounds of turns of four conversations of 40 tokens,
// filling both replicas while a fifth waits, then leaves; each pauses 11 s,
// past linger, before its next turn, until load control steps aside.
func (r *asideRouter) stepAside(t *testing.T) {
	t.Helper()
	for round := 0; !r.lc().SteppedAside; round++ {
		if round == 10 {
			t.Fatalf("not stepped aside after 10 rounds of late returns: %+v", r.lc())
		}
		for i := range 4 {
			tk := r.admit(fmt.Sprintf("late-%d", i), 40)
			mustState(t, tk, loadcontrol.Admitted)
			tk.Done(r.now)
		}
		if r.lc().SteppedAside {
			return
		}
		waits := r.admit(fmt.Sprintf("r%d-waits", round), 40)
		mustState(t, waits, loadcontrol.Waiting)
		waits.Cancel(r.now)
		r.now = r.now.Add(11 * time.Second)
		r.Sweep(r.now)
	}
}

// Load control steps aside while most idle residents expire instead of
// coming back within linger, admitting every turn at once, and takes over
// again once conversations come back in time.
func TestAdmissionStepsAsideWhileConversationsComeBackLate(t *testing.T) {
	r := newAsideRouter(loadcontrol.Config{})
	r.stepAside(t)
	var running []*loadcontrol.Ticket
	for i := range 6 { // 240 tokens on 200: all admitted at once
		tk := r.admit(fmt.Sprintf("aside-%d", i), 40)
		mustState(t, tk, loadcontrol.Admitted)
		running = append(running, tk)
	}
	// The same six come back 2 s after each turn, within linger, until
	// load control holds turns again.
	for turn := 0; r.lc().SteppedAside; turn++ {
		if turn == 20 {
			t.Fatalf("still aside after 20 turns that came back in time: %+v", r.lc())
		}
		for _, tk := range running {
			tk.Done(r.now)
		}
		r.now = r.now.Add(2 * time.Second)
		for i := range running {
			running[i] = r.admit(fmt.Sprintf("aside-%d", i), 40)
		}
	}
	if share := r.lc().LateShare; share >= 0.35 { // holdAgainBelow
		t.Errorf("held again at a late share of %.2f, want below 0.35", share)
	}
	mustState(t, r.admit("newcomer", 40), loadcontrol.Waiting)
}

// Only an idle resident's next turn is a return: another turn of a
// conversation whose turn is running says nothing of its pauses.
func TestAdmissionCountsOnlyIdleResidentsReturns(t *testing.T) {
	r := newAsideRouter(loadcontrol.Config{})
	r.stepAside(t)
	share := r.lc().LateShare
	first := r.admit("busy", 40)
	for range 20 {
		r.admit("busy", 40)
	}
	first.Done(r.now)
	if got := r.lc().LateShare; got != share || !r.lc().SteppedAside {
		t.Errorf("late share %.3f after turns of a running conversation, want %.3f, still aside", got, share)
	}
}

// An expiry seen long after it was due, as when load control is turned
// off and on again by reloads, does not make its conversation's return
// late.
func TestAdmissionIgnoresExpiriesSeenLate(t *testing.T) {
	r := newAsideRouter(loadcontrol.Config{})
	for i := range 20 {
		r.admit(fmt.Sprintf("c%d", i), 5).Done(r.now)
	}
	r.now = r.now.Add(time.Hour)
	r.Sweep(r.now)
	for i := range 20 {
		r.admit(fmt.Sprintf("c%d", i), 5).Done(r.now)
	}
	if st := r.lc(); st.LateShare != 0 || st.SteppedAside {
		t.Errorf("%+v after returns from expiries seen an hour late, want late share 0", st)
	}
}

// A late return counts once: the conversation's next return, after its
// task ended, is neither in time nor late.
func TestAdmissionLateReturnCountsOnce(t *testing.T) {
	r := newAsideRouter(loadcontrol.Config{})
	r.admit("a", 40).Done(r.now)
	r.now = r.now.Add(11 * time.Second)
	r.Sweep(r.now)
	r.admit("a", 40).End(r.now, loadcontrol.Reply{PromptTokens: 40, TaskEnded: true})
	late := r.lc().LateShare
	if late == 0 {
		t.Fatal("a return after the residency expired did not count late")
	}
	r.now = r.now.Add(time.Second)
	r.admit("a", 40).Done(r.now)
	if got := r.lc().LateShare; got != late {
		t.Errorf("late share %.3f after a return following a task end, want %.3f", got, late)
	}
}

// Conversations that stop (a batch of agents ends) leave residencies that
// expire and never come back: they say nothing of pauses, and load control
// keeps holding turns for the next batch. A return long after the expiry
// is not a late one either, and however many conversations expire, the
// expiries remembered stay bounded.
func TestAdmissionAbandonedConversationsAreNotLate(t *testing.T) {
	r := newAsideRouter(loadcontrol.Config{})
	for batch := range 10 {
		for i := range 4 {
			r.admit(fmt.Sprintf("b%d-%d", batch, i), 40).Done(r.now)
		}
		r.now = r.now.Add(11 * time.Second)
		r.Sweep(r.now)
	}
	if st := r.lc(); st.LateShare != 0 || st.SteppedAside {
		t.Fatalf("%+v after 10 batches of conversations that never came back, want late share 0", st)
	}
	r.now = r.now.Add(r.View.MaxWait() + time.Second) // past lateReturnWithin (5 min), as MaxWait is
	for i := range 4 {
		r.admit(fmt.Sprintf("b9-%d", i), 40).Done(r.now)
	}
	if share := r.lc().LateShare; share != 0 {
		t.Errorf("late share %.3f after returns %v past their expiry, want 0", share, r.View.MaxWait())
	}

}

// While aside, a replica filling from empty is not staggered, and a
// conversation whose pin evicted its cache moves where its turn starts
// sooner, as without load control, its residency following it to its new
// replica.
func TestAdmissionAsideNeitherStaggersNorKeepsColdPins(t *testing.T) {
	r := newAsideRouter(loadcontrol.Config{})
	teachRate(r.testRouter, 5000, kvLoad(1000))
	r.stepAside(t)
	staggered := r.cfg
	staggered.Admission.Stagger = time.Minute
	r.reload(staggered, servers(2))
	r.now = r.now.Add(time.Minute) // every resident gone, nothing staggered yet
	r.Sweep(r.now)
	a := r.admit("a", 40)
	mustState(t, a, loadcontrol.Admitted)
	mustState(t, r.admit("b", 40), loadcontrol.Admitted) // staggered when held: 1 minute
	mustState(t, r.admit("c", 40), loadcontrol.Admitted)
	d := r.Pick(Request{Key: "a", PromptTokens: 10000, Now: r.now})
	home := id(d)
	d.Release()
	a.Done(r.now)
	r.SetLoad(home, kvLoad(1000+200000)) // its pin has written far past its room
	busy := hold(t, r.testRouter, home, 1, 20000, r.now.Sub(t0))
	defer releaseAll(busy)
	r.now = r.now.Add(time.Second)
	again := r.admit("a", 40)
	mustState(t, again, loadcontrol.Admitted)
	before := residentsOn(r.testRouter)
	moved := r.Pick(Request{Key: "a", PromptTokens: 10000, Now: r.now})
	defer moved.Release()
	if moved.Outcome != Rehomed || id(moved) == home {
		t.Fatalf("cold while aside: %v on %s, want rehomed off %s", moved.Outcome, id(moved), home)
	}
	if after := residentsOn(r.testRouter); after[id(moved)] != before[id(moved)]+1 || after[home] != before[home]-1 {
		t.Errorf("residents %v, then %v once a moved: want its residency on %s with its pin", before, after, id(moved))
	}
}

// A reload that turns load control off ends its stepping aside too: the
// admin status says it holds nothing and steps aside from nothing.
func TestAdmissionOffIsNotSteppedAside(t *testing.T) {
	r := newAsideRouter(loadcontrol.Config{})
	r.stepAside(t)
	off := r.cfg
	off.Admission.Enabled = false
	r.reload(off, servers(2))
	if st := r.lc(); st.SteppedAside {
		t.Errorf("%+v with load control off, want not stepped aside", st)
	}
}

// A resident whose pin moves while load control holds turns (its replica
// down) is counted on its new replica as a newcomer there, and leaves its
// old one as any resident leaving does, for stagger's sake.
func TestAdmissionResidencyFollowsAMovedPin(t *testing.T) {
	r := newAsideRouter(loadcontrol.Config{Stagger: time.Minute, Quantum: -1})
	a := r.admit("a", 10)
	mustState(t, a, loadcontrol.Admitted)
	x := r.admit("x", 10)
	mustState(t, x, loadcontrol.Admitted)
	home, other := id(r.Pick(Request{Key: "a", Now: r.now})), id(r.Pick(Request{Key: "x", Now: r.now}))
	if home == other {
		t.Fatalf("a and x on one replica, %s", home)
	}
	r.now = r.now.Add(61 * time.Second) // a's replica may take its next newcomer
	c := r.admitKey(HashKey("c"), loadcontrol.Body{Bytes: 10 * BytesPerToken}, func(id string) bool { return id == home }, r.now, nil)
	mustState(t, c, loadcontrol.Admitted)
	if pin := id(r.Pick(Request{Key: "c", Now: r.now})); pin != home {
		t.Fatalf("c on %s, want %s", pin, home)
	}
	r.now = r.now.Add(time.Second)
	r.SetHealthy(home, false)
	before := residentsOn(r.testRouter)
	moved := r.Pick(Request{Key: "a", Now: r.now})
	if moved.Outcome != Replaced || id(moved) != other {
		t.Fatalf("a with its replica down: %v on %s, want replaced on %s", moved.Outcome, id(moved), other)
	}
	for _, rs := range r.Status().Replicas {
		switch rs.ID {
		case other:
			if want := r.now.Add(time.Minute); !rs.NextNewcomer.Equal(want) {
				t.Errorf("%s took a as a newcomer: next newcomer %v, want %v", rs.ID, rs.NextNewcomer, want)
			}
		case home:
			if !rs.NextNewcomer.IsZero() {
				t.Errorf("%s: a resident left, yet still staggered until %v", rs.ID, rs.NextNewcomer)
			}
		}
	}
	if after := residentsOn(r.testRouter); after[other] != before[other]+1 || after[home] != before[home]-1 {
		t.Errorf("residents %v, then %v once a moved: want its residency on %s", before, after, other)
	}
}

// residentsOn is how many conversations load control holds on each
// replica, by ID.
func residentsOn(r testRouter) map[string]int {
	out := map[string]int{}
	for _, rs := range r.Status().Replicas {
		out[rs.ID] = rs.Residents
	}
	return out
}

// farmRouter is n replicas of 1000 tokens with the farm preset's pacing
// (stagger, touch, no quantum), not yet engaged.
func farmRouter(n int) testRouter {
	return newTestRouter(n, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 1000, Fill: 1, MinResidents: 1, Linger: 10 * time.Second,
		Quantum: -1, Stagger: 15 * time.Second, Touch: true,
	}})
}

// While every conversation finds room, load control stands aside: it
// neither holds a turn nor paces new conversations (stagger, touch), and
// the replicas' residents are tracked meanwhile.
func TestAdmissionStandsAsideWhileEverythingFits(t *testing.T) {
	r := farmRouter(2)
	var tickets []*loadcontrol.Ticket
	for i := range 8 { // 8 × 200 tokens on 2 × 1000
		tk := r.admitKey(HashKey(fmt.Sprintf("c%d", i)), loadcontrol.Body{Bytes: 200 * BytesPerToken}, nil, t0, nil)
		mustState(t, tk, loadcontrol.Admitted)
		tickets = append(tickets, tk)
	}
	tickets[0].End(t0.Add(time.Second), loadcontrol.Reply{TaskEnded: true}) // a departure: touch would wait for the idle
	mustState(t, r.admitKey(HashKey("c8"), loadcontrol.Body{Bytes: 200 * BytesPerToken}, nil, t0.Add(time.Second), nil), loadcontrol.Admitted)
	st := r.Status()
	if !st.Admission.SteppedAside || st.Admission.Queued != 0 {
		t.Errorf("%+v, want stepped aside, none queued", st.Admission)
	}
	held := 0
	for _, rep := range st.Replicas {
		held += rep.Residents
		if !rep.NextNewcomer.IsZero() {
			t.Errorf("replica %s paced until %v while everything fits", rep.ID, rep.NextNewcomer)
		}
	}
	if held != 8 {
		t.Errorf("%d residents tracked, want 8", held)
	}
}

// The first turn that would find room on no replica engages load control:
// it waits, and from then on the replicas are paced; once the turns
// arriving without residency find room again, load control stands aside.
func TestAdmissionEngagesWhileTurnsLackRoom(t *testing.T) {
	r := farmRouter(2)
	now := t0
	admit := func(key string, tokens int) *loadcontrol.Ticket {
		return r.admitKey(HashKey(key), loadcontrol.Body{Bytes: int64(tokens * BytesPerToken)}, nil, now, nil)
	}
	var first []*loadcontrol.Ticket
	for i := range 4 {
		tk := admit(fmt.Sprintf("c%d", i), 500)
		mustState(t, tk, loadcontrol.Admitted)
		first = append(first, tk)
	}
	waits := admit("over", 500)
	mustState(t, waits, loadcontrol.Waiting)
	if st := r.Status(); st.Admission.SteppedAside || st.Replicas[0].NextNewcomer.IsZero() && st.Replicas[1].NextNewcomer.IsZero() {
		t.Fatalf("%+v after a turn lacked room, want engaged and paced", st)
	}
	waits.Cancel(now)
	// The four end their tasks; small conversations come and go, finding
	// room, until load control stands aside again.
	now = now.Add(time.Second)
	for _, tk := range first {
		tk.End(now, loadcontrol.Reply{TaskEnded: true})
	}
	for i := 0; !r.Status().Admission.SteppedAside; i++ {
		if i == 20 {
			t.Fatalf("still engaged after 20 turns that found room: %+v", r.Status().Admission)
		}
		now = now.Add(time.Minute) // past stagger and linger
		tk := admit(fmt.Sprintf("small-%d", i), 100)
		mustState(t, tk, loadcontrol.Admitted)
		tk.End(now, loadcontrol.Reply{TaskEnded: true})
	}
}

// Conversations let in while load control stood aside grow together: the
// reply that takes their replica past its share engages load control, and
// the conversation whose replica they then overflow yields at the end of
// its turn; one admitted while it held turns stays, as
// TestAdmissionUnderestimatedOverflowYields shows.
func TestAdmissionEngagesWhenResidentsOutgrowTheirShare(t *testing.T) {
	r := farmRouter(1)
	// A reply teaches the bytes per token: the turns below are not sized
	// on assumed ones, which would make an underestimate yield.
	r.admitKey(HashKey("teaches"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil).End(t0, loadcontrol.Reply{PromptTokens: 100, TaskEnded: true})
	var tickets []*loadcontrol.Ticket
	for i := range 2 { // two of 400 tokens on a replica of 1000
		tk := r.admitKey(HashKey(fmt.Sprintf("c%d", i)), loadcontrol.Body{Bytes: 400 * BytesPerToken}, nil, t0, nil)
		mustState(t, tk, loadcontrol.Admitted)
		tickets = append(tickets, tk)
	}
	tickets[0].End(t0.Add(time.Second), loadcontrol.Reply{PromptTokens: 500}) // 900: within the cache
	if st := r.Status().Admission; !st.SteppedAside {
		t.Fatalf("%+v with every replica within its share, want stepped aside", st)
	}
	tickets[1].End(t0.Add(time.Second), loadcontrol.Reply{PromptTokens: 700}) // 1,200: over
	st := r.Status()
	if st.Admission.SteppedAside {
		t.Fatalf("%+v once a replica's residents outgrew it, want engaged", st.Admission)
	}
	residents := 0
	for _, rep := range st.Replicas {
		residents += rep.Residents
	}
	if residents != 1 {
		t.Errorf("%d residents, want 1: the one whose reply overflowed its replica yields", residents)
	}
	mustState(t, r.admitKey(HashKey("c1"), loadcontrol.Body{Bytes: 700 * BytesPerToken}, nil, t0.Add(2*time.Second), nil), loadcontrol.Waiting)
}

// Standing aside, load control leaves a new conversation's placement to the
// routing, as without it: the conversation is placed by its first Pick,
// wherever that is, and its residency follows it there.
func TestAdmissionAsideLeavesPlacementToTheRouting(t *testing.T) {
	r := farmRouter(2)
	for _, rep := range r.Replicas() {
		key := "to-" + rep.ID
		mustState(t, r.admitKey(HashKey(key), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil), loadcontrol.Admitted)
		d := r.Pick(Request{Key: key, PromptTokens: 100, Now: t0, Usable: func(id string) bool { return id == rep.ID }})
		d.Release()
		if d.Outcome != Placed || id(d) != rep.ID {
			t.Errorf("%s: %v on %s, want placed there by its first Pick", key, d.Outcome, id(d))
		}
		if on := residentsOn(r); on[rep.ID] != 1 {
			t.Errorf("%s: residents by replica %v, want its residency on %s with its pin", key, on, rep.ID)
		}
	}
}

// While load control holds turns and none waits for room, a resident's
// turn moves by its expected cost as without load control, its residency
// following it; while a turn waits, the resident stays where its cache is,
// as a move would take the room the waiting turn is owed.
func TestResidentMovesByCostOnlyWhileNoTurnWaits(t *testing.T) {
	for _, waiting := range []bool{false, true} {
		r := newAsideRouter(loadcontrol.Config{})
		teachRate(r.testRouter, 5000, kvLoad(1000))
		teachTurns(r.testRouter, 30*time.Second)
		a := r.admit("a", 40)
		mustState(t, a, loadcontrol.Admitted)
		first := r.Pick(Request{Key: "a", PromptTokens: 10000, Now: r.now})
		home := id(first)
		first.Release()
		a.Done(r.now)
		if waiting { // three more conversations fill both replicas, a fifth waits
			for i := range 3 {
				mustState(t, r.admit(fmt.Sprintf("b%d", i), 40), loadcontrol.Admitted)
			}
			w := r.admit("waits", 40)
			mustState(t, w, loadcontrol.Waiting)
			defer w.Cancel(r.now)
		}
		busy := hold(t, r.testRouter, home, 1, 40000, 0) // 8 s of prefill queued on a's pin
		r.now = r.now.Add(time.Second)
		mustState(t, r.admit("a", 40), loadcontrol.Admitted)
		before := residentsOn(r.testRouter)
		d := r.Pick(Request{Key: "a", PromptTokens: 10000, Now: r.now})
		d.Release()
		releaseAll(busy)
		after := residentsOn(r.testRouter)
		switch {
		case waiting && (d.Outcome != Sticky || id(d) != home):
			t.Errorf("a turn waiting: %v on %s, want sticky on %s", d.Outcome, id(d), home)
		case !waiting && (d.Outcome != Spilled || id(d) == home):
			t.Errorf("no turn waiting: %v on %s, want spilled off %s", d.Outcome, id(d), home)
		case !waiting && (after[id(d)] != before[id(d)]+1 || after[home] != before[home]-1):
			t.Errorf("residents %v, then %v once a moved: want its residency on %s", before, after, id(d))
		}
	}
}
