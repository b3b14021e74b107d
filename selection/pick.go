package selection

import (
	"math"
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
	"github.com/lmwarden/caddy-warden/promptprefix"
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
	// Prefix is the request's system prompt and tool parts, read from its
	// body when WantsPrefix asked for them; nil otherwise.
	Prefix promptprefix.Prefix
	// CountOnly marks a request that only asks the size of its prompt
	// (Anthropic's count_tokens): it goes to its conversation's replica,
	// whose tokenizer answers it, but is no turn: it computes nothing, and
	// neither places nor moves the conversation, nor tells of its cache or
	// of the turns' duration.
	CountOnly bool
	// Flow is the hashed identity of whom the request is for (a person, an
	// API key), never its clear value; 0 is a flow like any other. Load
	// control serves the flows' waiting turns round robin (flows.go), each
	// with FlowWeight turns a round (0 is 1).
	Flow       uint64
	FlowWeight float64
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
	// Spilled: another replica would start the turn sooner than its pin,
	// even counting the prefill the move repeats, or the pin was over a
	// manual spill threshold: the conversation moved there.
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
	// Rehomed: the pin had likely evicted most of the conversation's cache
	// since its last request, and another replica would start the turn
	// sooner: the conversation moved there.
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
	// (see cached.go) unless it has moved or been replaced since.
	router *Router
	key    uint64
	entry  *session
	moves  uint32
	// prompt is the request's prompt size and uncached the part its
	// replica computes, counted there until Release; sent is when it was
	// routed, by from, when it was a turn (not CountOnly).
	prompt, uncached int
	sent             int64
	from             *Router
}

// Replica returns the chosen replica; ok is false for NoReplica.
func (d Decision) Replica() (rep Replica, ok bool) {
	if d.rep == nil {
		return Replica{}, false
	}
	return d.rep.Replica, true
}

// Release gives back the request's in-flight count when it ends without
// a reply (a failed try, a request given up).
func (d Decision) Release() { d.end(loadcontrol.Reply{}) }

// End is Release for a request that ended at now: its duration teaches the
// turns' duration (cost.go), and what reply reports of its usage lets the
// replica's KV cache events follow the conversation (chains.go).
func (d Decision) End(now time.Time, reply loadcontrol.Reply) {
	if d.from != nil {
		d.from.observeTurn(now.UnixNano() - d.sent)
	}
	d.end(reply)
}

func (d Decision) end(reply loadcontrol.Reply) {
	if d.rep == nil {
		return
	}
	d.rep.untake(d.prompt, d.uncached)
	if d.router != nil {
		d.router.ended(d, reply)
	}
}

// Pick chooses the replica for a request and counts it in flight there, in
// the same step as the choice.
func (v *View) Pick(req Request) Decision {
	if req.CountOnly {
		return v.count(req)
	}
	if req.PromptTokens > 0 {
		v.router.observePrompt(req.PromptTokens)
	} else { // unknown size: counted in flight as a typical prompt
		req.PromptTokens = int(math.Round(v.router.typicalOr1()))
	}
	d := v.pick(req)
	if v.cfg.Admission.Enabled && d.Outcome.movesPin() {
		v.lc.Follow(req.key(), req.Now.UnixNano())
	}
	if d.rep != nil {
		d.rep.lastSent.Store(req.Now.UnixNano())
		d.sent, d.from = req.Now.UnixNano(), v.router
	}
	return d
}

// count routes a CountOnly request: to its conversation's replica when it
// has a usable one, else by load, pinning nothing.
func (v *View) count(req Request) Decision {
	req.PromptTokens = 0 // no turn's work: counted in flight, not in pending
	v.router.requests.Add(1)
	if key := req.key(); key != 0 && v.cfg.Affinity {
		if pin := v.router.pinOf(key, req.Now.UnixNano(), int64(v.cfg.SessionTTL)); pin != nil && v.usable(pin, req.Usable) {
			pin.sticky.Add(1)
			return v.send(pin, req, 0, Sticky)
		}
	}
	return v.pickByLoad(req, req.key())
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
	case Placed, Replaced, Adopted, Joined, Compacted, Spilled, Rehomed:
		return true
	}
	return false
}

