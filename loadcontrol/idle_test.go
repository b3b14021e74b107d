package loadcontrol

import (
	"fmt"
	"testing"
	"time"
)

// pacedView is load control holding turns on one replica of 100 tokens, a
// 10 s linger and no quantum, and its residents 1 and 2 of 40 tokens each,
// which have run turns turns together, each lasting turn, pausing pause
// between them. It returns the view and the clock at their last turn's end.
func pacedView(t *testing.T, turn, pause time.Duration, turns int) (*View, time.Time) {
	t.Helper()
	return pacedViewWith(t, Config{Enabled: true, CapacityTokens: 100, Fill: 1, MinResidents: 1,
		Linger: 10 * time.Second, Quantum: -1}, []uint64{1, 2}, turn, pause, turns)
}

// pacedViewWith is pacedView with cfg and the residents keys.
func pacedViewWith(t *testing.T, cfg Config, keys []uint64, turn, pause time.Duration, turns int) (*View, time.Time) {
	t.Helper()
	v := newFakeRouting(1).view(cfg)
	v.gate.Engage()
	now := t0
	for i := range turns {
		if i > 0 {
			now = now.Add(pause)
		}
		var running []*Ticket
		for _, key := range keys {
			tk := v.Admit(Turn{Key: key, Now: now}, Body{Bytes: 40 * fakeBytesPerToken}, nil)
			if tk.State() != Admitted {
				t.Fatalf("turn %d of resident %d: state %d", i, key, tk.State())
			}
			running = append(running, tk)
		}
		now = now.Add(turn)
		for _, tk := range running {
			tk.Done(now)
		}
	}
	return v, now
}

// A replica whose residents run short turns between long pauses sits idle
// most of the time: when none of them runs a turn, it takes a turn that
// lacks room rather than hold it. Where their turns are long beside their
// pauses, it holds it.
func TestIdleReplicaTakesAWaitingTurnWhereResidentsRunLittle(t *testing.T) {
	for _, c := range []struct {
		turn, pause time.Duration
		want        TicketState
	}{
		{time.Second, 5 * time.Second, Admitted},
		{10 * time.Second, time.Second, Waiting},
	} {
		t.Run(fmt.Sprint(c.turn, "+", c.pause), func(t *testing.T) {
			v, now := pacedView(t, c.turn, c.pause, 3)
			newcomer := v.Admit(Turn{Key: 3, Now: now}, Body{Bytes: 40 * fakeBytesPerToken}, nil)
			if got := newcomer.State(); got != c.want {
				t.Fatalf("a newcomer beside two idle residents whose turns take %v between pauses of %v: state %d, want %d",
					c.turn, c.pause, got, c.want)
			}
			newcomer.Cancel(now)
		})
	}
}

// A turn that lacks room waits while a resident runs a turn, however
// little the residents run, and goes once none does.
func TestIdleReplicaTakesAWaitingTurnOnceNoResidentRuns(t *testing.T) {
	v, now := pacedView(t, time.Second, 5*time.Second, 3)
	now = now.Add(5 * time.Second)
	back := v.Admit(Turn{Key: 1, Now: now}, Body{Bytes: 40 * fakeBytesPerToken}, nil)
	newcomer := v.Admit(Turn{Key: 3, Now: now}, Body{Bytes: 40 * fakeBytesPerToken}, nil)
	if got := newcomer.State(); got != Waiting {
		t.Fatalf("a newcomer while a resident runs a turn: state %d, want waiting", got)
	}
	back.Done(now.Add(time.Second))
	if got := newcomer.State(); got != Admitted {
		t.Fatalf("the newcomer once no resident runs a turn: state %d, want admitted", got)
	}
}

// A newcomer that has room and waits only for the replica's stagger keeps
// waiting on an idle replica whose single resident runs little: a single
// resident always runs under one turn at a time, so the measure says
// nothing of whether its replica idles.
func TestIdleReplicaKeepsTheStaggerOfATurnThatHasRoom(t *testing.T) {
	v, now := pacedViewWith(t, Config{Enabled: true, CapacityTokens: 100, Fill: 1, MinResidents: 1,
		Linger: 10 * time.Second, Quantum: -1, Stagger: time.Minute}, []uint64{1}, time.Second, 5*time.Second, 3)
	newcomer := v.Admit(Turn{Key: 3, Now: now}, Body{Bytes: 40 * fakeBytesPerToken}, nil)
	if got := newcomer.State(); got != Waiting {
		t.Fatalf("a newcomer with room within the stagger, beside an idle resident that runs little: state %d, want waiting", got)
	}
	newcomer.Cancel(now)
}

