package selection

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// flowBench is one replica whose cache holds one conversation: each turn
// fills it, so the turns waiting are admitted one at a time, in the queue's
// order, as the resident ends its task.
type flowBench struct {
	t       *testing.T
	r       testRouter
	now     time.Time
	running *loadcontrol.Ticket
	order   []string
}

func newFlowBench(t *testing.T) *flowBench {
	b := &flowBench{t: t, now: t0, r: newTestRouter(1, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 100, Fill: 1, MinResidents: 1, Linger: time.Minute, Quantum: -1,
	}})}
	b.running = b.admit("resident", Request{})
	mustState(t, b.running, loadcontrol.Admitted)
	return b
}

// admit asks for admission of a 100-token turn of the conversation name, in
// req's flow.
func (b *flowBench) admit(name string, req Request) *loadcontrol.Ticket {
	req.Key, req.Now = name, b.now
	var tk *loadcontrol.Ticket
	tk = b.r.View.Admit(req, loadcontrol.Body{Bytes: 100 * BytesPerToken}, func() {
		b.order = append(b.order, name)
		b.running = tk
	})
	return tk
}

// drain ends the running turn's task, one after the other, until nothing
// waits, and returns the names in the order they were admitted.
func (b *flowBench) drain() string {
	b.step(b.r.Status().Admission.Waiting)
	return strings.Join(b.order, " ")
}

// step ends the running turn's task n times, a second apart, each
// admitting the next turn waiting.
func (b *flowBench) step(n int) {
	b.t.Helper()
	for range n {
		b.now = b.now.Add(time.Second)
		running := b.running
		running.End(b.now, loadcontrol.Reply{TaskEnded: true})
		if b.running == running {
			b.t.Fatalf("nothing admitted after a turn ended; admitted so far: %v", b.order)
		}
	}
}

func TestFlowsAreServedRoundRobin(t *testing.T) {
	b := newFlowBench(t)
	for i := range 4 {
		mustState(t, b.admit(fmt.Sprint("a", i+1), Request{Flow: 1}), loadcontrol.Waiting)
	}
	b.admit("b1", Request{Flow: 2})
	b.admit("b2", Request{Flow: 2})
	if got, want := b.drain(), "a1 b1 a2 b2 a3 a4"; got != want {
		t.Fatalf("admitted %s, want %s", got, want)
	}
}

// With one flow, the queue is first come, first served, whatever the flow.
func TestOneFlowIsFirstComeFirstServed(t *testing.T) {
	b := newFlowBench(t)
	var want []string
	for i := range 6 {
		name := fmt.Sprint("c", i+1)
		b.admit(name, Request{Flow: 7})
		want = append(want, name)
	}
	if got := b.drain(); got != strings.Join(want, " ") {
		t.Fatalf("admitted %s, want %s", got, strings.Join(want, " "))
	}
}

func TestFlowWeightServesMoreTurnsARound(t *testing.T) {
	b := newFlowBench(t)
	for i := range 4 {
		b.admit(fmt.Sprint("a", i+1), Request{Flow: 1})
	}
	for i := range 4 {
		b.admit(fmt.Sprint("b", i+1), Request{Flow: 2, FlowWeight: 2})
	}
	if got, want := b.drain(), "b1 a1 b2 b3 a2 b4 a3 a4"; got != want {
		t.Fatalf("admitted %s, want %s", got, want)
	}
}

// A flow idle while another's turns were served earns no credit: once it
// sends, its turns take their places in the round from where it is, not
// all ahead of the other's.
func TestAnIdleFlowEarnsNoCredit(t *testing.T) {
	b := newFlowBench(t)
	for i := range 6 {
		b.admit(fmt.Sprint("a", i+1), Request{Flow: 1})
	}
	b.step(3) // a1, a2, a3
	for i := range 3 {
		b.admit(fmt.Sprint("b", i+1), Request{Flow: 2})
	}
	if got, want := b.drain(), "a1 a2 a3 a4 b1 a5 b2 a6 b3"; got != want {
		t.Fatalf("admitted %s, want %s", got, want)
	}
}

// Within a flow, a main conversation's turn goes ahead of the sub-agents'
// and side calls waiting, taking the place in the round of the first of
// them.
func TestMainTurnsGoAheadOfTheirFlowsSubagentsAndSideCalls(t *testing.T) {
	b := newFlowBench(t)
	// side's last request on its pin had an 800-token prompt: a 100-token
	// turn of it is a side call.
	d := b.r.Pick(Request{Key: "side", PromptTokens: 800, Now: b.now})
	d.End(b.now, loadcontrol.Reply{})
	b.admit("sub1", Request{Flow: 1, Parent: HashKey("main")})
	b.admit("side", Request{Flow: 1})
	b.admit("other", Request{Flow: 2})
	b.admit("main", Request{Flow: 1})
	// A fingerprinted conversation's first turn names its own earlier key:
	// it is a main turn.
	b.admit("renamed", Request{Flow: 1, Parent: HashKey("earlier"), Renamed: true})
	if got, want := b.drain(), "main other renamed sub1 side"; got != want {
		t.Fatalf("admitted %s, want %s", got, want)
	}
}

