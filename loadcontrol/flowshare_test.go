package loadcontrol

import (
	"testing"
	"time"
)

// A replica keeping two of a person's conversations keeps room for each
// one's reply and for the shared prefix once: beside them a farm's turn
// that fits with that room is admitted, a larger one waits.
func TestKeptConversationsReserveTheSharedPrefixOnce(t *testing.T) {
	for _, c := range []struct {
		tokens int
		want   TicketState
	}{{100, Admitted}, {120, Waiting}} {
		f := newFakeRouting(1)
		f.shared = 50
		v := f.view(Config{Enabled: true, CapacityTokens: 300, Fill: 1, MinResidents: 1, Linger: time.Hour, Quantum: -1})
		v.gate.Engage()
		admit := func(key, flow uint64, tokens int) *Ticket {
			return v.Admit(Turn{Key: key, Flow: flow, Now: t0}, Body{Bytes: int64(tokens * fakeBytesPerToken)}, nil)
		}
		mustAdmit := func(tk *Ticket) *Ticket {
			t.Helper()
			if tk.State() != Admitted {
				t.Fatalf("turn waits, want it admitted")
			}
			return tk
		}
		mustAdmit(admit(1, 1, 150)) // the farm's resident, running
		for key := uint64(2); key <= 3; key++ {
			mustAdmit(admit(key, 2, 60)).End(t0.Add(time.Second), Reply{PromptTokens: 60, OutputTokens: 10})
		}
		// The replica holds its prompts less the shared prefix for each but
		// one, and keeps 10+10+50 for the person: 300 fits.
		if got := admit(4, 1, c.tokens).State(); got != c.want {
			t.Errorf("a farm newcomer of %d tokens beside prompts of 270 and 70 kept: state %d, want %d", c.tokens, got, c.want)
		}
	}
}
