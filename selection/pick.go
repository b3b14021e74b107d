package selection

import (
	"math"
	"time"
)

// Request is what the router needs to know about one request.
type Request struct {
	// Key identifies the session (a session header value); empty when the
	// request carries none. Hash, when not 0, is used instead.
	Key string
	// Hash is the session key already hashed (HashKey, or
	// sessionkey.Hash and Combine); 0 means none: Key is hashed.
	Hash uint64
	// Parent is the hashed key of the conversation this one was spawned by
	// (a sub-agent's agent) or continues; 0 when none. A conversation met
	// for the first time is placed on its parent's replica when that
	// replica has room (see Joined).
	Parent uint64
	// Continues is true when the conversation's prompt starts with its
	// parent's (a fork; a header-less conversation past its first turn):
	// it joins its parent's replica unless that one is over its spill
	// threshold. A spawned sub-agent shares only the parent's system
	// prefix, and joins only a replica about as light as the lightest.
	Continues bool
	// Renamed is true when Parent is this same conversation's earlier key
	// (a header-less conversation's first turn, before it had a reply): once
	// the conversation joins it, the old key no longer counts as an active
	// conversation of its own, so that the conversation is not counted twice
	// as load when placing others.
	Renamed bool
	// Compaction is the request's compaction hint.
	Compaction Compaction
	// ClientReplica is a replica ID the client asked for (client pinning);
	// empty when it asked for none or is not allowed to.
	ClientReplica string
	// PromptTokens is the request's prompt size, estimated (EstimateTokens);
	// 0 when unknown. The router learns the typical prompt from it, which
	// sets the auto spill threshold.
	PromptTokens int
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
	// Joined: a new conversation pinned to its parent's replica (a
	// sub-agent beside its agent, a continuation beside its first turn).
	Joined
	// Compacted: the conversation's prefix was replaced (compaction), so
	// its cache is worthless: it was pinned anew by load, like a new one.
	Compacted
	// Rehomed: the pin has likely evicted the conversation's cache since
	// its last request: it was pinned anew by load, like a new one.
	Rehomed
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"no_replica", "sticky", "placed", "replaced", "spilled", "client_pinned", "unpinned", "adopted", "joined", "compacted", "rehomed"}

// Compaction is what a request says about its conversation's prefix.
type Compaction uint8

// Compaction hints.
const (
	NoCompaction Compaction = iota
	// Compacting: the request that summarises the conversation. Its prompt
	// is the old history, cached on the pin, so it stays there; the
	// conversation's next request is placed anew.
	Compacting
	// CompactedPrefix: the first request on the new, summarised prefix,
	// which no replica holds: placed anew by load.
	CompactedPrefix
)

// ParentSlack is how much more loaded (in placement cost: requests in flight
// and active conversations) than the lightest replica a parent's replica
// may be for a spawned sub-agent to join it: a child shares its parent's
// system prefix, which is worth about one conversation's load, not more, so
// that parallel children of one agent spread.
const ParentSlack = 1.0

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
	// router, key, entry and moves are set for a request on its
	// conversation's pin, so that Release tells the conversation's entry
	// (see rehome.go) unless it has moved or been replaced since.
	router *Router
	key    uint64
	entry  *session
	moves  uint32
	// tokens is the request's prompt size, counted in its replica's
	// pending tokens until Release.
	tokens int64
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
func (d Decision) Release() { d.End(Reply{}) }

// End is Release for a request whose reply is known: what it reports of
// its usage lets the replica's KV cache events follow the conversation
// (chains.go).
func (d Decision) End(reply Reply) {
	if d.rep == nil {
		return
	}
	d.rep.untake(d.tokens)
	if d.router != nil {
		d.router.ended(d, reply)
	}
}

// Pick chooses the replica for a request and counts it in flight there, in
// the same step as the choice.
func (v *View) Pick(req Request) Decision {
	if req.PromptTokens > 0 {
		v.router.observePrompt(req.PromptTokens)
	} else { // unknown size: counted in flight as a typical prompt
		req.PromptTokens = int(math.Round(v.router.typicalOr1()))
	}
	d := v.pick(req)
	if v.cfg.Admission.Enabled && d.Outcome.movesPin() {
		v.follow(req.key(), req.Now.UnixNano())
	}
	if d.rep != nil {
		d.rep.lastSent.Store(req.Now.UnixNano())
		d.tokens = int64(req.PromptTokens)
	}
	return d
}

