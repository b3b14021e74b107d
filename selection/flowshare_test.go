package selection

import (
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// shareBench is two replicas whose caches hold 100 tokens each, shared by
// a farm (flow 1) and a person (flow 2, or the farm's flow when oneFlow:
// a proxy that tells no one apart).
type shareBench struct {
	t      *testing.T
	r      testRouter
	person uint64
	ready  map[string]bool
}

func newShareBench(t *testing.T, quantum int, oneFlow bool) *shareBench {
	b := &shareBench{t: t, person: 2, ready: map[string]bool{}, r: holding(newTestRouter(2, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 100, Fill: 1, MinResidents: 1, Linger: 10 * time.Second, Quantum: quantum,
	}}))}
	if oneFlow {
		b.person = 1
	}
	return b
}

func (b *shareBench) admit(key string, flow uint64, tokens int, at time.Duration) *loadcontrol.Ticket {
	return b.r.View.Admit(Request{Key: key, Flow: flow, Now: t0.Add(at)}, loadcontrol.Body{Bytes: int64(tokens * BytesPerToken)},
		func() { b.ready[key] = true })
}

func (b *shareBench) farm(key string, tokens int, at time.Duration) *loadcontrol.Ticket {
	return b.admit(key, 1, tokens, at)
}

func (b *shareBench) personTurn(key string, tokens int, at time.Duration) *loadcontrol.Ticket {
	return b.admit(key, b.person, tokens, at)
}

func (b *shareBench) residents() int {
	n := 0
	for _, rs := range b.r.Status().Replicas {
		n += rs.Residents
	}
	return n
}

// A person within its share keeps its conversation resident beside a farm
// whose turns wait: past Linger, and past its quantum; told apart from
// nobody, it leaves after Linger as before.
func TestAPersonWithinItsShareStaysResident(t *testing.T) {
	for _, oneFlow := range []bool{false, true} {
		b := newShareBench(t, 2, oneFlow)
		mustState(t, b.farm("f1", 90, 0), loadcontrol.Admitted)
		mustState(t, b.farm("f2", 90, 0), loadcontrol.Admitted)
		p := b.personTurn("p", 10, 0)
		mustState(t, p, loadcontrol.Admitted)
		mustState(t, b.farm("f3", 90, 0), loadcontrol.Waiting)
		p.End(t0.Add(time.Second), loadcontrol.Reply{})
		b.r.Sweep(t0.Add(15 * time.Second)) // past Linger
		if got, want := b.residents(), map[bool]int{false: 3, true: 2}[oneFlow]; got != want {
			t.Fatalf("one flow %v: %d residents after the person's Linger, want %d", oneFlow, got, want)
		}
		if oneFlow {
			continue
		}
		for i := range 3 { // past its quantum of 2, f3 waiting all along
			at := time.Duration(16+i) * time.Second
			turn := b.personTurn("p", 10, at)
			mustState(t, turn, loadcontrol.Admitted)
			turn.End(t0.Add(at+time.Second/2), loadcontrol.Reply{})
		}
		if got := b.residents(); got != 3 || b.ready["f3"] {
			t.Fatalf("%d residents after the person's third turn (f3 admitted: %v), want 3 and f3 waiting", got, b.ready["f3"])
		}
	}
}

// A farm's resident yields at its turn's end to a person's turn waiting
// for room, though its quantum never ends; in one flow it lingers and the
// turn waits.
func TestAFarmResidentYieldsToAPersonWaiting(t *testing.T) {
	for _, oneFlow := range []bool{false, true} {
		b := newShareBench(t, -1, oneFlow)
		f1 := b.farm("f1", 90, 0)
		mustState(t, b.farm("f2", 90, 0), loadcontrol.Admitted)
		mustState(t, b.personTurn("p", 50, 0), loadcontrol.Waiting)
		f1.End(t0.Add(time.Second), loadcontrol.Reply{})
		if b.ready["p"] == oneFlow {
			t.Fatalf("one flow %v: the person's turn admitted %v at the farm turn's end", oneFlow, b.ready["p"])
		}
	}
}

