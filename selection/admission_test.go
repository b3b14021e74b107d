package selection

import (
	"fmt"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// admissionRouter has two replicas whose caches each hold 100 tokens, a
// replica takes a second conversation only if it fits, and a conversation
// lingers 10s after its turn.
func admissionRouter(maxQueue int) testRouter {
	return holding(newTestRouter(2, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 100, Fill: 1, MinResidents: 1, Linger: 10 * time.Second, MaxQueue: maxQueue,
	}}))
}

// admitKey is Admit for a turn of the conversation key, in flow 0.
func (r testRouter) admitKey(key uint64, body loadcontrol.Body, usable func(string) bool, now time.Time, ready func()) *loadcontrol.Ticket {
	return r.View.Admit(Request{Hash: key, Usable: usable, Now: now}, body, ready)
}

func mustState(t *testing.T, tk *loadcontrol.Ticket, want loadcontrol.TicketState) {
	t.Helper()
	if got := tk.State(); got != want {
		t.Fatalf("ticket state %d, want %d", got, want)
	}
}

func TestAdmissionHoldsWhatDoesNotFitAndAdmitsInOrder(t *testing.T) {
	r := admissionRouter(0)
	var ready []string
	admit := func(key string, tokens int) *loadcontrol.Ticket {
		return r.admitKey(HashKey(key), loadcontrol.Body{Bytes: int64(tokens * BytesPerToken)}, nil, t0, func() { ready = append(ready, key) })
	}
	a, b := admit("a", 80), admit("b", 80) // one per replica
	mustState(t, a, loadcontrol.Admitted)
	mustState(t, b, loadcontrol.Admitted)
	if id(pick(t, r, "a")) == id(pick(t, r, "b")) {
		t.Fatal("two conversations that each fill a cache were admitted on one replica")
	}
	c, d := admit("c", 50), admit("d", 10)
	mustState(t, c, loadcontrol.Waiting)
	mustState(t, d, loadcontrol.Waiting) // behind c, although it would fit
	if again := admit("a", 90); again.State() != loadcontrol.Admitted {
		t.Fatal("a resident conversation's next turn waited")
	}
	a.Done(t0.Add(time.Second))
	if len(ready) != 0 {
		t.Fatalf("admitted %v while a's residency lingers", ready)
	}
	// a still has a turn running (again): its residency holds until that ends.
	r.Sweep(t0.Add(time.Minute))
	if len(ready) != 0 {
		t.Fatalf("admitted %v while a still runs", ready)
	}
	st := r.Status()
	if st.Admission.Waiting != 2 || st.Admission.Queued != 2 {
		t.Fatalf("status %+v, want 2 waiting", st.Admission)
	}
}

func TestAdmissionLingerExpiryAdmitsTheQueueFirstComeFirstServed(t *testing.T) {
	r := admissionRouter(0)
	var ready []string
	admit := func(key string, tokens int) *loadcontrol.Ticket {
		return r.admitKey(HashKey(key), loadcontrol.Body{Bytes: int64(tokens * BytesPerToken)}, nil, t0, func() { ready = append(ready, key) })
	}
	a, b := admit("a", 80), admit("b", 80)
	c, d := admit("c", 50), admit("d", 40)
	a.Done(t0.Add(time.Second))
	b.Done(t0.Add(2 * time.Second))
	r.Sweep(t0.Add(10 * time.Second))
	if len(ready) != 0 {
		t.Fatalf("admitted %v before a's residency ended", ready)
	}
	r.Sweep(t0.Add(11 * time.Second)) // a leaves: c and d fit in its room
	if len(ready) != 2 || ready[0] != "c" || ready[1] != "d" {
		t.Fatalf("admitted %v, want [c d]", ready)
	}
	mustState(t, c, loadcontrol.Admitted)
	mustState(t, d, loadcontrol.Admitted)
	if id(pick(t, r, "c")) != id(pick(t, r, "d")) {
		t.Fatal("c and d were not admitted into the room a left")
	}
	if pin := id(pick(t, r, "c")); pin == id(pick(t, r, "b")) {
		t.Fatalf("c was pinned to %s, b's replica, which has no room", pin)
	}
}