// key is the request's hashed session key, 0 for none.
func (req Request) key() uint64 {
	if req.Hash != 0 || req.Key == "" {
		return req.Hash
	}
	return HashKey(req.Key)
}

// movesPin reports whether the outcome pinned the conversation anew.
func (o Outcome) movesPin() bool {
	switch o {
	case Placed, Replaced, Adopted, Joined, Compacted, Rehomed:
		return true
	}
	return false
}

func (v *View) pick(req Request) Decision {
	r := v.router
	r.requests.Add(1)
	if req.ClientReplica != "" {
		if s := v.byID[req.ClientReplica]; s != nil && s.healthy.Load() && usableBy(req.Usable, s) {
			s.take(req)
			s.clientPinned.Add(1)
			return Decision{rep: s, Outcome: ClientPinned}
		}
	}
	key := req.key()
	if key == 0 {
		r.unkeyed.Add(1)
		return v.pickByLoad(req, 0)
	}
	if !v.cfg.Affinity {
		return v.pickByLoad(req, key)
	}
	now := req.Now.UnixNano()
	sh := r.sessions.shard(key)
	sh.mu.Lock()
	e := sh.touch(key, now, int64(v.cfg.SessionTTL))
	if e == nil || !v.usable(e.pin, req.Usable) {
		sh.mu.Unlock()
		return v.pinByLoad(req, key, now, placeFresh)
	}
	if req.Compaction != NoCompaction || e.compacted {
		if v.compaction(e, req.Compaction, now) {
			sh.mu.Unlock()
			return v.pinByLoad(req, key, now, placeCompacted)
		}
	}
	if !v.holdsTurns() && e.cold() { // load control keeps residents' caches itself
		sh.mu.Unlock()
		return v.pinByLoad(req, key, now, placeCold)
	}
	pin := e.pin
	threshold, _ := v.SpillThreshold()
	if pin.take(req) <= int64(threshold) {
		pin.sticky.Add(1)
		d := Decision{rep: pin, Outcome: Sticky}.onPin(v, e, key, req.PromptTokens)
		sh.mu.Unlock()
		return d
	}
	pin.untake(int64(req.PromptTokens))
	sh.mu.Unlock()
	d := v.spill(req, key, pin)
	if d.Outcome == Sticky {
		sh.mu.Lock()
		if e := sh.byKey[key]; e != nil {
			d = d.onPin(v, e, key, req.PromptTokens)
		}
		sh.mu.Unlock()
	}
	return d
}

// usable reports whether s may take a request of this view now.
func (v *View) usable(s *replicaState, proxyUsable func(string) bool) bool {
	return s.healthy.Load() && v.has(s) && usableBy(proxyUsable, s)
}

// compaction applies a request's compaction hint to its conversation's
// entry (its shard locked) and reports whether the conversation must be
// placed anew now. A summarising request marks the entry, so that the next
// request, whatever it carries, is placed anew. At most one re-placement per
// conversation per CompactionInterval: a client sending a hint on every
// request does not make its conversation hop.
func (v *View) compaction(e *session, hint Compaction, now int64) bool {
	if hint == Compacting {
		e.compacted = true
		return false
	}
	e.compacted = false
	if now-e.placedAt < int64(v.cfg.CompactionInterval) {
		v.router.compactionsIgnored.Add(1)
		return false
	}
	return true
}

// pinByLoad pins a session to the least-loaded replica: a new one (Placed,
// or Joined when its parent's replica takes it), one whose pin is unusable
// (Replaced), or, with compacted, one whose prefix was replaced
// (Compacted); with a shared pin table, to the replica another router
// pinned it to when that one is usable (Adopted).
func (v *View) pinByLoad(req Request, key uint64, now int64, mode placement) Decision {
	d, previous := v.pinLocally(req, key, now, mode)
	switch d.Outcome {
	case Placed, Replaced, Joined, Compacted, Rehomed:
	default:
		return d
	}
	if d.Outcome == Joined && req.Renamed {
		v.router.retire(req.Parent)
	}
	if v.cfg.Shared != nil && !((d.Outcome == Compacted || d.Outcome == Rehomed) && previous == "") {
		d = v.share(req, key, d, previous)
	}
	switch d.Outcome {
	case Placed:
		d.rep.placed.Add(1)
	case Joined:
		d.rep.placed.Add(1)
		d.rep.joined.Add(1)
	case Replaced:
		d.rep.replaced.Add(1)
	case Compacted:
		d.rep.compacted.Add(1)
	case Rehomed:
		d.rep.rehomed.Add(1)
	}
	return d
}

