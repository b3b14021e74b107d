package selection

import (
	"testing"
	"time"
)

// sideCallRouter is one replica whose cache holds 100 tokens, and turn, which
// asks it to admit a turn of key sized tokens.
func sideCallRouter() (testRouter, func(key string, tokens int) *Ticket) {
	r := newTestRouter(1, Config{Admission: AdmissionConfig{
		Enabled: true, CapacityTokens: 100, Fill: 1, MinResidents: 1, Linger: time.Minute, Quantum: -1,
	}})
	return r, func(key string, tokens int) *Ticket {
		return r.Admit(HashKey(key), Body{Bytes: int64(tokens * BytesPerToken)}, nil, t0, nil)
	}
}

// A side call of a resident conversation (a title, a classifier: a prompt
// far smaller than the conversation's) neither shrinks the residency nor
// ends it with its end_turn; the conversation's own turns still do.
func TestAdmissionSideCallNeitherSizesNorEndsTheResidency(t *testing.T) {
	r, turn := sideCallRouter()
	a := turn("a", 80)
	a.End(t0, Reply{PromptTokens: 80})
	title := turn("a", 10)
	mustState(t, title, Admitted)
	title.End(t0, Reply{PromptTokens: 10, TaskEnded: true})
	if got := r.Status().Replicas[0]; got.Residents != 1 || got.ResidentTokens != 80 {
		t.Fatalf("after a side call: %d residents holding %d tokens, want a holding 80", got.Residents, got.ResidentTokens)
	}
	b := turn("b", 30)
	mustState(t, b, Waiting) // 80 + 30 do not fit
	a2 := turn("a", 90)
	mustState(t, a2, Admitted)
	a2.End(t0, Reply{PromptTokens: 90, TaskEnded: true})
	mustState(t, b, Admitted)
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
	for _, body := range []Body{{}, {Bytes: 8, Partial: true}} {
		r, turn := sideCallRouter()
		turn("a", 80).End(t0, Reply{PromptTokens: 80})
		r.Admit(HashKey("a"), body, nil, t0, nil).End(t0, Reply{PromptTokens: 85, TaskEnded: true})
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
	mustState(t, title, Admitted) // 85 fit
	b := turn("b", 60)
	mustState(t, b, Waiting)
	title.End(t0, Reply{TaskEnded: true})
	mustState(t, b, Waiting)
	a.End(t0, Reply{TaskEnded: true})
	mustState(t, b, Admitted)
	if got := r.Status().Replicas[0]; got.Residents != 1 || got.ResidentTokens != 60 {
		t.Fatalf("%d residents holding %d tokens, want b alone holding 60", got.Residents, got.ResidentTokens)
	}
}

// A side call whose client leaves as it is admitted ends as by Done: the
// residency it joined stays.
func TestAdmissionCancelledSideCallKeepsTheResidency(t *testing.T) {
	r, turn := sideCallRouter()
	turn("a", 80).End(t0, Reply{PromptTokens: 80})
	turn("a", 10).Cancel(t0)
	if got := r.Status().Replicas[0]; got.Residents != 1 {
		t.Fatalf("%d residents after a cancelled side call, want a still resident", got.Residents)
	}
}