func TestAdmissionCancelLeavesNoTrace(t *testing.T) {
	r := admissionRouter(0)
	a := r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil)
	b := r.admitKey(HashKey("b"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil)
	called := false
	c := r.admitKey(HashKey("c"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, func() { called = true })
	mustState(t, c, loadcontrol.Waiting)
	if !c.Cancel(t0) {
		t.Fatal("Cancel of a waiting ticket reported it was not waiting")
	}
	mustState(t, c, loadcontrol.Gone)
	a.Done(t0)
	b.Done(t0)
	r.Sweep(t0.Add(time.Hour))
	st := r.Status()
	if called || st.Admission.Waiting != 0 || st.Admission.Cancelled != 1 || st.InFlight != 0 {
		t.Fatalf("after cancel: ready called %v, status %+v, in flight %d", called, st.Admission, st.InFlight)
	}
	for _, rs := range st.Replicas {
		if rs.Residents != 0 || rs.ResidentTokens != 0 {
			t.Fatalf("replica %s still holds %d residents (%d tokens) after every residency ended", rs.ID, rs.Residents, rs.ResidentTokens)
		}
	}
	c.Done(t0) // a late Done of a cancelled ticket is harmless
	var nilTicket *loadcontrol.Ticket
	nilTicket.Done(t0)
}

func TestAdmissionQueueIsBoundedByMaxQueue(t *testing.T) {
	r := admissionRouter(3)
	r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil)
	r.admitKey(HashKey("b"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil)
	refused := 0
	for i := range 1000 {
		if r.admitKey(uint64(i+10), loadcontrol.Body{Bytes: 50 * BytesPerToken}, nil, t0, nil).State() == loadcontrol.Refused {
			refused++
		}
	}
	st := r.Status().Admission
	if st.Waiting != 3 || refused != 997 || st.Refused != 997 {
		t.Fatalf("flood of 1000 new conversations: waiting %d, refused %d (status %+v), want 3 and 997", st.Waiting, refused, st)
	}
}

func TestAdmissionForceAdmitsOverCapacity(t *testing.T) {
	r := admissionRouter(0)
	r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil)
	r.admitKey(HashKey("b"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil)
	c := r.admitKey(HashKey("c"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, func() { t.Fatal("ready called for a forced ticket") })
	if !c.Force(t0.Add(time.Minute)) {
		t.Fatal("Force of a waiting ticket reported it was not waiting")
	}
	mustState(t, c, loadcontrol.Admitted)
	if c.Force(t0) || c.Cancel(t0) {
		t.Fatal("Force or Cancel of an admitted ticket reported it waiting")
	}
	if st := r.Status().Admission; st.Forced != 1 || st.Waiting != 0 {
		t.Fatalf("status %+v, want 1 forced, none waiting", st)
	}
}

func TestAdmissionOffAdmitsEverything(t *testing.T) {
	r := newTestRouter(2, Config{})
	if tk := r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 1 << 30 * BytesPerToken}, nil, t0, nil); tk != nil || tk.State() != loadcontrol.Admitted {
		t.Fatal("load control off returned a ticket")
	}
	on := admissionRouter(0)
	if tk := on.admitKey(0, loadcontrol.Body{Bytes: 1 << 30 * BytesPerToken}, nil, t0, nil); tk != nil {
		t.Fatal("an unkeyed request got a ticket")
	}
}

