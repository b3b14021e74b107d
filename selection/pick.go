package selection

import (
	"time"
)

// Request is what the router needs to know about one request.
type Request struct {
	// Key identifies the conversation (a session header value); empty when
	// the request carries none.
	Key string
	// ClientReplica is a replica ID the client asked for (client pinning);
	// empty when it asked for none or is not allowed to.
	ClientReplica string
	// Usable reports whether the proxy can reach an upstream address now
	// (Caddy's own health and max_requests); nil means every address.
	Usable func(address string) bool
	Now    time.Time
}

// Outcome says why a replica was chosen.
type Outcome uint8

// Outcomes of Pick.
const (
	// NoReplica: nothing usable; the request cannot be served.
	NoReplica Outcome = iota
	// Sticky: the conversation's pinned replica.
	Sticky
	// Placed: a new conversation, pinned to the least-loaded replica.
	Placed
	// Replaced: the pin was unusable; the conversation was pinned anew.
	Replaced
	// Spilled: the pin was over its spill threshold; this one request went
	// to the least-loaded replica and the pin stays.
	Spilled
	// ClientPinned: the client chose the replica.
	ClientPinned
	// Unpinned: no key, or affinity off: placed by load alone.
	Unpinned
)

var outcomeNames = [...]string{"no_replica", "sticky", "placed", "replaced", "spilled", "client_pinned", "unpinned"}

func (o Outcome) String() string { return outcomeNames[o] }

// Decision is the replica chosen for a request. Its in-flight count includes
// the request until Release is called, exactly once.
type Decision struct {
	rep     *replicaState
	Outcome Outcome
}

// Replica returns the chosen replica; ok is false for NoReplica.
func (d Decision) Replica() (rep Replica, ok bool) {
	if d.rep == nil {
		return Replica{}, false
	}
	return d.rep.Replica, true
}

// Release gives back the request's in-flight count when it ends, however
// it ends.
func (d Decision) Release() {
	if d.rep != nil {
		d.rep.inFlight.Add(-1)
	}
}

// Pick chooses the replica for a request and counts it in flight there, in
// the same step as the choice.
func (r *Router) Pick(req Request) Decision {
	r.requests.Add(1)
	f := r.fleet.Load()
	if req.ClientReplica != "" {
		if s := f.byID[req.ClientReplica]; s != nil && s.usable() && usableBy(req.Usable, s) {
			s.inFlight.Add(1)
			s.clientPinned.Add(1)
			return Decision{rep: s, Outcome: ClientPinned}
		}
	}
	if req.Key == "" {
		r.unkeyed.Add(1)
		return r.pickByLoad(f, req, 0)
	}
	key := HashKey(req.Key)
	if !r.affinity.Load() {
		return r.pickByLoad(f, req, key)
	}
	now := req.Now.UnixNano()
	sh := r.sessions.shard(key)
	sh.mu.Lock()
	pin := sh.touch(key, now, r.ttl.Load())
	sh.mu.Unlock()
	if pin == nil {
		return r.place(f, req, key, now)
	}
	if !pin.usable() || !usableBy(req.Usable, pin) {
		return r.replace(f, req, key, now)
	}
	threshold, _ := r.SpillThreshold()
	if pin.inFlight.Add(1)-1 <= int64(threshold) {
		pin.sticky.Add(1)
		return Decision{rep: pin, Outcome: Sticky}
	}
	pin.inFlight.Add(-1)
	return r.spill(f, req, key, pin)
}

// place pins a new conversation to the least-loaded replica.
func (r *Router) place(f *fleet, req Request, key uint64, now int64) Decision {
	r.placeMu.Lock()
	defer r.placeMu.Unlock()
	sh := r.sessions.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	// Another request of the same conversation may have placed it meanwhile.
	if pin := sh.touch(key, now, r.ttl.Load()); pin != nil && pin.usable() && usableBy(req.Usable, pin) {
		pin.inFlight.Add(1)
		pin.sticky.Add(1)
		return Decision{rep: pin, Outcome: Sticky}
	}
	s := r.leastLoaded(f, req.Usable, key, true)
	if s == nil {
		r.noReplica.Add(1)
		return Decision{}
	}
	if _, known := sh.byKey[key]; known {
		sh.repin(key, s, now)
	} else {
		r.evicted.Add(uint64(sh.insert(key, s, now)))
	}
	s.inFlight.Add(1)
	s.placed.Add(1)
	s.sticky.Add(1)
	return Decision{rep: s, Outcome: Placed}
}

// replace pins a conversation whose replica became unusable elsewhere.
func (r *Router) replace(f *fleet, req Request, key uint64, now int64) Decision {
	d := r.place(f, req, key, now)
	if d.Outcome == Placed {
		d.rep.placed.Add(^uint64(0)) // counted as a move, not a new conversation
		d.rep.replaced.Add(1)
		d.Outcome = Replaced
	}
	return d
}

// spill sends one request of an overloaded pin to the least-loaded replica,
// unless the pin is itself the least loaded.
func (r *Router) spill(f *fleet, req Request, key uint64, pin *replicaState) Decision {
	r.placeMu.Lock()
	defer r.placeMu.Unlock()
	s := r.leastLoaded(f, req.Usable, key, false)
	if s == nil || s == pin || cost(s, r.spillWeight(), false) >= cost(pin, r.spillWeight(), false) {
		pin.inFlight.Add(1)
		pin.sticky.Add(1)
		return Decision{rep: pin, Outcome: Sticky}
	}
	s.inFlight.Add(1)
	s.spilledIn.Add(1)
	return Decision{rep: s, Outcome: Spilled}
}

// pickByLoad serves a request that has no pin to honour.
func (r *Router) pickByLoad(f *fleet, req Request, key uint64) Decision {
	r.placeMu.Lock()
	defer r.placeMu.Unlock()
	if key == 0 {
		key = r.requests.Load() // rotate ties among equally loaded replicas
	}
	s := r.leastLoaded(f, req.Usable, key, false)
	if s == nil {
		r.noReplica.Add(1)
		return Decision{}
	}
	s.inFlight.Add(1)
	s.unpinned.Add(1)
	return Decision{rep: s, Outcome: Unpinned}
}

func (r *Router) spillWeight() float64 {
	n, _ := r.SpillThreshold()
	return float64(n)
}

func usableBy(usable func(string) bool, s *replicaState) bool {
	return usable == nil || usable(s.Address)
}
