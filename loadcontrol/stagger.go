package loadcontrol

import "time"

// Staggered starts (Config.Stagger). Conversations admitted to a
// replica together grow together: an agent farm launched at once fills each
// replica with residents on their first turns, which a few turns later hold
// far more than the replica's cache, all at the same time, and are replaced,
// when their tasks end together, by newcomers that start together again.
// Residents at different points of their tasks keep the sum of their
// prompts near its mean instead. So a replica filling from empty takes a
// newcomer at most once per Stagger, until one of its residents leaves;
// from then on its residents leave at different times, and each newcomer
// takes a place as it frees. A replica with no resident takes one at once.
// A newcomer paced so waits at the head of the queue and holds back the
// newcomers behind it, but not a turn going to its own replica: a person's
// next message must not wait for another conversation's stagger.

// staggering is a replica's state for staggered starts.
type staggering struct {
	lastNewcomer int64 // when it last took a conversation not pinned to it
	departed     bool  // a resident has left it since it was last empty
}

// staggerSlack absorbs the jitter of the sweep's ticks, which may come a
// hair early and would otherwise add a whole tick to a stagger.
const staggerSlack = time.Millisecond

// mayTakeNewcomer reports whether s may take a conversation not pinned to it
// now (g.mu held).
func (v *View) mayTakeNewcomer(s Replica, now int64) bool {
	next := v.nextNewcomer(s)
	return next.IsZero() || now+int64(staggerSlack) >= next.UnixNano()
}

// nextNewcomer is when s, filling from empty, may take its next newcomer;
// zero when it is not so paced (g.mu held).
func (v *View) nextNewcomer(s Replica) time.Time {
	g := v.gate
	st := g.staggering[s]
	if v.cfg.Stagger <= 0 || st.departed || g.held[s].count == 0 || g.aside.Load() {
		return time.Time{}
	}
	return time.Unix(0, st.lastNewcomer+int64(v.cfg.Stagger))
}

// pacedOnly reports whether t, which found no room, waits only for a rule
// of when a replica takes a newcomer (stagger, touch.go): a usable replica
// has room for it (g.mu held).
func (v *View) pacedOnly(t *Ticket) bool {
	if v.cfg.Stagger <= 0 && !v.cfg.Touch {
		return false
	}
	healthy := v.routing.AnyHealthy(t.usable)
	return v.routing.Lightest(t.usable, t.key, func(s Replica) bool { return v.takes(s, t, healthy) }) != nil
}

// headPaced reports whether the queue's head waits only for a replica to
// take a newcomer, so that a turn going to its own replica may pass it
// (g.mu held).
func (v *View) headPaced() bool {
	g := v.gate
	return len(g.queue) > 0 && g.queue[0].view.pacedOnly(g.queue[0])
}

// tookNewcomer records that s took a conversation not pinned to it.
func (g *Gate) tookNewcomer(s Replica, now int64) {
	st := g.staggering[s]
	st.lastNewcomer = now
	g.staggering[s] = st
}

// residentLeft records that a resident left s: a replica that still holds
// others is no longer filling from empty; an empty one fills anew.
func (g *Gate) residentLeft(s Replica) {
	st := g.staggering[s]
	st.departed = g.held[s].count > 0
	g.staggering[s] = st
}
