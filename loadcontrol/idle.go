package loadcontrol

// Idle replicas. Holding a turn keeps the residents' caches, but a replica
// does no work while every one of its residents pauses between turns (a
// tool runs, an agent thinks). Where turns are short beside the pauses, the
// few conversations a small cache holds leave it idle most of the time, and
// the turns held meanwhile cost more than the cache they keep: so a replica
// none of whose residents runs a turn takes the turn at the head of the
// queue that no replica has room for, when its residents, at the turn
// times and pauses measured, would run less than one turn at a time on
// average. A turn that has room and waits only for a newcomer's pace
// (stagger, touch) goes only to such a replica that holds two residents or
// more and whose stagger lets it take a newcomer: the stagger is the user's
// pace of a farm's starts, where touch only keeps idle residents' caches,
// which a replica that sits idle keeps for little; and a single resident
// always runs under one turn at a time, so for it the measure says nothing
// of whether its replica idles.
// Where turns are long beside the pauses (the agents' usual case), a
// replica's residents keep it busy, and holding keeps caches without
// idling it.

// movingMean is the mean of recent durations, recent ones weighing most
// (about the last 16), and whether one was seen.
type movingMean struct {
	mean float64
	seen bool
}

func (m *movingMean) note(d int64) {
	if !m.seen {
		m.mean, m.seen = float64(d), true
		return
	}
	m.mean += shareWeight * (float64(d) - m.mean)
}

// residentPace is how long a turn takes from its admission to its end, and
// how long a resident pauses from a turn's end to its next turn's admission
// (those back within Linger).
type residentPace struct{ turn, pause movingMean }

// busyShare is the share of the time a resident runs a turn, as measured;
// 1 until both are.
func (p residentPace) busyShare() float64 {
	if !p.turn.seen || !p.pause.seen || p.turn.mean+p.pause.mean <= 0 {
		return 1
	}
	return p.turn.mean / (p.turn.mean + p.pause.mean)
}

// idleKeepsLittle reports whether s is idle, none of its residents running
// a turn, and its residents would run less than one turn at a time on
// average (g.mu held).
func (v *View) idleKeepsLittle(s Replica) bool {
	g := v.gate
	h := g.held[s]
	if h.count == 0 || !v.routing.Healthy(s) {
		return false
	}
	if on := g.idleOn[s]; on == nil || on.Len() < h.count {
		return false
	}
	return float64(h.count)*g.pace.busyShare() < 1
}

// idleReplica is where t, which no replica took at now while load control
// holds turns, goes at once: its pin or else the least-loaded replica that
// is idle and keeps little by holding; when a replica has room for t and
// only pacing holds it, the least-loaded such replica that holds two
// residents or more and may take a newcomer now by its stagger; nil for
// none (g.mu held).
func (v *View) idleReplica(t *Ticket, pin Replica, now int64) Replica {
	if v.gate.aside.Load() {
		return nil
	}
	s := pin
	if s == nil || !v.routing.Usable(s, t.usable) || !v.idleKeepsLittle(s) {
		s = v.routing.Lightest(t.usable, t.key, v.idleKeepsLittle)
	}
	if s == nil || !v.pacedOnly(t) {
		return s
	}
	return v.routing.Lightest(t.usable, t.key, func(s Replica) bool {
		return v.gate.held[s].count >= 2 && v.idleKeepsLittle(s) && v.mayTakeNewcomer(s, now)
	})
}