func TestFlowCountersAndWaits(t *testing.T) {
	b := newFlowBench(t)
	b.admit("a1", Request{Flow: 1})
	b.admit("a2", Request{Flow: 1})
	b.admit("b1", Request{Flow: 2})
	flows := b.r.Status().Flows.Counted
	want := []loadcontrol.FlowStatus{{ID: 2, Waiting: 1, Queued: 1}, {ID: 1, Waiting: 2, Queued: 2}, {ID: 0, Admitted: 1}}
	if !slices.Equal(flows, want) {
		t.Fatalf("flows %+v, want %+v", flows, want)
	}
	b.drain() // a1 at t0+1s, b1 at +2s, a2 at +3s
	flows = b.r.Status().Flows.Counted
	want = []loadcontrol.FlowStatus{{ID: 1, Admitted: 2, Queued: 2, Waited: 4 * time.Second}, {ID: 2, Admitted: 1, Queued: 1, Waited: 2 * time.Second}, {ID: 0, Admitted: 1}}
	if !slices.Equal(flows, want) {
		t.Fatalf("flows %+v, want %+v", flows, want)
	}
}

// A flood of distinct flows (one API key per request) keeps at most
// maxFlowsCounted flows apart; the flows idle the longest are folded into
// the others' counts, none lost, and a flow with turns waiting is never
// folded.
func TestFlowCountsAreBounded(t *testing.T) {
	r := newTestRouter(1, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 100, Fill: 1, MinResidents: 1, Linger: time.Minute, Quantum: -1, MaxQueue: 10,
	}})
	fill := r.View.Admit(Request{Key: "fill", Flow: 1, Now: t0}, loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil)
	waiting := r.View.Admit(Request{Key: "waits", Flow: 2, Now: t0}, loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil)
	mustState(t, waiting, loadcontrol.Waiting)
	const flood = 10_000
	for i := range flood {
		// Each a resident's turn: admitted at once, whatever the queue.
		r.View.Admit(Request{Key: "fill", Flow: uint64(1000 + i), Now: t0}, loadcontrol.Body{Bytes: BytesPerToken}, nil).Done(t0)
	}
	st := r.Status()
	if len(st.Flows.Counted) != maxFlowsCounted {
		t.Fatalf("%d flows counted apart after a flood of %d, want %d", len(st.Flows.Counted), flood, maxFlowsCounted)
	}
	admitted := st.Flows.Other.Admitted
	seen := map[uint64]bool{}
	for _, f := range st.Flows.Counted {
		admitted += f.Admitted
		seen[f.ID] = true
	}
	if admitted != st.Admission.Admitted {
		t.Fatalf("the flows' admitted add up to %d, load control admitted %d", admitted, st.Admission.Admitted)
	}
	if !seen[2] || !seen[1000+flood-1] || seen[1] {
		t.Fatalf("counted apart: the waiting flow %v, the latest %v, the idlest %v; want true, true, false", seen[2], seen[1000+flood-1], seen[1])
	}
	fill.End(t0, loadcontrol.Reply{TaskEnded: true})
	mustState(t, waiting, loadcontrol.Admitted)
	if f := r.Status().Flows.Counted[0]; f.ID != 2 || f.Admitted != 1 || f.Waiting != 0 {
		t.Fatalf("the waiting flow, once admitted: %+v", f)
	}
}

// With every flow counted apart waiting, a new flow counts with the folded
// ones, and its turn waits and is admitted as any other.
func TestANewFlowCountsWithTheFoldedOnesWhenEveryCountedFlowWaits(t *testing.T) {
	r := newTestRouter(1, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 100, Fill: 1, MinResidents: 1, Linger: time.Minute, Quantum: -1,
	}})
	first := r.View.Admit(Request{Key: "first", Flow: 0, Now: t0}, loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil)
	r.View.Admit(Request{Key: "w", Flow: 0, Now: t0}, loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil)
	for i := range maxFlowsCounted - 1 {
		r.View.Admit(Request{Key: fmt.Sprint("w", i), Flow: uint64(i + 1), Now: t0}, loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil)
	}
	extra := r.View.Admit(Request{Key: "extra", Flow: 9999, Now: t0}, loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil)
	mustState(t, extra, loadcontrol.Waiting)
	flows := r.Status().Flows
	if len(flows.Counted) != maxFlowsCounted || flows.Other.Waiting != 1 || flows.Other.Queued != 1 {
		t.Fatalf("%d flows counted apart, the others %+v; want %d and one waiting", len(flows.Counted), flows.Other, maxFlowsCounted)
	}
	r.ReleaseWaiting()
	first.Done(t0)
	st := r.Status()
	if st.Admission.Waiting != 0 || st.Flows.Other.Waiting != 0 || slices.ContainsFunc(st.Flows.Counted, func(f loadcontrol.FlowStatus) bool { return f.Waiting != 0 }) {
		t.Fatalf("after every waiting turn was let go: %d waiting, the others %+v", st.Admission.Waiting, st.Flows.Other)
	}
}

// maxFlowsCounted is loadcontrol's: the flows counted apart.
const maxFlowsCounted = 256