// retire stops counting key's entry as an active conversation until it is
// used again; the entry keeps its pin.
func (r *Router) retire(key uint64) {
	sh := r.sessions.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.byKey[key]; e != nil && e.active {
		e.active = false
		e.pin.active.Add(-1)
	}
}

// pinOf is the replica key is pinned to, nil when none; it does not count
// as a use of key.
func (r *Router) pinOf(key uint64, now, ttl int64) *replicaState {
	sh := r.sessions.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.byKey[key]; e != nil && now-e.lastSeen <= ttl {
		return e.pin
	}
	return nil
}

// joins reports whether a new conversation goes to its parent's replica p
// rather than to best, the least loaded: p must be usable and within its
// spill threshold, and, for a spawned sub-agent, not more than ParentSlack
// costlier than best.
func (v *View) joins(req Request, p, best *replicaState) bool {
	if p == nil || !v.usable(p, req.Usable) {
		return false
	}
	threshold, _ := v.SpillThreshold()
	if p.inFlight.Load() > int64(threshold) {
		return false
	}
	if req.Continues || p == best {
		return true
	}
	w := v.spillWeight()
	return cost(p, w, true) <= cost(best, w, true)+ParentSlack
}

// pinLocally makes pinByLoad's choice in the router's own table; for a
// moved pin it also returns the previous replica's ID.
func (v *View) pinLocally(req Request, key uint64, now int64, mode placement) (d Decision, previous string) {
	moving := mode != placeFresh // off a usable pin
	r := v.router
	r.placeMu.Lock()
	defer r.placeMu.Unlock()
	ttl := int64(v.cfg.SessionTTL)
	var parent *replicaState
	if req.Parent != 0 && req.Parent != key {
		parent = r.pinOf(req.Parent, now, ttl) // before key's shard: it may be the same
	}
	sh := r.sessions.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.touch(key, now, ttl)
	// Another request of the same session may have placed it meanwhile
	// (or, for a compaction or a cold cache, placed it anew).
	if e != nil && v.usable(e.pin, req.Usable) && !v.stillMoves(e, mode, now) {
		e.pin.take(req)
		e.pin.sticky.Add(1)
		return Decision{rep: e.pin, Outcome: Sticky}.onPin(v, e, key, req.PromptTokens), ""
	}
	// A conversation moving off a usable pin is placed like a new one: its
	// own activity does not weigh on the replica it leaves.
	uncounted := moving && e != nil && e.active
	if uncounted {
		e.pin.active.Add(-1)
	}
	s := v.placeFor(req.Usable, key, mode)
	if uncounted {
		e.pin.active.Add(1)
	}
	if s == nil {
		r.noReplica.Add(1)
		return Decision{}, ""
	}
	outcome := Placed
	if e == nil && v.joins(req, parent, s) {
		s, outcome = parent, Joined
	}
	s.take(req)
	if e == nil {
		ne, dropped := sh.insert(key, s, now)
		ne.compacted = req.Compaction == Compacting
		r.evicted.Add(uint64(dropped))
		return Decision{rep: s, Outcome: outcome}.onPin(v, ne, key, req.PromptTokens), ""
	}
	e.placedAt = now
	if moving {
		if e.pin != s {
			previous = e.pin.ID
			e.repin(s)
		}
		return Decision{rep: s, Outcome: mode.outcome()}.onPin(v, e, key, req.PromptTokens), previous
	}
	previous = e.pin.ID
	e.repin(s)
	return Decision{rep: s, Outcome: Replaced}.onPin(v, e, key, req.PromptTokens), previous
}

// spill sends one request of an overloaded pin elsewhere: to the replica
// with room sent a request longest ago (leastRecent), else to the one with
// the fewest prompt tokens in flight (leastPending) when it has fewer than
// the pin.
func (v *View) spill(req Request, key uint64, pin *replicaState) Decision {
	r := v.router
	r.placeMu.Lock()
	defer r.placeMu.Unlock()
	// The spilled request's history is cached nowhere else: the replica
	// with room sent a request longest ago starts its prefill soonest.
	s := v.leastRecent(req.Usable, key, func(c *replicaState) bool { return c != pin })
	if s == nil {
		s = v.leastPending(req.Usable, key)
		if s == nil || s == pin || v.pendingTokens(s) >= v.pendingTokens(pin) {
			pin.take(req)
			pin.sticky.Add(1)
			return Decision{rep: pin, Outcome: Sticky}
		}
	}
	s.take(req)
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
	s.take(req)
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