func TestAdmissionQuantumYieldsToWaitingTurns(t *testing.T) {
	r := newTestRouter(1, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 100, Fill: 1, MinResidents: 1, Linger: time.Minute, Quantum: 2,
	}})
	turn := func(key string) *loadcontrol.Ticket {
		return r.admitKey(HashKey(key), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil)
	}
	turn("a").Done(t0) // a's first turn: it lingers, nobody waits
	b := turn("b")
	mustState(t, b, loadcontrol.Waiting)
	a2 := turn("a")
	mustState(t, a2, loadcontrol.Admitted) // still resident: its second turn goes
	a2.Done(t0)                            // its quantum is used up and b waits: a yields
	mustState(t, b, loadcontrol.Admitted)
	if a3 := turn("a"); a3.State() != loadcontrol.Waiting {
		t.Fatal("a's third turn did not queue behind b after a yielded")
	}
}

// A turn whose reply ended the agent's task leaves residency at once,
// though its quantum is not used up: the person's answer comes later than
// any linger.
func TestAdmissionTaskEndedLeavesAtOnce(t *testing.T) {
	r := newTestRouter(1, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 100, Fill: 1, MinResidents: 1, Linger: time.Minute, Quantum: 5,
	}})
	turn := func(key string) *loadcontrol.Ticket {
		return r.admitKey(HashKey(key), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil)
	}
	a := turn("a")
	b := turn("b")
	mustState(t, b, loadcontrol.Waiting)
	a.End(t0, loadcontrol.Reply{}) // a tool call: a lingers, b still waits
	mustState(t, b, loadcontrol.Waiting)
	a2 := turn("a")
	mustState(t, a2, loadcontrol.Admitted)
	a2.End(t0, loadcontrol.Reply{TaskEnded: true})
	mustState(t, b, loadcontrol.Admitted)
	if a3 := turn("a"); a3.State() != loadcontrol.Waiting {
		t.Fatal("a's next turn did not queue behind b after its task ended")
	}
	if st := r.Status().Admission; st.TaskEnded != 1 {
		t.Errorf("task ended counted %d times, want 1", st.TaskEnded)
	}
}

// BenchmarkAdmitAmongManyResidents is a turn of a resident conversation
// while a flood of tiny conversations holds the rest of the caches: its
// cost must not grow with the number of residents.
func BenchmarkAdmitAmongManyResidents(b *testing.B) {
	for _, residents := range []int{100, 100_000} {
		b.Run(fmt.Sprint(residents), func(b *testing.B) {
			r := newTestRouter(4, Config{Admission: loadcontrol.Config{Enabled: true, CapacityTokens: 1 << 30, Linger: time.Hour}})
			for i := range residents {
				r.admitKey(uint64(i+1), loadcontrol.Body{Bytes: 1}, nil, t0, nil).Done(t0)
			}
			now := t0.Add(time.Second)
			b.ReportAllocs()
			for b.Loop() {
				r.admitKey(1, loadcontrol.Body{Bytes: 1}, nil, now, nil).Done(now)
			}
		})
	}
}

// A reply that reports its prompt in the server's tokens teaches the bytes
// per token, and sizes its conversation's residency, so that a tokenizer
// denser than the assumed 4 bytes per token does not overfill the caches.
func TestAdmissionSizesByTheRepliesTokens(t *testing.T) {
	r := newTestRouter(1, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 100, Fill: 1, MinResidents: 1, Linger: time.Minute, Quantum: -1,
	}})
	a := r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 300}, nil, t0, nil) // 75 tokens at 4 bytes per token
	mustState(t, a, loadcontrol.Admitted)
	a.End(t0, loadcontrol.Reply{PromptTokens: 100}) // 3 bytes per token: a fills the cache
	if got := r.View.EstimateTokens(30); got != 10 {
		t.Fatalf("30 bytes estimated at %d tokens after a reply of 3 bytes per token, want 10", got)
	}
	mustState(t, r.admitKey(HashKey("b"), loadcontrol.Body{Bytes: 30}, nil, t0, nil), loadcontrol.Waiting)

	a2 := r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 300}, nil, t0, nil)
	mustState(t, a2, loadcontrol.Admitted)
	a2.End(t0, loadcontrol.Reply{PromptTokens: 100, CachedTokens: 90, CacheReported: true})
	// 30 bytes per token (an image, say): the bytes per token learned stay,
	// but a's residency takes the server's count, and b fits beside it.
	r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 300}, nil, t0, nil).End(t0, loadcontrol.Reply{PromptTokens: 10})

	st := r.Status().Admission
	want := loadcontrol.Status{
		Enabled: true, Admitted: 4, Queued: 1, Replies: 3, CacheReplies: 1, BytesPerToken: 3,
		Resident: loadcontrol.TokenCounts{Prompt: 110, Cached: 90}, NonResident: loadcontrol.TokenCounts{Prompt: 100},
		LackShare: 1.0 / 16, // b lacked room: one of the last 16 turns
	}
	if st != want {
		t.Fatalf("status\n%+v, want\n%+v", st, want)
	}
}

