package selection

import (
	"time"
)

// Request is what the router needs to know about one request.
type Request struct {
	// Key identifies the session (a session header value); empty when the
	// request carries none.
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
	// Sticky: the session's pinned replica.
	Sticky
	// Placed: a new session, pinned to the least-loaded replica.
	Placed
	// Replaced: the pin was unusable; the session was pinned anew.
	Replaced
	// Spilled: the pin was over its spill threshold; this one request went
	// to the least-loaded replica and the pin stays.
	Spilled
	// ClientPinned: the client chose the replica.
	ClientPinned
	// Unpinned: no key, or affinity off: placed by load alone.
	Unpinned
	// Adopted: a conversation new to this router that another router
	// sharing the pin table had pinned: routed to that pin.
	Adopted
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"no_replica", "sticky", "placed", "replaced", "spilled", "client_pinned", "unpinned", "adopted"}

func (o Outcome) String() string {
	if o >= numOutcomes {
		return "unknown"
	}
	return outcomeNames[o]
}

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
func (v *View) Pick(req Request) Decision {
	r := v.router
	r.requests.Add(1)
	if req.ClientReplica != "" {
		if s := v.byID[req.ClientReplica]; s != nil && s.healthy.Load() && usableBy(req.Usable, s) {
			s.inFlight.Add(1)
			s.clientPinned.Add(1)
			return Decision{rep: s, Outcome: ClientPinned}
		}
	}
	if req.Key == "" {
		r.unkeyed.Add(1)
		return v.pickByLoad(req, 0)
	}
	key := HashKey(req.Key)
	if !v.cfg.Affinity {
		return v.pickByLoad(req, key)
	}
	now := req.Now.UnixNano()
	sh := r.sessions.shard(key)
	sh.mu.Lock()
	e := sh.touch(key, now, int64(v.cfg.SessionTTL))
	if e == nil || !v.usable(e.pin, req.Usable) {
		sh.mu.Unlock()
		return v.pinByLoad(req, key, now)
	}
	pin := e.pin
	threshold, _ := v.SpillThreshold()
	if pin.inFlight.Add(1)-1 <= int64(threshold) {
		pin.sticky.Add(1)
		sh.mu.Unlock()
		return Decision{rep: pin, Outcome: Sticky}
	}
	pin.inFlight.Add(-1)
	sh.mu.Unlock()
	return v.spill(req, key, pin)
}

// usable reports whether s may take a request of this view now.
func (v *View) usable(s *replicaState, proxyUsable func(string) bool) bool {
	return s.healthy.Load() && v.has(s) && usableBy(proxyUsable, s)
}

// pinByLoad pins a session to the least-loaded replica: a new one (Placed),
// or one whose pin is unusable (Replaced); with a shared pin table, to the
// replica another router pinned it to when that one is usable (Adopted).
func (v *View) pinByLoad(req Request, key uint64, now int64) Decision {
	d, previous := v.pinLocally(req, key, now)
	if d.Outcome != Placed && d.Outcome != Replaced {
		return d
	}
	if v.cfg.Shared != nil {
		d = v.share(req, key, d, previous)
	}
	switch d.Outcome {
	case Placed:
		d.rep.placed.Add(1)
	case Replaced:
		d.rep.replaced.Add(1)
	}
	return d
}

// pinLocally makes pinByLoad's choice in the router's own table; for a
// replaced pin it also returns the previous replica's ID.
func (v *View) pinLocally(req Request, key uint64, now int64) (d Decision, previous string) {
	r := v.router
	r.placeMu.Lock()
	defer r.placeMu.Unlock()
	sh := r.sessions.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.touch(key, now, int64(v.cfg.SessionTTL))
	// Another request of the same session may have placed it meanwhile.
	if e != nil && v.usable(e.pin, req.Usable) {
		e.pin.inFlight.Add(1)
		e.pin.sticky.Add(1)
		return Decision{rep: e.pin, Outcome: Sticky}, ""
	}
	s := v.leastLoaded(req.Usable, key, true)
	if s == nil {
		r.noReplica.Add(1)
		return Decision{}, ""
	}
	s.inFlight.Add(1)
	if e == nil {
		_, dropped := sh.insert(key, s, now)
		r.evicted.Add(uint64(dropped))
		return Decision{rep: s, Outcome: Placed}, ""
	}
	previous = e.pin.ID
	e.repin(s)
	return Decision{rep: s, Outcome: Replaced}, previous
}

// spill sends one request of an overloaded pin to the least-loaded replica,
// unless the pin is itself the least loaded.
func (v *View) spill(req Request, key uint64, pin *replicaState) Decision {
	r := v.router
	r.placeMu.Lock()
	defer r.placeMu.Unlock()
	weight := v.spillWeight()
	s := v.leastLoaded(req.Usable, key, false)
	if s == nil || s == pin || cost(s, weight, false) >= cost(pin, weight, false) {
		pin.inFlight.Add(1)
		pin.sticky.Add(1)
		return Decision{rep: pin, Outcome: Sticky}
	}
	s.inFlight.Add(1)
	s.spilledIn.Add(1)
	return Decision{rep: s, Outcome: Spilled}
}

// pickByLoad serves a request that has no pin to honour.
func (v *View) pickByLoad(req Request, key uint64) Decision {
	r := v.router
	r.placeMu.Lock()
	defer r.placeMu.Unlock()
	if key == 0 {
		key = r.requests.Load() // rotate ties among equally loaded replicas
	}
	s := v.leastLoaded(req.Usable, key, false)
	if s == nil {
		r.noReplica.Add(1)
		return Decision{}
	}
	s.inFlight.Add(1)
	s.unpinned.Add(1)
	return Decision{rep: s, Outcome: Unpinned}
}

func (v *View) spillWeight() float64 {
	n, _ := v.SpillThreshold()
	return float64(n)
}

func usableBy(usable func(string) bool, s *replicaState) bool {
	return usable == nil || usable(s.Address)
}
