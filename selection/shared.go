package selection

import "time"

// SharedPins is a pin table that several routers share, such as the pin
// stores of Caddy instances serving the same fleet. A router consults it only
// when it meets a conversation it holds no pin for, and when it moves a pin:
// a conversation it knows is routed from its own table.
type SharedPins interface {
	// Claim pins key to replica unless another router pinned it first, and
	// returns the pin in force. ok is false when the store cannot answer:
	// the router keeps its own decision.
	Claim(key uint64, replica string) (pinned string, ok bool)
	// Repin moves key's pin from one replica to another, unless another
	// router moved it first (compare-and-set), and returns the pin in force.
	Repin(key uint64, from, to string) (pinned string, ok bool)
}

// share tells the shared table about a pin this router just made (placed
// anew, or moved off previous, an unusable replica) and follows the table
// when another router's pin wins and is usable here: the conversation's
// cache is there. It runs outside every lock, as the store is a network call
// (bounded by the store's timeout), in the request's own goroutine.
func (v *View) share(req Request, key uint64, d Decision, previous string) Decision {
	ours := d.rep.ID
	var pinned string
	var ok bool
	if previous == "" {
		pinned, ok = v.cfg.Shared.Claim(key, ours)
	} else {
		pinned, ok = v.cfg.Shared.Repin(key, previous, ours)
	}
	if !ok || pinned == ours {
		return d
	}
	theirs := v.byID[pinned]
	if theirs == nil || !v.usable(theirs, req.Usable) {
		// Their pin is no use here (a replica this config does not list, or
		// down): move the shared pin to ours, unless it moved meanwhile.
		if pinned, ok = v.cfg.Shared.Repin(key, pinned, ours); !ok || pinned == ours {
			return d
		}
		if theirs = v.byID[pinned]; theirs == nil || !v.usable(theirs, req.Usable) {
			return d
		}
	}
	moved, ok := v.router.repinIf(key, d.rep, theirs)
	if !ok {
		return d // the local pin changed meanwhile; the next sync settles it
	}
	if moved { // else their message got here first, and counted it
		theirs.adopted.Add(1)
	}
	d.rep.untake(d.prompt, d.uncached)
	return v.send(theirs, req, d.uncached, Adopted)
}

// repinIf moves key's local pin from one replica to another if it is still
// on the first. ok reports that the pin is now on the second, moved tells
// whether this call moved it.
func (r *Router) repinIf(key uint64, from, to *replicaState) (moved, ok bool) {
	sh := r.sessions.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	switch e := sh.byKey[key]; {
	case e == nil:
		return false, false
	case e.pin == from:
		e.repin(to)
		return true, true
	default:
		return false, e.pin == to
	}
}

// Adopt pins a conversation where another router pinned it: a pin this
// router holds moves there, and one it does not hold is learnt (the other
// router placed a new conversation), so that its load counts here at once
// when placing the next ones. It does nothing when the view does not list
// the replica or it is unhealthy, and reports whether the table changed.
func (v *View) Adopt(key uint64, replica string, now time.Time) bool {
	to := v.byID[replica]
	if to == nil || !to.healthy.Load() {
		return false
	}
	inserted, moved := v.router.pinTo(key, to, now.UnixNano())
	if !inserted && !moved {
		return false
	}
	if moved && v.cfg.Admission.Enabled {
		v.lc.Follow(key, now.UnixNano()) // its turns go there now: so does its residency
	}
	to.adopted.Add(1)
	return true
}

// pinTo pins key to s, learning a conversation it does not hold (inserted)
// or moving its pin (moved); neither when it was pinned there already.
func (r *Router) pinTo(key uint64, s *replicaState, now int64) (inserted, moved bool) {
	sh := r.sessions.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	switch e := sh.byKey[key]; {
	case e == nil:
		_, dropped := sh.insert(key, s, now)
		r.evicted.Add(uint64(dropped))
		return true, false
	case e.pin == s:
		return false, false
	default:
		e.repin(s)
		return false, true
	}
}

// PinsUsedSince lists the pins used at or after t, most recent first within
// each shard: the conversations whose shared pins to keep alive. The walk
// stops at the first older entry of each shard.
func (r *Router) PinsUsedSince(t time.Time) []Pin {
	since := t.UnixNano()
	var out []Pin
	for i := range r.sessions.shards {
		sh := &r.sessions.shards[i]
		sh.mu.Lock()
		for e := sh.head; e != nil && e.lastSeen >= since; e = e.next {
			out = append(out, Pin{Key: e.key, Replica: e.pin.ID, LastUse: e.lastSeen})
		}
		sh.mu.Unlock()
	}
	return out
}
