package selection

import (
	"fmt"
	"testing"
	"time"
)

// Load control steps aside while most idle residents expire instead of
// coming back within linger, admitting every turn at once, and takes over
// again once conversations come back in time.
func TestAdmissionStepsAsideWhileConversationsComeBackLate(t *testing.T) {
	r := admissionRouter(0) // 100 tokens a replica, linger 10 s
	now := t0
	admit := func(key string) *Ticket {
		return r.Admit(HashKey(key), Body{Bytes: 40 * BytesPerToken}, nil, now, nil)
	}
	// Each round, four conversations of 40 tokens fill both replicas (two
	// each) and a fifth waits, then leaves; they pause 30 s, past linger.
	for round := 0; !r.Status().Admission.SteppedAside; round++ {
		if round == 10 {
			t.Fatalf("not stepped aside after 10 rounds of late returns: %+v", r.Status().Admission)
		}
		for i := range 4 {
			tk := admit(fmt.Sprintf("r%d-%d", round, i))
			mustState(t, tk, Admitted)
			tk.Done(now)
		}
		waits := admit(fmt.Sprintf("r%d-waits", round))
		mustState(t, waits, Waiting)
		waits.Cancel(now)
		now = now.Add(30 * time.Second)
		r.Sweep(now)
	}
	var running []*Ticket
	for i := range 6 { // 240 tokens on 200: all admitted at once
		tk := admit(fmt.Sprintf("aside-%d", i))
		mustState(t, tk, Admitted)
		running = append(running, tk)
	}
	// The same six come back 2 s after each turn, within linger, until
	// load control holds turns again.
	for turn := 0; r.Status().Admission.SteppedAside; turn++ {
		if turn == 20 {
			t.Fatalf("still aside after 20 turns that came back in time: %+v", r.Status().Admission)
		}
		for _, tk := range running {
			tk.Done(now)
		}
		now = now.Add(2 * time.Second)
		for i := range running {
			running[i] = admit(fmt.Sprintf("aside-%d", i))
		}
	}
	mustState(t, admit("newcomer"), Waiting)
}
