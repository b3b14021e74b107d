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
	// PromptBytes is the size of the request body (Content-Length), 0 when
	// unknown; RuleCacheFit estimates the prompt's tokens from it.
	PromptBytes int64
	Now         time.Time
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
	// Moved: the pin had most likely evicted the conversation's prefix
	// (RuleCacheFit); it was pinned anew by load.
	Moved
)

var outcomeNames = [...]string{"no_replica", "sticky", "placed", "replaced", "spilled", "client_pinned", "unpinned", "moved"}

func (o Outcome) String() string { return outcomeNames[o] }

// Decision is the replica chosen for a request. Its in-flight count includes
// the request until Release is called, exactly once.
type Decision struct {
	rep *replicaState
	// conv is the conversation whose pin took the request, to mark when its
	// blocks become evictable again; nil otherwise.
	conv *session
	// tokens is the request's estimated prompt tokens, 0 when unknown.
	tokens  int64
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
	if d.rep == nil {
		return
	}
	d.rep.inFlight.Add(-1)
	held := d.rep.held.Add(-d.tokens)
	if d.conv != nil {
		d.conv.evictedAt.Store(evictionPoint(d.rep, held, d.tokens))
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
	tokens := r.promptTokens(req)
	sh := r.sessions.shard(key)
	sh.mu.Lock()
	e := sh.touch(key, now, r.ttl.Load())
	if e == nil {
		sh.mu.Unlock()
		return r.place(f, req, key, now, tokens)
	}
	pin := e.pin
	if !pin.usable() || !usableBy(req.Usable, pin) {
		sh.mu.Unlock()
		return r.replace(f, req, key, now, tokens)
	}
	if rule(r.rule.Load()) == ruleCacheFit && likelyEvicted(e) {
		sh.mu.Unlock()
		return r.move(f, req, key, now, tokens)
	}
	threshold, _ := r.SpillThreshold()
	if pin.inFlight.Add(1)-1 <= int64(threshold) {
		pin.sticky.Add(1)
		account(e, pin, tokens, true)
		sh.mu.Unlock()
		return Decision{rep: pin, conv: e, tokens: tokens, Outcome: Sticky}
	}
	pin.inFlight.Add(-1)
	sh.mu.Unlock()
	return r.spill(f, req, key, pin, tokens)
}

// place pins a new conversation to the least-loaded replica.
func (r *Router) place(f *fleet, req Request, key uint64, now, tokens int64) Decision {
	return r.pinByLoad(f, req, key, now, tokens, false)
}

// pinByLoad pins a conversation to the least-loaded replica: a new one, or
// with evicted set one whose pin likely evicted it (kept if the pin is still
// the least loaded). A conversation already known is moved, not counted as
// a new one.
func (r *Router) pinByLoad(f *fleet, req Request, key uint64, now, tokens int64, evicted bool) Decision {
	r.placeMu.Lock()
	defer r.placeMu.Unlock()
	sh := r.sessions.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.touch(key, now, r.ttl.Load())
	// Another request of the same conversation may have placed it meanwhile.
	if e != nil && !evicted && e.pin.usable() && usableBy(req.Usable, e.pin) {
		e.pin.inFlight.Add(1)
		e.pin.sticky.Add(1)
		account(e, e.pin, tokens, true)
		return Decision{rep: e.pin, conv: e, tokens: tokens, Outcome: Sticky}
	}
	s := r.leastLoaded(f, req.Usable, key, true)
	if s == nil {
		r.noReplica.Add(1)
		return Decision{}
	}
	outcome := Placed
	switch {
	case e == nil:
		var dropped int
		e, dropped = sh.insert(key, s, now)
		r.evicted.Add(uint64(dropped))
		s.placed.Add(1)
	case evicted:
		outcome = Moved
		if s != e.pin {
			e.repin(s)
		}
		s.moved.Add(1)
	default:
		outcome = Replaced
		e.repin(s)
		s.replaced.Add(1)
	}
	s.inFlight.Add(1)
	s.sticky.Add(1)
	account(e, s, tokens, false)
	return Decision{rep: s, conv: e, tokens: tokens, Outcome: outcome}
}

// replace pins a conversation whose replica became unusable elsewhere.
func (r *Router) replace(f *fleet, req Request, key uint64, now, tokens int64) Decision {
	return r.pinByLoad(f, req, key, now, tokens, false)
}

// move pins anew a conversation whose pin likely evicted its prefix.
func (r *Router) move(f *fleet, req Request, key uint64, now, tokens int64) Decision {
	return r.pinByLoad(f, req, key, now, tokens, true)
}

// spill sends one request of an overloaded pin to the least-loaded replica,
// unless the pin is itself the least loaded.
func (r *Router) spill(f *fleet, req Request, key uint64, pin *replicaState, tokens int64) Decision {
	r.placeMu.Lock()
	defer r.placeMu.Unlock()
	s := r.leastLoaded(f, req.Usable, key, false)
	if s == nil || s == pin || cost(s, r.spillWeight(), false) >= cost(pin, r.spillWeight(), false) {
		return r.stickAfterAll(pin, key, req.Now.UnixNano(), tokens)
	}
	s.inFlight.Add(1)
	s.spilledIn.Add(1)
	s.allocated.Add(tokens) // a stranger there: the whole prompt is computed
	s.held.Add(tokens)
	return Decision{rep: s, tokens: tokens, Outcome: Spilled}
}

// stickAfterAll serves a request on its pin when spilling found nothing lighter.
func (r *Router) stickAfterAll(pin *replicaState, key uint64, now, tokens int64) Decision {
	sh := r.sessions.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	pin.inFlight.Add(1)
	pin.sticky.Add(1)
	e := sh.touch(key, now, r.ttl.Load())
	if e == nil || e.pin != pin {
		pin.held.Add(tokens)
		return Decision{rep: pin, tokens: tokens, Outcome: Sticky}
	}
	account(e, pin, tokens, true)
	return Decision{rep: pin, conv: e, tokens: tokens, Outcome: Sticky}
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