// A turn that waited is sized again when admitted, at the bytes per token
// the replies taught meanwhile: sized on the assumed ones it would fill its
// replica past its share for as long as its conversation stays resident.
func TestAdmissionSizesAQueuedTurnWhenAdmitted(t *testing.T) {
	r := newTestRouter(1, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 100, Fill: 1, MinResidents: 1, Linger: time.Minute, Quantum: -1,
	}})
	a := r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 240}, nil, t0, nil) // 60 tokens at 4 bytes per token
	mustState(t, a, loadcontrol.Admitted)
	b := r.admitKey(HashKey("b"), loadcontrol.Body{Bytes: 240}, nil, t0, nil) // 60 more would overfill
	mustState(t, b, loadcontrol.Waiting)
	a.End(t0, loadcontrol.Reply{PromptTokens: 80, TaskEnded: true}) // 3 bytes per token; a leaves
	mustState(t, b, loadcontrol.Admitted)
	if got := r.Status().Replicas[0]; got.ResidentTokens != 80 {
		t.Fatalf("b resident on %d tokens, want 80 (240 bytes at the 3 bytes per token learned while it waited)", got.ResidentTokens)
	}
	// Sized at the learned bytes per token, b is not made to yield though
	// its reply is denser than the mean.
	b.End(t0, loadcontrol.Reply{PromptTokens: 90})
	if got := r.Status().Replicas[0]; got.Residents != 1 {
		t.Fatalf("%d residents after b's turn, want b still resident", got.Residents)
	}
}

func TestEstimateTokensOfAnUnknownSize(t *testing.T) {
	r := newTestRouter(1, Config{})
	if got := r.View.EstimateTokens(0); got != 0 {
		t.Fatalf("an unknown body size estimated at %d tokens, want 0", got)
	}
	if got := r.View.EstimateTokens(1); got != 1 {
		t.Fatalf("a 1-byte body estimated at %d tokens, want 1", got)
	}
}

// A conversation admitted on a size its reply shows was too small (the
// bytes per token assumed before replies taught it) leaves at the end of
// its turn when its replica overflows, so that the replica does not thrash
// for as long as its residents stay; one sized right stays, and so does one
// sized at the learned bytes per token.
func TestAdmissionUnderestimatedOverflowYields(t *testing.T) {
	r := holding(newTestRouter(1, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 100, Fill: 1, MinResidents: 1, Linger: time.Minute, Quantum: -1,
	}}))
	a := r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 240}, nil, t0, nil) // 60 tokens at 4 bytes per token
	b := r.admitKey(HashKey("b"), loadcontrol.Body{Bytes: 160}, nil, t0, nil) // 40
	mustState(t, a, loadcontrol.Admitted)
	mustState(t, b, loadcontrol.Admitted)
	b.End(t0, loadcontrol.Reply{PromptTokens: 41}) // within the slack: stays
	a.End(t0, loadcontrol.Reply{PromptTokens: 80}) // 3 bytes per token: 121 resident of 100
	if got := r.Status().Replicas[0]; got.Residents != 1 || got.ResidentTokens != 41 {
		t.Fatalf("%d resident holding %d tokens, want b alone (41)", got.Residents, got.ResidentTokens)
	}
	mustState(t, r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 240}, nil, t0, nil), loadcontrol.Waiting)
	b2 := r.admitKey(HashKey("b"), loadcontrol.Body{Bytes: 160}, nil, t0, nil)
	mustState(t, b2, loadcontrol.Admitted)
	// Sized at the learned bytes per token, a turn denser than the mean
	// keeps its residency though its replica overflows.
	b2.End(t0, loadcontrol.Reply{PromptTokens: 120})
	if got := r.Status().Replicas[0]; got.Residents != 1 || got.ResidentTokens != 120 {
		t.Fatalf("%d resident holding %d tokens, want b (120)", got.Residents, got.ResidentTokens)
	}
}