// The same beside two idle residents, to which the rule sends a turn that
// waits only for touch: a replica filling from empty still takes a newcomer
// at most once per stagger.
func TestIdleReplicaKeepsTheStaggerBesideTwoResidents(t *testing.T) {
	v := newFakeRouting(1).view(Config{Enabled: true, CapacityTokens: 130, Fill: 1, MinResidents: 1,
		Linger: time.Minute, Quantum: -1, Stagger: 10 * time.Second, Touch: true})
	v.gate.Engage()
	turn := func(key uint64, at time.Duration) {
		tk := v.Admit(Turn{Key: key, Now: t0.Add(at)}, Body{Bytes: 40 * fakeBytesPerToken}, nil)
		if tk.State() != Admitted {
			t.Fatalf("resident %d at %v: state %d", key, at, tk.State())
		}
		tk.Done(t0.Add(at + time.Second))
	}
	turn(1, 0)
	turn(2, 10*time.Second) // once the stagger let it in
	turn(1, 10*time.Second)
	newcomer := v.Admit(Turn{Key: 3, Now: t0.Add(12 * time.Second)}, Body{Bytes: 40 * fakeBytesPerToken}, nil)
	if got := newcomer.State(); got != Waiting {
		t.Fatalf("a newcomer with room within the stagger, beside two idle residents that run little: state %d, want waiting", got)
	}
	newcomer.Cancel(t0.Add(12 * time.Second))
}

// A newcomer that has room but waits only for touch (a conversation left
// while the residents were idle, so their caches would be evicted first)
// goes to an idle replica whose residents run little, as a turn that lacks
// room does: waiting for them to come back would leave the replica idle.
// Where their turns are long beside their pauses, it waits for them, and
// beside a single idle resident, which always runs under one turn at a
// time, it waits for it too.
func TestIdleReplicaTakesATurnThatWaitsOnlyForTouch(t *testing.T) {
	for _, c := range []struct {
		residents   []uint64
		turn, pause time.Duration
		want        TicketState
	}{
		{[]uint64{1, 2}, time.Second, 5 * time.Second, Admitted},
		{[]uint64{1, 2}, 10 * time.Second, time.Second, Waiting},
		{[]uint64{1}, time.Second, 5 * time.Second, Waiting},
	} {
		t.Run(fmt.Sprint(len(c.residents), "x", c.turn, "+", c.pause), func(t *testing.T) {
			// Room for the residents, the departed and the newcomer but one.
			capacity := 40*(len(c.residents)+2) - 10
			v, now := pacedViewWith(t, Config{Enabled: true, CapacityTokens: capacity, Fill: 1, MinResidents: 1,
				Linger: time.Minute, Quantum: -1, Touch: true}, c.residents, c.turn, c.pause, 3)
			gone := v.Admit(Turn{Key: 3, Now: now}, Body{Bytes: 40 * fakeBytesPerToken}, nil)
			if got := gone.State(); got != Admitted {
				t.Fatalf("a third conversation with room: state %d, want admitted", got)
			}
			now = now.Add(c.turn)
			gone.End(now, Reply{TaskEnded: true})
			newcomer := v.Admit(Turn{Key: 4, Now: now}, Body{Bytes: 40 * fakeBytesPerToken}, nil)
			if got := newcomer.State(); got != c.want {
				t.Fatalf("a newcomer held by touch beside %d idle residents whose turns take %v between pauses of %v: state %d, want %d",
					len(c.residents), c.turn, c.pause, got, c.want)
			}
			if c.want == Waiting {
				v.gate.mu.Lock()
				paced := v.pacedOnly(newcomer)
				v.gate.mu.Unlock()
				if !paced {
					t.Fatalf("the newcomer waits for room, want for touch only")
				}
			}
			newcomer.Cancel(now)
		})
	}
}
