package selection

// Rehoming: a pin is kept for the cache it holds, so a conversation whose
// pin has likely evicted its cache since its last turn is placed anew, like
// a new one, where its prefill starts soonest (Rehomed).
//
// The estimate reads the engine's own counters. vLLM frees a finished
// request's KV blocks to the end of its free queue and allocates, evicting
// cached blocks, from the front. So a conversation's blocks survive until
// the engine has written (Load.Written: prompt tokens it computed plus
// tokens it generated) about as many tokens as its free room held when the
// conversation's last request ended.
//
// Load control, when on, keeps its residents' caches and moves the others
// itself; rehoming then stays out of its way (measured: it cost the
// throughput mode 3 points of its gain at 24 and 32 sessions), unless load
// control steps aside (aside.go).

// ColdShare is how much of a conversation's last prompt its pin may have
// evicted for it still to count as cached there. Measured on the workload
// grid: 0 and 0.5 each lost one more p95 cell than 0.25 (docs/policy.md).
const ColdShare = 0.25

// placement is why pinByLoad places a conversation.
type placement uint8

const (
	placeFresh     placement = iota // new, or its pin unusable
	placeCompacted                  // its prefix was replaced
	placeCold                       // its pin has likely evicted its cache
)

// outcome is what a conversation moved off a usable pin is counted as.
func (p placement) outcome() Outcome {
	if p == placeCold {
		return Rehomed
	}
	return Compacted
}

// stillMoves reports whether e, found on a usable pin while its shard was
// unlocked, must still move for the reason mode says: another request of
// the conversation may have moved it meanwhile.
func (v *View) stillMoves(e *session, mode placement, now int64) bool {
	switch mode {
	case placeCompacted:
		return now-e.placedAt >= int64(v.cfg.CompactionInterval)
	case placeCold:
		return e.cold()
	}
	return false
}

// placeFor chooses where a conversation is pinned anew. A cold one is cached
// nowhere, so only how soon a replica can start its prefill matters. When
// no candidate has room, a cold or new conversation goes to the replica
// with the fewest prompt tokens in flight (leastPending), its candidates'
// conversations not counted: it waits behind those prefills.
func (v *View) placeFor(usable func(string) bool, key uint64, mode placement) *replicaState {
	switch mode {
	case placeCold:
		if s := v.leastRecent(usable, key, nil); s != nil {
			return s
		}
		return v.leastPending(usable, key)
	case placeFresh:
		if s := v.freshPlace(usable, key); s != nil {
			return s
		}
		return v.leastPending(usable, key)
	}
	return v.leastLoaded(usable, key, true)
}

// onPin marks d, a request on its conversation's pin (e, its shard
// locked), so that Release tells the entry when the conversation's last
// request there ends.
func (d Decision) onPin(v *View, e *session, key uint64, prompt int) Decision {
	if e.pin == d.rep {
		e.sent(d.rep)
		e.busy++
		e.released = false
		if prompt > 0 {
			e.lastPrompt = prompt
		}
		d.router, d.key, d.entry, d.moves = v.router, key, e, e.moves
	}
	return d
}

// ended records that d, a request on its conversation's pin, ended with
// reply: when it was the last one there, the entry notes the pin's writes
// and free room now, and what reply says of the chain it stored. A request
// sent before the conversation moved, or before its entry was replaced,
// is not counted in busy: even if the conversation came back to the same
// replica since, its end says nothing of the new turn.
func (r *Router) ended(d Decision, reply Reply) {
	sh := r.sessions.shard(d.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.byKey[d.key]
	if e != d.entry || e.moves != d.moves || e.busy <= 0 {
		return
	}
	rep := e.pin
	if e.busy--; e.busy > 0 {
		return
	}
	e.replied(reply)
	l := rep.load.Load()
	// Written is 0 both without the counters and before the engine wrote
	// anything: either way there is nothing to judge by.
	e.released = l.Known && l.KVTokens > 0 && l.Written > 0
	e.relWritten = l.Written
	e.relRestarts = rep.restarts.Load()
	e.relFree = float64(l.KVTokens) * (1 - l.KVUsage)
}

// cold reports whether the conversation's cache on its pin has likely been
// evicted since its last request there ended: the pin has written more
// than the free room it had then plus ColdShare of the conversation's last
// prompt. A pin whose counters went back since (a restarted engine) lost
// it all, even once they have climbed past their old value.
func (e *session) cold() bool {
	if e.busy > 0 || e.lastPrompt <= 0 {
		return false
	}
	if cold, ok := e.coldByChain(); ok {
		return cold
	}
	if !e.released {
		return false
	}
	l := e.pin.load.Load()
	if !l.Known || l.Written <= 0 {
		return false
	}
	if l.Written < e.relWritten || e.pin.restarts.Load() != e.relRestarts {
		return true
	}
	return l.Written-e.relWritten-e.relFree > ColdShare*float64(e.lastPrompt)
}