// A new conversation is admitted to a healthy replica only, while one is
// healthy: an unhealthy one has room only because nothing is sent there,
// and Pick would move its turns onto the full healthy one. A failed scrape
// leaves the replica's cache its size. With every replica unhealthy, turns
// go as they would without load control.
func TestAdmissionPlacesOnHealthyReplicas(t *testing.T) {
	r := holding(newTestRouter(2, Config{Admission: loadcontrol.Config{Enabled: true, Fill: 1, MinResidents: 1, Linger: 10 * time.Second}}))
	for _, rep := range r.Replicas() {
		r.SetLoad(rep.ID, Load{Known: true, KVTokens: 100})
	}
	a := r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 80 * BytesPerToken}, nil, t0, nil)
	home := id(pick(t, r, "a"))
	var other string
	for _, rep := range r.Replicas() {
		if rep.ID != home {
			other = rep.ID
		}
	}
	r.SetLoad(other, Load{}) // a failed scrape: load unknown, the cache still 100 tokens
	b := r.admitKey(HashKey("b"), loadcontrol.Body{Bytes: 80 * BytesPerToken}, nil, t0, nil)
	c := r.admitKey(HashKey("c"), loadcontrol.Body{Bytes: 80 * BytesPerToken}, nil, t0, nil)
	mustState(t, b, loadcontrol.Admitted) // on other
	mustState(t, c, loadcontrol.Waiting)  // other's 100 tokens are full too
	b.Done(t0)
	r.SetHealthy(other, false)
	r.Sweep(t0.Add(11 * time.Second)) // b's residency expires: other has room, but is down
	mustState(t, c, loadcontrol.Waiting)
	r.SetHealthy(home, false) // none healthy: the turn goes
	r.Sweep(t0.Add(12 * time.Second))
	mustState(t, c, loadcontrol.Admitted)
	a.Done(t0)
}

// A pin moved by the shared pin table moves the conversation's residency
// with it: its turns go there now.
func TestAdmissionFollowsAnAdoptedPin(t *testing.T) {
	r := admissionRouter(0)
	a := r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 80 * BytesPerToken}, nil, t0, nil)
	home := id(pick(t, r, "a"))
	a.Done(t0)
	for _, rep := range r.Replicas() {
		if rep.ID != home && !r.Adopt(HashKey("a"), rep.ID, t0) {
			t.Fatal("adopting a's pin on the other replica failed")
		}
	}
	again := r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 80 * BytesPerToken}, nil, t0.Add(time.Second), nil)
	mustState(t, again, loadcontrol.Admitted)
	d := r.Pick(Request{Key: "a", Now: t0.Add(time.Second)})
	for _, rs := range r.Status().Replicas {
		if want := rs.ID == id(d); (rs.Residents == 1) != want {
			t.Errorf("a's turn runs on %s; %s holds %d residents", id(d), rs.ID, rs.Residents)
		}
	}
}

