package loadcontrol

// Departures and the engine's LRU (Config.Touch). vLLM frees a
// finished request's cached blocks to the tail of its free queue and
// evicts from the head: the blocks of the resident idle longest go first,
// and those of a conversation that just left, which will not come back,
// last. A newcomer admitted to a replica as a resident leaves it, its
// task ended, prefills into the cache of the residents idle since before
// that, the ones due back soonest, which then miss most of their prompt;
// once each of them has begun a turn again, their blocks are in use or
// freed after the departed's, and the newcomer takes the departed's
// instead. So while a resident of a replica has been idle since before
// another left it, the replica takes no newcomer, unless the departed's
// prompts, its residents' and the newcomer's fit in its cache together,
// when nothing resident is evicted, or it holds two idle residents or more
// that run little (idle.go). The wait is at most a tool pause: a resident
// idle past Linger leaves.
//
// The newcomer is let in at the next turn's end or sweep after the last
// idle resident's turn was admitted, not at that admission, when the
// returning turn's prefill has not run yet.
//
// A residency that expires counts as leaving when it expires, though the
// engine freed its cache a Linger earlier, and so is evicted first
// anyway: newcomers wait until the idle residents have begun a turn again
// or expired too. docs/research/policy.md#touch-and-fill-control has the
// measurements behind both.

// departure is what left a replica since the cache of the residents idle
// before it was freed (g.mu held).
type departure struct {
	freed  int64 // when the first departed left
	tokens int   // the departed's prompts
	count  int   // how many departed
}

// left records that res left its replica at now (0: it was never sent)
// (g.mu held). A departure while residents idle since before an earlier
// one are still owed adds to it: its cache is freed after theirs either
// way.
func (g *Gate) left(res *resident, now int64) {
	if now == 0 {
		return
	}
	d := g.owed[res.rep]
	if d == nil || !g.idleBefore(res.rep, d.freed) {
		d = &departure{freed: now}
		g.owed[res.rep] = d
	}
	d.tokens += res.tokens
	d.count++
}

// touchedAll reports whether s may take a newcomer of tokens now, as far
// as Touch is concerned (g.mu held).
func (v *View) touchedAll(s Replica, now int64, tokens int) bool {
	g := v.gate
	d := g.owed[s]
	if !v.cfg.Touch || d == nil || g.aside.Load() || now-d.freed >= int64(v.cfg.Linger) {
		return true
	}
	if !g.idleBefore(s, d.freed) {
		delete(g.owed, s)
		return true
	}
	capacity := v.capacityOf(s)
	if capacity <= 0 {
		return true
	}
	shared := v.sharedTokens()
	departed := max(d.tokens-d.count*shared, 0)
	return v.distinct(g.held[s], tokens)+departed <= capacity
}

// idleBefore reports whether a resident of s has been idle since before
// t: s's idle list is in the order its residents' turns ended (g.mu held).
func (g *Gate) idleBefore(s Replica, t int64) bool {
	on := g.idleOn[s]
	return on != nil && on.Front().Value.(*resident).idleSince < t
}