func (v *View) pick(req Request) Decision {
	r := v.router
	r.requests.Add(1)
	if req.ClientReplica != "" {
		if s := v.byID[req.ClientReplica]; s != nil && s.healthy.Load() && usableBy(req.Usable, s) {
			s.clientPinned.Add(1)
			return v.send(s, req, req.PromptTokens, ClientPinned)
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
	e := sh.entry(key, now, int64(v.cfg.SessionTTL))
	if e != nil && e.busy == 0 {
		r.observeGap(now - e.lastSeen)
	}
	e = sh.touch(key, now, int64(v.cfg.SessionTTL))
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
	if v.mayMove(e, req, now) {
		sh.mu.Unlock()
		return v.pinByLoad(req, key, now, placeCheaper)
	}
	d := v.stay(e, req, key)
	sh.mu.Unlock()
	return d
}

// stay routes a request to its conversation's pin (e, its shard locked).
func (v *View) stay(e *session, req Request, key uint64) Decision {
	e.pin.sticky.Add(1)
	e.pin.host.sent.Add(int64(e.evictedAtPin(e.cachedTokens(), v.router.sharedTokens())))
	uncached := v.uncachedAtPin(e, req)
	return v.send(e.pin, req, uncached, Sticky).onPin(v, e, key, req.PromptTokens)
}

// mayMove reports whether the turn might be served better off its pin (e,
// its shard locked): the pin is over a manual spill threshold, or it is
// not sure that no replica would start the turn sooner (cost.go). While
// turns wait for room in load control, its residents stay where their
// caches are, moved only over a manual threshold.
func (v *View) mayMove(e *session, req Request, now int64) bool {
	if v.overThreshold(e.pin) {
		return true
	}
	if v.keepsResidents() {
		return false
	}
	rate := v.prefillRate()
	return v.mayGain(e.pin, req.PromptTokens, v.uncachedAtPin(e, req), v.uncachedElsewhere(req.PromptTokens), now, rate)
}

// moveTarget is where the conversation (e, on a usable pin, its shard
// locked) should move for this turn, nil to stay: the replica where the
// turn would start soonest, if that gains over the pin (cost.go); over a
// manual spill threshold, that replica whatever the gain, if it is under
// the threshold itself.
func (v *View) moveTarget(e *session, req Request, key uint64, now int64) *replicaState {
	if v.overThreshold(e.pin) {
		rate, elsewhere := max(v.prefillRate(), 1), v.uncachedElsewhere(req.PromptTokens)
		return v.lowest(req.Usable, key, func(s *replicaState) bool {
			return s != e.pin && s.healthy.Load() && !v.full(s)
		}, func(s *replicaState) float64 { return v.turnCost(s, req.PromptTokens, elsewhere, now, rate) })
	}
	if v.keepsResidents() {
		return nil
	}
	return v.cheaperThan(e, req, key, now)
}

// send counts req in flight at s, uncached of its prompt tokens to compute
// there, and returns the decision that gives them back.
func (v *View) send(s *replicaState, req Request, uncached int, o Outcome) Decision {
	s.take(req.PromptTokens, uncached, req.Now.UnixNano(), v.prefillRate())
	return Decision{rep: s, Outcome: o, prompt: req.PromptTokens, uncached: uncached}
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
	case Placed, Replaced, Joined, Compacted, Spilled, Rehomed:
	default:
		return d
	}
	if d.Outcome == Joined && req.Renamed {
		v.router.retire(req.Parent)
	}
	if v.cfg.Shared != nil && !(mode != placeFresh && previous == "") {
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
	case Spilled:
		d.rep.spilledIn.Add(1)
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

// full reports whether s has no room for one more request: it runs as many
// as it can at once (its slots), or as a manual spill threshold allows.
func (v *View) full(s *replicaState) bool {
	if n := v.cfg.SpillThreshold; n > 0 {
		return s.busy() >= float64(n)
	}
	return s.busy() >= v.slots(s)
}

// overThreshold reports whether s runs more requests than a manual spill
// threshold allows.
func (v *View) overThreshold(s *replicaState) bool {
	return v.cfg.SpillThreshold > 0 && s.busy() > float64(v.cfg.SpillThreshold)
}

// knows reports whether key has an entry in the session table.
func (r *Router) knows(key uint64) bool {
	sh := r.sessions.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.byKey[key] != nil
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
// rather than to best, the least loaded: p must be usable and not full,
// and, for a spawned sub-agent, not more than ParentSlack
// costlier than best.
func (v *View) joins(req Request, p, best *replicaState) bool {
	if p == nil || !v.usable(p, req.Usable) {
		return false
	}
	if v.overThreshold(p) || v.cfg.SpillThreshold <= 0 && v.full(p) {
		return false
	}
	if req.Continues || p == best {
		return true
	}
	return v.cost(p, true) <= v.cost(best, true)+ParentSlack
}

// placement is why pinByLoad places a conversation.
type placement uint8

const (
	placeFresh     placement = iota // new, or its pin unusable
	placeCompacted                  // its prefix was replaced
	placeCheaper                    // another replica may serve its turn sooner
)

// pinLocally makes pinByLoad's choice in the router's own table; for a
// moved pin it also returns the previous replica's ID.
func (v *View) pinLocally(req Request, key uint64, now int64, mode placement) (d Decision, previous string) {
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
	// (or, for a compaction or a move, placed it anew): the choice is made
	// again with the lock held.
	var s *replicaState
	if e != nil && v.usable(e.pin, req.Usable) {
		switch {
		case mode == placeCompacted && now-e.placedAt >= int64(v.cfg.CompactionInterval):
			s = v.placeAnew(req.Usable, key, e)
		case mode == placeCheaper:
			s = v.moveTarget(e, req, key, now)
		}
		if s == nil {
			return v.stay(e, req, key), ""
		}
	} else if s = v.freshPlace(req, key); s == nil {
		s = v.leastPending(req.Usable, key)
	}
	if s == nil {
		r.noReplica.Add(1)
		return Decision{}, ""
	}
	if e == nil {
		r.prefix.noteRequest(key, req.Prefix)
		outcome := Placed
		if v.joins(req, parent, s) {
			s, outcome = parent, Joined
		}
		ne, dropped := sh.insert(key, s, now)
		ne.compacted = req.Compaction == Compacting
		r.evicted.Add(uint64(dropped))
		return v.send(s, req, v.uncachedElsewhere(req.PromptTokens), outcome).onPin(v, ne, key, req.PromptTokens), ""
	}
	outcome := Replaced
	switch {
	case mode == placeCompacted:
		outcome = Compacted
	case mode == placeCheaper && 2*e.cachedTokens() < e.lastPrompt:
		outcome = Rehomed
	case mode == placeCheaper:
		outcome = Spilled
	}
	e.placedAt = now
	if e.pin != s {
		previous = e.pin.ID
		e.repin(s)
	}
	return v.send(s, req, v.uncachedElsewhere(req.PromptTokens), outcome).onPin(v, e, key, req.PromptTokens), previous
}

// placeAnew is where a conversation whose prefix was replaced (e, on a
// usable pin) goes: the least-loaded replica, its own activity not weighing
// on the pin it leaves.
func (v *View) placeAnew(usable func(string) bool, key uint64, e *session) *replicaState {
	if e.active {
		e.pin.active.Add(-1)
		defer e.pin.active.Add(1)
	}
	return v.leastLoaded(usable, key, true)
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
	s.unpinned.Add(1)
	return v.send(s, req, req.PromptTokens, Unpinned)
}

func usableBy(usable func(string) bool, s *replicaState) bool {
	return usable == nil || usable(s.Address)
}
