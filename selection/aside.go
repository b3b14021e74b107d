package selection

// Stepping aside. Load control pays when a conversation comes back within
// Linger of its turn's end: its residency kept its cache for that turn.
// Agents whose tools, or whose people, take longer come back after their
// residency ended, and holding turns then only keeps the replicas below the
// concurrency they could run, for no cache kept (lab: 0.81-0.99× the best
// baseline's throughput at 10 to 60 s between turns; docs/policy.md).
//
// So load control follows how often an idle resident came back in time
// rather than expired, and while most expire it steps aside: every turn is
// admitted at once, new conversations are not staggered, and rehoming
// judges caches as it does without load control. It keeps tracking
// residents meanwhile, and takes over again once conversations come back
// in time. A resident whose reply ended its task, or that yielded after
// its quantum, neither came back nor expired: it does not count.

const (
	// returnWeight is the weight of one return in the late share: about
	// the last 16 returns count.
	returnWeight = 1.0 / 16
	// asideAbove is the late share above which load control steps aside.
	asideAbove = 0.5
)

// noteReturn records that an idle resident came back in time (late false)
// or that its residency expired (g.mu held).
func (g *gate) noteReturn(late bool) {
	x := 0.0
	if late {
		x = 1
	}
	g.lateShare += returnWeight * (x - g.lateShare)
	g.aside.Store(g.lateShare > asideAbove)
}

// holdsTurns reports whether load control is on and not stepped aside.
func (v *View) holdsTurns() bool {
	return v.cfg.Admission.Enabled && !v.router.gate.aside.Load()
}
