package selection

import "github.com/cespare/xxhash/v2"

// cost is how loaded a replica is, lower is better:
//
//	busy + kvWeight × kv_used [+ active sessions]
//
// busy is our in-flight requests plus other clients' requests that two
// scrapes in a row have shown (replicaState.busy); kv_used
// is the KV-cache fill (1 when metrics are missing or stale, so an unknown
// replica looks full, never idle); kvWeight is the spill threshold, so a full
// cache weighs as much as a replica at its threshold. When placing a new
// session the sessions the replica already serves (active within the
// active window) are added: each will send its next turn soon.
func cost(s *replicaState, kvWeight float64, withSessions bool) float64 {
	c := s.busy() + kvWeight*s.kvUsage()
	if withSessions {
		c += float64(s.active.Load())
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
	kvWeight := v.spillWeight()
	for _, needHealthy := range [2]bool{true, false} {
		var best *replicaState
		var bestCost float64
		var bestRank uint64
		for _, s := range v.replicas {
			if (needHealthy && !s.healthy.Load()) || !usableBy(usable, s) || (fits != nil && !fits(s)) {
				continue
			}
			c := cost(s, kvWeight, withSessions)
			rank := mix(key ^ s.idHash)
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

// HashKey turns a session key into the 64-bit value the table stores: raw
// keys are never kept. xxhash (as Caddy's own hashing policies use) is
// stable across processes, so runs are reproducible.
func HashKey(key string) uint64 {
	h := xxhash.Sum64String(key)
	if h == 0 { // 0 stands for "no key" in tie-breaks
		h = 1
	}
	return h
}

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