// A person's conversation whose task ended keeps its place, which the
// person's next conversation takes at once, though a farm's turn waits
// ahead of it, whether it arrives after the task ended or before.
func TestAPersonsNewConversationTakesTheEndedOnesPlace(t *testing.T) {
	for _, before := range []bool{false, true} {
		b := newShareBench(t, -1, false)
		mustState(t, b.farm("f1", 90, 0), loadcontrol.Admitted)
		mustState(t, b.farm("f2", 40, 0), loadcontrol.Admitted)
		p1 := b.personTurn("p1", 60, 0)
		mustState(t, p1, loadcontrol.Admitted)
		mustState(t, b.farm("f3", 50, 0), loadcontrol.Waiting)
		var p2 *loadcontrol.Ticket
		if before {
			p2 = b.personTurn("p2", 60, time.Second)
			mustState(t, p2, loadcontrol.Waiting)
		}
		p1.End(t0.Add(2*time.Second), loadcontrol.Reply{TaskEnded: true})
		if !before {
			p2 = b.personTurn("p2", 60, 3*time.Second)
		}
		if p2.State() != loadcontrol.Admitted || b.ready["f3"] || b.residents() != 3 {
			t.Fatalf("p2 before p1's end %v: p2 %d, f3 admitted %v, %d residents; want p2 admitted in p1's place, f3 waiting",
				before, p2.State(), b.ready["f3"], b.residents())
		}
	}
	// Told apart from nobody, the ended conversation leaves at once and the
	// farm's turn waiting takes its room.
	b := newShareBench(t, -1, true)
	b.farm("f1", 90, 0)
	b.farm("f2", 40, 0)
	p1 := b.personTurn("p1", 60, 0)
	b.farm("f3", 50, 0)
	p1.End(t0.Add(2*time.Second), loadcontrol.Reply{TaskEnded: true})
	if !b.ready["f3"] || b.personTurn("p2", 60, 3*time.Second).State() != loadcontrol.Waiting {
		t.Fatalf("one flow: f3 admitted %v, want f3 admitted and p2 waiting", b.ready["f3"])
	}
}

// A replica keeping a person's conversation keeps room for its reply,
// which its prompt's size leaves out: a farm's newcomer whose prompt would
// fit beside the prompt waits; in one flow it is admitted.
func TestAKeptConversationsReplyKeepsItsRoom(t *testing.T) {
	for _, oneFlow := range []bool{false, true} {
		b := newShareBench(t, -1, oneFlow)
		mustState(t, b.farm("f1", 90, 0), loadcontrol.Admitted)
		p := b.personTurn("p", 40, 0)
		mustState(t, p, loadcontrol.Admitted)
		p.End(t0.Add(time.Second), loadcontrol.Reply{PromptTokens: 40, OutputTokens: 20})
		want := map[bool]loadcontrol.TicketState{false: loadcontrol.Waiting, true: loadcontrol.Admitted}[oneFlow]
		mustState(t, b.farm("f2", 50, 2*time.Second), want)
	}
}

