package selection

import (
	"math"

	"github.com/lmwarden/caddy-warden/sessionkey"
)

// cost is how loaded a replica is, lower is better. For a request
// without a conversation:
//
//	busy + slots × kv_used
//
// and for placing a conversation (withSessions):
//
//	busy + active sessions [+ slots while the load is unknown]
//
// busy is our in-flight requests plus other clients' requests that two
// scrapes in a row have shown (replicaState.busy); kv_used is the KV-cache
// fill (1 when metrics are missing or stale), weighted by the replica's
// slots (cost.go) so that a full cache weighs as much as every slot taken:
// an unknown replica looks full, never idle. A conversation weighs on its
// replica for its whole life, so its placement counts the sessions the
// replica serves (active within the active window), each about to send
// its next turn, and not the cache's fill: the context of the requests
// running at that instant, lowest where conversations are between turns
// and about to send the next (docs/routing.md).
func (v *View) cost(s *replicaState, withSessions bool) float64 {
	if !withSessions {
		return s.busy() + v.slots(s)*s.kvUsage()
	}
	c := s.busy() + float64(s.active.Load())
	if !s.load.Load().Known {
		c += v.slots(s)
	}
	return c
}

// leastLoaded returns the usable replica of lowest cost, ties broken by a
// rendezvous hash of key so that equal replicas are chosen evenly and
// deterministically. When no replica is healthy it falls back to those the
// proxy can reach, as unknown beats refusing every request.
func (v *View) leastLoaded(usable func(string) bool, key uint64, withSessions bool) *replicaState {
	return v.lightest(usable, key, withSessions, nil)
}

// lightest is leastLoaded among the replicas fits accepts (nil: all).
func (v *View) lightest(usable func(string) bool, key uint64, withSessions bool, fits func(*replicaState) bool) *replicaState {
	return v.lowest(usable, key, fits, func(s *replicaState) float64 { return v.cost(s, withSessions) })
}

// lowest is the usable replica, among those fits accepts (nil: all), of
// lowest costOf, healthy ones first, ties broken by a rendezvous hash of key
// so that equal replicas are chosen evenly and deterministically; nil when
// none is usable.
func (v *View) lowest(usable func(string) bool, key uint64, fits func(*replicaState) bool, costOf func(*replicaState) float64) *replicaState {
	for _, needHealthy := range [2]bool{true, false} {
		var best *replicaState
		var bestCost float64
		var bestRank uint64
		for _, s := range v.replicas {
			if (needHealthy && !s.healthy.Load()) || !usableBy(usable, s) || (fits != nil && !fits(s)) {
				continue
			}
			c, rank := costOf(s), mix(key^s.idHash)
			if best == nil || c < bestCost || (c == bestCost && rank > bestRank) {
				best, bestCost, bestRank = s, c, rank
			}
		}
		if best != nil {
			return best
		}
	}
	return nil
}

// pendingTokens is how much prefill work a request sent to s now waits
// behind, as the proxy knows it: the prompt tokens of our requests in
// flight there (a request of unknown size counts as a typical prompt), plus
// other clients' requests (busy's external part) at the typical prompt; a
// replica without fresh metrics counts as full, a spill threshold's worth
// of typical prompts more, as in cost. When every replica is at its spill
// threshold the engines queue, and a cacheless request waits mostly for the
// prefills ahead of it: a count of requests in flight weighs a short
// sub-agent prompt as much as a long conversation's, and KV use cannot tell
// a prefill in progress from a finished one.
func (v *View) pendingTokens(s *replicaState) float64 {
	typical := v.router.typicalOr1()
	l := s.load.Load()
	c := float64(s.pending.Load()) + l.external*typical
	if !l.Known {
		c += v.slots(s) * typical
	}
	return c
}

// leastPending is the usable replica with the fewest pendingTokens, healthy
// ones first, ties broken by a rendezvous hash of key; nil when none is
// usable.
func (v *View) leastPending(usable func(string) bool, key uint64) *replicaState {
	return v.lowest(usable, key, nil, v.pendingTokens)
}

// PlacementSlack is how much costlier than the lightest replica (in
// placement cost) a new conversation's replica may be, among those with the
// fewest active conversations, so that the one sent a request longest ago
// takes it (measured on the workload grid: docs/research/policy.md).
const PlacementSlack = 1.0

// freshPlace is where a new conversation goes: it weighs on its replica
// for its whole life (active conversations) and its first turn is a long
// prefill, so among the replicas with the fewest active conversations and
// within PlacementSlack of the lightest, the one sent a request longest
// ago; nil when none has room.
func (v *View) freshPlace(req Request, key uint64) *replicaState {
	usable := req.Usable
	best := v.leastLoaded(usable, key, true)
	if best == nil {
		return nil
	}
	limit := v.cost(best, true) + PlacementSlack
	fewest := best.active.Load()
	for _, s := range v.replicas {
		if v.usable(s, usable) {
			fewest = min(fewest, s.active.Load())
		}
	}
	if rate := v.prefillRate(); rate > 0 {
		// Load only breaks ties, as a conversation silent there does not
		// delay this first turn; but all of it, requests in flight
		// included, as a request running there shares every step with it.
		now, elsewhere := req.Now.UnixNano(), v.uncachedElsewhere(req.PromptTokens)
		return v.lowest(usable, key, func(s *replicaState) bool { return s.healthy.Load() && v.cost(s, true) <= limit },
			func(s *replicaState) float64 {
				return math.Round(v.turnCost(s, req.PromptTokens, elsewhere, now, rate)*1000) + v.cost(s, true)/1e6
			})
	}
	return v.leastRecent(usable, key, func(s *replicaState) bool { return s.active.Load() <= fewest && v.cost(s, true) <= limit })
}

// leastRecent is the healthy, usable replica with a free slot (cost.go),
// among those ok accepts (nil: all), that was sent a request
// longest ago, ties broken by a rendezvous hash of key; nil when none has
// room. Its last prefill has had the most time to end: requests in flight
// and KV use cannot tell a replica prefilling a long prompt, which delays
// the next first token by as long, from one decoding, which barely does
// (a prefill in progress even shows less KV use than a finished one).
func (v *View) leastRecent(usable func(string) bool, key uint64, ok func(*replicaState) bool) *replicaState {
	var best *replicaState
	var bestSent int64
	var bestRank uint64
	for _, s := range v.replicas {
		if !s.healthy.Load() || !usableBy(usable, s) || v.full(s) || ok != nil && !ok(s) {
			continue
		}
		sent, rank := s.lastSent.Load(), mix(key^s.idHash)
		if best == nil || sent < bestSent || sent == bestSent && rank > bestRank {
			best, bestSent, bestRank = s, sent, rank
		}
	}
	return best
}

// HashKey turns a session key into the 64-bit value the table stores (raw
// keys are never kept): sessionkey.Hash, so that keys read from requests
// find pins made from raw keys (snapshots, shared pins, the lab).
func HashKey(key string) uint64 { return sessionkey.Hash(key) }

// mix is the splitmix64 finaliser: a cheap bijection that spreads the bits
// of key XOR replica hash, for rendezvous tie-breaks.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
