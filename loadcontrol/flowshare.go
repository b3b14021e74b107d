package loadcontrol

// A flow's share of the caches. Serving the flows in turn (flows.go) gives
// a person at a terminal beside a farm a place in the queue, not a cache:
// the person pauses longer than Linger, so each turn comes back to a
// residency expired, waits for room, and finds its blocks evicted, as the
// engine evicts the blocks freed longest ago first, and an idle person's
// are always those; a resident of the person's also yields after its
// quantum, as the farm always has turns waiting. So, while two flows or
// more hold residents or wait, a flow that holds no more than its share of
// the caches (their capacity at its fill, split by the flows' weights)
// keeps its residents: they neither yield after their quantum nor expire
// after Linger (up to lateReturnWithin), nor leave when their task ends,
// as a person's next message continues the conversation; a new
// conversation of that flow takes the place of its conversations whose
// task ended. A replica holding such residents keeps room for each one's
// reply and, once, for the shared prefix they may not share with the
// others, which their prompts' sizes leave out: that slack lets a returning
// turn start at once rather than queue in the engine behind the turns of
// a flow over its share. A resident of a flow over its share yields
// at its turn's end when that replica's residents no longer fit in its
// cache with that room, or when a turn of a flow within its share waits.
// With a host tier, while two flows or more share the fleet, a replica
// where a flow within its share keeps a resident has the GPU's room
// alone: counted with the tier, turns would find room there, and the
// person's turn would wait in the engine's queue behind the farm's, first
// come first served, where no share applies. Elsewhere the tier counts,
// and the farm's turns wait in the engine's queue among themselves, as
// they would without load control, rather than in ours. A turn of a flow
// within its share has the GPU's room alone wherever it goes, and whether
// turns lack room is judged at the GPUs' room. A flow's first turn,
// before it holds or waits, is judged as one flow's: a person who arrives
// gets in. With one flow none of this applies.

// flowHold is what one flow holds resident, in all replicas.
type flowHold struct {
	count, tokens int
	weight        float64
	residents     map[*resident]struct{}
}

// holdFlow adds (sign +1) or removes (-1) res to what its flow holds
// (g.mu held).
func (q *fairQueue) holdFlow(res *resident, sign int) {
	h := q.held[res.flow]
	if h == nil {
		h = &flowHold{residents: map[*resident]struct{}{}}
		q.held[res.flow] = h
	}
	h.count += sign
	h.tokens += sign * res.tokens
	h.weight = res.weight
	if sign > 0 {
		h.residents[res] = struct{}{}
	} else {
		delete(h.residents, res)
	}
	if h.count == 0 {
		delete(q.held, res.flow)
	}
}

// shares is how the caches are split between the flows now: the room for
// residents in all replicas, and the weights of the flows holding
// residents or waiting; flows is 0 when the room is not known.
type shares struct {
	room, weight float64
	flows        int
}

// shares returns the flows' shares now (g.mu held).
func (v *View) shares() shares {
	q := &v.gate.fair
	var sh shares
	for _, h := range q.held {
		sh.weight += h.weight
		sh.flows++
	}
	for f, w := range q.flows {
		if q.held[f] == nil {
			sh.weight += w.turns[0].fair.weight
			sh.flows++
		}
	}
	if sh.flows < 2 {
		return sh
	}
	for _, s := range v.routing.Replicas() {
		capacity := v.capacityOf(s)
		if capacity <= 0 {
			return shares{}
		}
		sh.room += v.fillOf(s) * float64(capacity)
	}
	return sh
}

// within reports whether flow holds no more than its share while another
// flow holds residents or waits (g.mu held).
func (sh shares) within(q *fairQueue, flow uint64) bool {
	if sh.flows < 2 {
		return false
	}
	weight, held := 0.0, 0
	if h := q.held[flow]; h != nil {
		weight, held = h.weight, h.tokens
	} else if w := q.flows[flow]; w != nil {
		weight = w.turns[0].fair.weight
	}
	return weight > 0 && float64(held) <= sh.room*weight/sh.weight
}

// keeps reports whether res, at its turn's end or idle, keeps its
// residency: its flow is within its share (g.mu held).
func (v *View) keeps(res *resident) bool {
	return !v.gate.aside.Load() && v.shares().within(&v.gate.fair, res.flow)
}

// keepsIdle reports whether res, idle past Linger, stays resident at now
// (g.mu held).
func (v *View) keepsIdle(res *resident, now int64) bool {
	return now-res.idleSince < int64(lateReturnWithin) && v.keeps(res)
}

