package selection

import (
	"fmt"
	"math"
)

// Rules a router can follow (Config.Rule).
const (
	// RuleSeed is the seed's rule and the default: pin each conversation to
	// the least-loaded replica, spill single requests past the spill
	// threshold. No other rule beat it in the lab (docs/policy.md).
	RuleSeed = "seed"
	// RuleCacheFit is the seed's rule plus cache-fit awareness, an
	// experiment (docs/policy.md: it loses hits at 16 sessions and gains
	// nothing beyond). The router keeps, per replica, a running count of the KV
	// tokens its requests made the replica allocate, and per conversation the
	// count when its last request ended. When more tokens were allocated
	// since than the replica's KV capacity left beside the conversation, its
	// prefix has most likely been evicted (vLLM evicts least recently used
	// blocks first): the next turn would recompute it wherever it goes, so
	// it is placed anew by load and pinned there (Outcome Moved) instead of
	// queueing behind its old replica. It needs the prompt's size
	// (Request.PromptBytes) and the capacity (Load.KVCapacityTokens); without
	// either it behaves as RuleSeed.
	RuleCacheFit = "cachefit"
)

// DefaultBytesPerToken converts a request body's size into prompt tokens
// (RuleCacheFit): about 4 bytes per token for English and code.
const DefaultBytesPerToken = 4

type rule uint8

const (
	ruleSeed rule = iota
	ruleCacheFit
)

var ruleNames = [...]string{RuleSeed, RuleCacheFit}

// CheckRule reports whether name is a rule the router knows ("" is the default).
func CheckRule(name string) error {
	if _, ok := parseRule(name); !ok {
		return fmt.Errorf("unknown routing rule %q (known: %v)", name, ruleNames)
	}
	return nil
}

func parseRule(name string) (rule, bool) {
	if name == "" {
		return ruleSeed, true
	}
	for i, n := range ruleNames {
		if n == name {
			return rule(i), true
		}
	}
	return ruleSeed, false
}

// Rule returns the name of the rule in force.
func (r *Router) Rule() string { return ruleNames[r.rule.Load()] }

// promptTokens estimates the request's prompt tokens, 0 when unknown.
func (r *Router) promptTokens(req Request) int64 {
	if req.PromptBytes <= 0 {
		return 0
	}
	return int64(math.Ceil(float64(req.PromptBytes) / math.Float64frombits(r.bytesPerToken.Load())))
}

// likelyEvicted reports whether conversation e's prefix has most likely left
// its pin's prefix cache.
func likelyEvicted(e *session) bool {
	return e.pin.allocated.Load() > e.evictedAt.Load()
}

// evictionPoint is where, on s's allocated count, a prefix of tokens tokens
// released now is evicted: vLLM frees a finished request's blocks to the
// tail of its LRU queue, so they go once new allocations have used up the
// free blocks ahead of them, i.e. the capacity less what requests in flight
// hold (held) and less the prefix itself. Unknown sizes never evict.
func evictionPoint(s *replicaState, held, tokens int64) int64 {
	capacity := s.capacityTokens()
	if capacity <= 0 || tokens <= 0 {
		return math.MaxInt64
	}
	return s.allocated.Load() + capacity - held - tokens
}

// account records that a request of tokens prompt tokens of conversation e
// goes to s, its pin: s allocates the part not already cached there, and the
// blocks stay in use until the request ends.
func account(e *session, s *replicaState, tokens int64, cached bool) {
	e.evictedAt.Store(math.MaxInt64)
	if tokens <= 0 {
		return
	}
	fresh := tokens
	if cached {
		fresh = max(0, tokens-e.tokens)
	}
	s.allocated.Add(fresh)
	s.held.Add(tokens)
	e.tokens = tokens
}