// With a host tier, two flows share the GPU's room where the person keeps
// a resident, and the tier's elsewhere: a farm turn that the tier would
// take goes beside the farm, not the person, where one flow alone is let in
// as the tier allows, beside anyone.
func TestFlowsShareTheGPUsRoomBesideAHostTier(t *testing.T) {
	for _, oneFlow := range []bool{false, true} {
		r := holding(newTestRouter(2, Config{Admission: loadcontrol.Config{Enabled: true, Fill: 1, MinResidents: 1, Linger: 10 * time.Second}}))
		for _, rep := range r.Replicas() {
			r.SetLoad(rep.ID, Load{Known: true, KVTokens: 100})
			r.state(rep.ID).host.tokens.Store(500)
		}
		b := &shareBench{t: t, r: r, person: 2, ready: map[string]bool{}}
		if oneFlow {
			b.person = 1
		}
		mustState(t, b.farm("f1", 90, 0), loadcontrol.Admitted)
		mustState(t, b.farm("f2", 90, 0), loadcontrol.Admitted)
		mustState(t, b.personTurn("p", 10, 0), loadcontrol.Admitted)
		mustState(t, b.farm("f3", 90, 0), loadcontrol.Admitted)
		mustState(t, b.farm("f4", 90, 0), loadcontrol.Admitted)
		person := b.r.pinOf(HashKey("p"), t0.UnixNano(), int64(time.Hour))
		for _, f := range []string{"f3", "f4"} {
			if pin := b.r.pinOf(HashKey(f), t0.UnixNano(), int64(time.Hour)); !oneFlow && pin == person {
				t.Errorf("%s placed beside the person's resident on %s, want beside the farm's", f, pin.ID)
			}
		}
		// The person's next conversation has the GPU's room alone, wherever.
		want := map[bool]loadcontrol.TicketState{false: loadcontrol.Waiting, true: loadcontrol.Admitted}[oneFlow]
		mustState(t, b.personTurn("p2", 20, 0), want)
	}
}

// The conversations to refresh are a person's kept idle beside a farm
// whose turns wait, on their replica: not while their turn runs, not the
// farm's, not on an unhealthy replica, not after lateReturnWithin, and
// none told apart from nobody; only the person's turns keep their prompts.
func TestKeptIdleAreAPersonsIdleConversations(t *testing.T) {
	for _, oneFlow := range []bool{false, true} {
		b := newShareBench(t, -1, oneFlow)
		mustState(t, b.farm("f1", 90, 0), loadcontrol.Admitted)
		p := b.personTurn("p", 10, 0)
		mustState(t, p, loadcontrol.Admitted)
		f2 := b.farm("f2", 90, 0)
		mustState(t, f2, loadcontrol.Admitted)
		mustState(t, b.farm("f3", 90, 0), loadcontrol.Waiting)
		p.End(t0.Add(time.Second), loadcontrol.Reply{})
		f2.End(t0.Add(time.Second), loadcontrol.Reply{}) // idle, lingering, its flow over its share
		if b.residents() != 3 {
			t.Fatalf("one flow %v: %d residents, want f1 running, p and f2 idle", oneFlow, b.residents())
		}
		if p.KeepsPrompt(false) == oneFlow || f2.KeepsPrompt(false) {
			t.Fatalf("one flow %v: the person's turn keeps its prompt %v, the farm's %v; want the person's alone, told apart",
				oneFlow, p.KeepsPrompt(false), f2.KeepsPrompt(false))
		}
		if !oneFlow {
			next := b.personTurn("p", 10, 2*time.Second)
			mustState(t, next, loadcontrol.Admitted)
			if kept := b.r.KeptIdle(t0.Add(3 * time.Second)); len(kept) != 0 {
				t.Fatalf("%v kept idle while the person's turn runs, want none", kept)
			}
			next.End(t0.Add(3*time.Second), loadcontrol.Reply{})
		}
		kept := b.r.KeptIdle(t0.Add(4 * time.Second))
		if oneFlow {
			if len(kept) != 0 {
				t.Fatalf("one flow: %v kept idle, want none", kept)
			}
			continue
		}
		pin := b.r.pinOf(HashKey("p"), t0.UnixNano(), int64(time.Hour)).Replica
		if len(kept) != 1 || kept[0].Key != HashKey("p") || kept[0].Replica != pin {
			t.Fatalf("%v kept idle, want the person's conversation on %v", kept, pin)
		}
		b.r.SetHealthy(pin.ID, false)
		if kept := b.r.KeptIdle(t0.Add(4 * time.Second)); len(kept) != 0 {
			t.Fatalf("%v kept idle on an unhealthy replica, want none", kept)
		}
		b.r.SetHealthy(pin.ID, true)
		b.r.Sweep(t0.Add(time.Minute))
		if kept := b.r.KeptIdle(t0.Add(3*time.Second + 6*time.Minute)); len(kept) != 0 {
			t.Fatalf("%v kept idle six minutes after the turn, want none", kept)
		}
	}
}
