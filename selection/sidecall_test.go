package selection

import (
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// sideCallRouter is one replica whose cache holds 100 tokens, and turn, which
// asks it to admit a turn of key sized tokens.
func sideCallRouter() (testRouter, func(key string, tokens int) *loadcontrol.Ticket) {
	return sideCallRouterTaking(1)
}

// sideCallRouterTaking is sideCallRouter taking minResidents conversations
// however large.
func sideCallRouterTaking(minResidents int) (testRouter, func(key string, tokens int) *loadcontrol.Ticket) {
	r := newTestRouter(1, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 100, Fill: 1, MinResidents: minResidents, Linger: time.Minute, Quantum: -1,
	}})
	return r, func(key string, tokens int) *loadcontrol.Ticket {
		return r.admitKey(HashKey(key), loadcontrol.Body{Bytes: int64(tokens * BytesPerToken)}, nil, t0, nil)
	}
}

// A side call of a resident conversation (a title, a classifier: a prompt
// far smaller than the conversation's) neither shrinks the residency nor
// ends it with its end_turn; the conversation's own turns still do.
func TestAdmissionSideCallNeitherSizesNorEndsTheResidency(t *testing.T) {
	r, turn := sideCallRouter()
	a := turn("a", 80)
	a.End(t0, loadcontrol.Reply{PromptTokens: 80})
	title := turn("a", 10)
	mustState(t, title, loadcontrol.Admitted)
	title.End(t0, loadcontrol.Reply{PromptTokens: 10, TaskEnded: true})
	if got := r.Status().Replicas[0]; got.Residents != 1 || got.ResidentTokens != 80 {
		t.Fatalf("after a side call: %d residents holding %d tokens, want a holding 80", got.Residents, got.ResidentTokens)
	}
	b := turn("b", 30)
	mustState(t, b, loadcontrol.Waiting) // 80 + 30 do not fit
	a2 := turn("a", 90)
	mustState(t, a2, loadcontrol.Admitted)
	a2.End(t0, loadcontrol.Reply{PromptTokens: 90, TaskEnded: true})
	mustState(t, b, loadcontrol.Admitted)
	st := r.Status().Admission
	if st.SideCalls != 1 || st.TaskEnded != 1 {
		t.Fatalf("%d side calls and %d task ends counted, want 1 and 1", st.SideCalls, st.TaskEnded)
	}
	if st.Resident.Prompt != 90 {
		t.Fatalf("resident turns' prompts add up to %d tokens, want 90 (the side call's left out)", st.Resident.Prompt)
	}
}

// A body whose size is unknown, or only a lower bound, is no side call: a
// small count says nothing of its prompt.
func TestAdmissionUnsizedTurnIsNoSideCall(t *testing.T) {
	for _, body := range []loadcontrol.Body{{}, {Bytes: 8, Partial: true}} {
		r, turn := sideCallRouter()
		turn("a", 80).End(t0, loadcontrol.Reply{PromptTokens: 80})
		r.admitKey(HashKey("a"), body, nil, t0, nil).End(t0, loadcontrol.Reply{PromptTokens: 85, TaskEnded: true})
		if got := r.Status().Replicas[0]; got.Residents != 0 {
			t.Errorf("body %+v: its task end left a resident, want the conversation gone", body)
		}
	}
}

// A side call that opens a residency (Claude Code titles a prompt before
// sending it) does not let the conversation's turn in without room.
func TestAdmissionSideCallFirstOpensNoBackDoor(t *testing.T) {
	r, turn := sideCallRouter()
	a := turn("a", 80)
	title := turn("b", 5)
	mustState(t, title, loadcontrol.Admitted) // 85 fit
	b := turn("b", 60)
	mustState(t, b, loadcontrol.Waiting)
	title.End(t0, loadcontrol.Reply{TaskEnded: true})
	mustState(t, b, loadcontrol.Waiting)
	a.End(t0, loadcontrol.Reply{TaskEnded: true})
	mustState(t, b, loadcontrol.Admitted)
	if got := r.Status().Replicas[0]; got.Residents != 1 || got.ResidentTokens != 60 {
		t.Fatalf("%d residents holding %d tokens, want b alone holding 60", got.Residents, got.ResidentTokens)
	}
}

// A side call whose client leaves as it is admitted ends as by Done: the
// residency it joined stays.
func TestAdmissionCancelledSideCallKeepsTheResidency(t *testing.T) {
	r, turn := sideCallRouter()
	turn("a", 80).End(t0, loadcontrol.Reply{PromptTokens: 80})
	turn("a", 10).Cancel(t0)
	if got := r.Status().Replicas[0]; got.Residents != 1 {
		t.Fatalf("%d residents after a cancelled side call, want a still resident", got.Residents)
	}
}