// A reload that turns load control off lets the waiting turns go at the
// next sweep: nothing would admit them before max_wait.
func TestAdmissionTurnedOffReleasesTheWaiting(t *testing.T) {
	r := admissionRouter(0)
	r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil)
	r.admitKey(HashKey("b"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil)
	woke := false
	c := r.admitKey(HashKey("c"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, func() { woke = true })
	mustState(t, c, loadcontrol.Waiting)
	r.reload(Config{Affinity: true}, servers(2))
	r.Sweep(t0.Add(time.Second))
	if !woke || c.State() == loadcontrol.Waiting || r.Status().Admission.Waiting != 0 {
		t.Errorf("a sweep after load control was turned off: woke %v, state %d, status %+v", woke, c.State(), r.Status().Admission)
	}
	c.Done(t0) // the turn's end, as the proxy calls it: nothing to end
}

// A turn admitted as its client left was never sent: the conversation it
// brought keeps no room, and the next waiting turn goes in at once.
func TestAdmissionCancelledAsAdmittedLeavesNoResidency(t *testing.T) {
	r := admissionRouter(0)
	a := r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil)
	r.admitKey(HashKey("b"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil)
	c := r.admitKey(HashKey("c"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil)
	d := r.admitKey(HashKey("d"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil)
	a.End(t0, loadcontrol.Reply{TaskEnded: true}) // a leaves: c is admitted
	mustState(t, c, loadcontrol.Admitted)
	c.Cancel(t0) // its client left at that instant
	mustState(t, d, loadcontrol.Admitted)
	if st := r.Status().Admission; st.Cancelled != 1 {
		t.Errorf("status %+v, want c counted cancelled", st)
	}
}

// While the queue's head waits for room, a turn of a conversation that
// became resident meanwhile (another of its turns was let in) passes it:
// it takes no room, and a later turn of the same conversation would be
// admitted at once.
func TestAdmissionResidentTurnsPassABlockedHead(t *testing.T) {
	r, head, d1, d2 := blockedHeadAndTwoTurns()
	d2.Force(t0.Add(time.Minute)) // d is resident now
	r.Sweep(t0.Add(time.Minute))
	mustState(t, head, loadcontrol.Waiting)
	mustState(t, d1, loadcontrol.Admitted)
}

// A turn let in, as its client left, to a residency that was there before
// it (another of its conversation's turns lingering) leaves that residency
// as it was.
func TestAdmissionCancelKeepsAResidencyThatPredatesTheTicket(t *testing.T) {
	r, head, d1, d2 := blockedHeadAndTwoTurns()
	d2.Force(t0.Add(time.Minute)) // d resident, d2 sent
	d2.Done(t0.Add(time.Minute))  // d lingers; d1 is let in to it
	mustState(t, d1, loadcontrol.Admitted)
	mustState(t, head, loadcontrol.Waiting)
	d1.Cancel(t0.Add(time.Minute))
	d3 := r.admitKey(HashKey("d"), loadcontrol.Body{Bytes: 10 * BytesPerToken}, nil, t0.Add(time.Minute+time.Second), nil)
	mustState(t, d3, loadcontrol.Admitted) // within its linger
}

// blockedHeadAndTwoTurns is two replicas full (a, b), the queue's head (c)
// waiting for room, and two turns of d waiting behind it.
func blockedHeadAndTwoTurns() (r testRouter, head, d1, d2 *loadcontrol.Ticket) {
	r = admissionRouter(0)
	r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil)
	r.admitKey(HashKey("b"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil)
	head = r.admitKey(HashKey("c"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil)
	d1 = r.admitKey(HashKey("d"), loadcontrol.Body{Bytes: 10 * BytesPerToken}, nil, t0, nil)
	d2 = r.admitKey(HashKey("d"), loadcontrol.Body{Bytes: 10 * BytesPerToken}, nil, t0, nil)
	return r, head, d1, d2
}