// keptReserve is the room s keeps beyond its residents' prompts for those
// it keeps for a flow within its share: each one's reply, and the shared
// prefix once, as what s holds counts it (g.mu held).
func (v *View) keptReserve(s Replica) int {
	g := v.gate
	if g.aside.Load() || !g.fair.several() {
		return 0
	}
	sh := v.shares()
	reserve, kept := 0, false
	for flow, h := range g.fair.held {
		if !sh.within(&g.fair, flow) {
			continue
		}
		for res := range h.residents {
			if res.rep == s && !res.leaving {
				reserve += res.output
				kept = true
			}
		}
	}
	if kept {
		reserve += v.sharedTokens()
	}
	return reserve
}

// crowds reports whether res, at its turn's end, yields to a flow within
// its share: its own flow is over its share, and its replica's residents
// no longer fit in its cache with the room kept for the others' residents,
// or such a flow's turn waits (g.mu held).
func (v *View) crowds(res *resident) bool {
	g := v.gate
	if g.aside.Load() || !g.fair.several() {
		return false
	}
	sh := v.shares()
	if sh.flows < 2 || sh.within(&g.fair, res.flow) {
		return false
	}
	if r := v.keptReserve(res.rep); r > 0 && v.distinct(g.held[res.rep], 0)+r > v.capacityOf(res.rep) {
		return true
	}
	for flow := range g.fair.flows {
		if flow != res.flow && sh.within(&g.fair, flow) {
			return true
		}
	}
	return false
}

// hasEndedPlace reports whether t's flow holds a resident whose task
// ended, idle, whose place t may take (g.mu held).
func (v *View) hasEndedPlace(t *Ticket) bool {
	h := v.gate.fair.held[t.fair.flow]
	if h == nil || v.gate.aside.Load() {
		return false
	}
	for res := range h.residents {
		if res.taskEnded && res.running == 0 && res.key != t.key {
			return true
		}
	}
	return false
}

// takeEndedPlace admits t, a turn of a flow within its share whose
// conversation is not resident, in the place of its flow's idle residents
// whose task ended, those idle the longest first, on the first replica
// where that makes room; it reports whether it did (g.mu held).
func (v *View) takeEndedPlace(t *Ticket, now int64) bool {
	g := v.gate
	if !v.hasEndedPlace(t) || !v.shares().within(&g.fair, t.fair.flow) {
		return false
	}
	for _, s := range v.routing.Replicas() {
		on := g.idleOn[s]
		if on == nil || !v.routing.Usable(s, t.usable) {
			continue
		}
		held := g.held[s]
		var ended []*resident
		for e := on.Front(); e != nil; e = e.Next() {
			res := e.Value.(*resident)
			if res.flow != t.fair.flow || !res.taskEnded || res.key == t.key {
				continue
			}
			ended = append(ended, res)
			res.leaving = true
			held.count--
			held.tokens -= res.tokens
			if v.roomHolding(s, held, t.tokens, true) { // t's flow is within its share: the GPU's room
				for _, r := range ended {
					g.drop(r, now)
				}
				t.placedBeside = g.held[s].count > 0
				g.tookNewcomer(s, now)
				g.admit(t, s, now)
				v.routing.Settle(t.key, s, now)
				return true
			}
		}
		for _, r := range ended {
			r.leaving = false
		}
	}
	return false
}

// several reports whether two flows or more hold residents or have turns
// waiting (g.mu held).
func (q *fairQueue) several() bool {
	n := len(q.held)
	for f := range q.flows {
		if n >= 2 {
			break
		}
		if q.held[f] == nil {
			n++
		}
	}
	return n >= 2
}

// roomOf is the room s has for residents (capacityOf), the host tier
// counted too while flows share the fleet where no flow within its share
// keeps a resident (reserve 0), unless gpuOnly: a turn of such a flow, or
// whether a turn lacks room (g.mu held).
func (v *View) roomOf(s Replica, reserve int, gpuOnly bool) int {
	if gpuOnly || reserve > 0 || v.cfg.CapacityTokens > 0 || !v.gate.fair.several() {
		return v.capacityOf(s)
	}
	return v.routing.KVTokens(s)
}

// withinShare reports whether t's flow is within its share while another
// flow holds residents or waits (g.mu held).
func (v *View) withinShare(t *Ticket) bool {
	return v.gate.fair.several() && v.shares().within(&v.gate.fair, t.fair.flow)
}