// A side call admitted from the queue, or forced, is one too: it does not
// size the residency its conversation's turn holds.
func TestAdmissionQueuedOrForcedSideCallKeepsTheSize(t *testing.T) {
	t.Run("queued", func(t *testing.T) {
		r, turn := sideCallRouter()
		a := turn("a", 90)
		x, title := turn("x", 80), turn("x", 5)
		mustState(t, title, loadcontrol.Waiting)
		a.End(t0, loadcontrol.Reply{TaskEnded: true})
		mustState(t, x, loadcontrol.Admitted)
		mustState(t, title, loadcontrol.Admitted)
		if got := r.Status().Replicas[0].ResidentTokens; got != 80 {
			t.Fatalf("x holds %d tokens while its 80-token turn runs, want 80", got)
		}
		mustState(t, turn("b", 60), loadcontrol.Waiting)
	})
	t.Run("forced", func(t *testing.T) {
		r, turn := sideCallRouter()
		turn("a", 90)
		x, title := turn("x", 80), turn("x", 5)
		x.Force(t0)
		title.Force(t0)
		if got := r.Status().Replicas[0].ResidentTokens; got != 90+80 {
			t.Fatalf("holding %d tokens, want a's 90 and x's 80", got)
		}
	})
}

// The title that opened a residency is a side call once its conversation's
// turn has outgrown it: ending last, it neither ends nor resizes it.
func TestAdmissionOpeningTitleEndingLastIsASideCall(t *testing.T) {
	r, turn := sideCallRouter()
	title := turn("x", 5)
	x := turn("x", 60)
	mustState(t, x, loadcontrol.Admitted)
	x.End(t0, loadcontrol.Reply{PromptTokens: 60}) // a tool call: the agent comes back
	title.End(t0, loadcontrol.Reply{PromptTokens: 5, TaskEnded: true})
	if got := r.Status().Replicas[0]; got.Residents != 1 || got.ResidentTokens != 60 {
		t.Fatalf("%d residents holding %d tokens, want x holding 60", got.Residents, got.ResidentTokens)
	}
}

// A side call that ends after its conversation's turn ended the task ends
// the residency, as that turn would have ending last.
func TestAdmissionSideCallEndingLastKeepsTheTaskEnd(t *testing.T) {
	r, turn := sideCallRouter()
	x := turn("x", 80)
	title := turn("x", 10)
	b := turn("b", 30)
	mustState(t, b, loadcontrol.Waiting)
	x.End(t0, loadcontrol.Reply{PromptTokens: 80, TaskEnded: true})
	title.End(t0, loadcontrol.Reply{PromptTokens: 10, TaskEnded: true})
	mustState(t, b, loadcontrol.Admitted)
	if got := r.Status().Replicas[0].Residents; got != 1 {
		t.Fatalf("%d residents, want b alone", got)
	}
}

// A turn that outgrows its residency waits in order like a newcomer: it
// does not pass a head waiting for room.
func TestAdmissionOutgrowingTurnKeepsItsPlaceInTheQueue(t *testing.T) {
	_, turn := sideCallRouter()
	turn("a", 50)
	turn("x", 5)
	d := turn("d", 10)
	c, x := turn("c", 50), turn("x", 30)
	mustState(t, c, loadcontrol.Waiting)
	d.End(t0, loadcontrol.Reply{TaskEnded: true}) // 55 held: c still does not fit
	mustState(t, c, loadcontrol.Waiting)
	mustState(t, x, loadcontrol.Waiting)
}

// A turn that outgrows its residency is sized on its replica in place of
// it, not beside it.
func TestAdmissionOutgrowingTurnReplacesItsResidency(t *testing.T) {
	t.Run("min residents", func(t *testing.T) {
		_, turn := sideCallRouterTaking(2)
		turn("a", 90)
		turn("x", 5)
		mustState(t, turn("x", 200), loadcontrol.Admitted) // two conversations, however large
	})
	t.Run("tokens", func(t *testing.T) {
		_, turn := sideCallRouter()
		turn("a", 38)
		turn("x", 5)
		mustState(t, turn("x", 60), loadcontrol.Admitted) // 98 of 100
	})
	t.Run("alone", func(t *testing.T) {
		_, turn := sideCallRouter()
		turn("x", 20).End(t0, loadcontrol.Reply{PromptTokens: 20})
		mustState(t, turn("x", 85), loadcontrol.Admitted) // grown past four times, alone on its replica
	})
}

// A conversation with far more bytes per token than the mean (images) is
// sized in tokens by its replies, and the room that frees goes to another;
// its next turn, a little longer in bytes, still rides its residency: side
// calls and outgrowing turns are told in bytes, not against the tokens the
// replies set.
func TestAdmissionDenseBytesAreNoOutgrowth(t *testing.T) {
	r, turn := sideCallRouter()
	for range 3 { // b's replies teach 4 bytes per token
		turn("b", 85).End(t0, loadcontrol.Reply{PromptTokens: 85})
	}
	a := turn("a", 14)
	mustState(t, a, loadcontrol.Admitted)
	a.End(t0, loadcontrol.Reply{PromptTokens: 2}) // 28 bytes per token: a holds 2 tokens
	mustState(t, turn("c", 10), loadcontrol.Admitted)
	if got := r.Status().Replicas[0].ResidentTokens; got != 97 {
		t.Fatalf("%d tokens held, want b's 85, a's 2 and c's 10", got)
	}
	mustState(t, turn("a", 15), loadcontrol.Admitted) // its next turn
}
