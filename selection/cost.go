package selection

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Expected cost. A conversation stays on its pin unless another replica
// would serve its turn sooner, counting what the move costs the fleet. At a
// replica a turn waits for the prefill work queued ahead of it (backlog),
// then, if every place to run is taken (slots), for turns there to end,
// then computes the part of its prompt the replica has not cached. Moving
// it elsewhere also makes the fleet compute again what its pin had cached,
// which costs the other turns too (recomputeWeight). Costs are in seconds
// at the fleet's prefill rate, which the router learns from the replicas'
// counters; until it has, nothing moves for load. docs/routing.md says it
// for users.

// rateMemory is how long the best rate seen is remembered: the prefill
// rate is the hardware's, and any prefill that did not queue shows it.
const rateMemory = 10 * time.Minute

// prefillRate learns a replica's prefill rate (prompt tokens computed per
// second) from its counters: the prompt tokens its requests computed over
// the time they took to their first token, in the interval between two
// scrapes where that was highest recently. Time spent queued makes an
// interval's rate lower, never higher, so the estimate errs low, which
// makes moves rarer, never likelier. One poller writes it, any request
// reads it.
type prefillRate struct {
	peak atomic.Uint64 // float64 bits
}

// observe folds in the interval between the scrapes prev and now; counters
// that went back (a restarted engine) teach nothing.
func (p *prefillRate) observe(prev, now Load) {
	dt := now.At.Sub(prev.At).Seconds()
	prefilled, waited := now.Prefilled-prev.Prefilled, now.TTFTSeconds-prev.TTFTSeconds
	if prev.At.IsZero() || dt <= 0 || prefilled <= 0 || waited <= 0 {
		return
	}
	peak := math.Float64frombits(p.peak.Load()) * math.Exp(-dt/rateMemory.Seconds())
	p.peak.Store(math.Float64bits(max(peak, prefilled/waited)))
}

func (p *prefillRate) value() float64 { return math.Float64frombits(p.peak.Load()) }

// backlog is the prefill work, in tokens, of our requests queued at a
// replica: it grows by each request's uncached part when the request is
// sent and drains at the prefill rate, and it is never more than what the
// requests still in flight there had to compute.
type backlog struct {
	mu     sync.Mutex
	tokens float64
	when   int64   // unix nanoseconds of tokens' last update
	owed   float64 // the uncached parts of the requests in flight
}

// drained is the backlog at now, at rate tokens per second (0: unknown,
// no draining); b.mu held.
func (b *backlog) drained(now int64, rate float64) float64 {
	if rate <= 0 || now <= b.when {
		return b.tokens
	}
	return max(0, b.tokens-rate*float64(now-b.when)/1e9)
}

func (b *backlog) add(tokens float64, now int64, rate float64) {
	b.mu.Lock()
	b.tokens, b.when = b.drained(now, rate)+tokens, max(now, b.when)
	b.owed += tokens
	b.mu.Unlock()
}

// done takes a request's uncached part off what the requests in flight owe.
func (b *backlog) done(tokens float64) {
	b.mu.Lock()
	b.owed = max(0, b.owed-tokens)
	b.tokens = min(b.tokens, b.owed)
	b.mu.Unlock()
}

func (b *backlog) at(now int64, rate float64) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.drained(now, rate)
}

// learnPrefillRate sets the fleet's prefill rate to the fastest of its
// replicas' (they run the same model on alike hardware).
func (r *Router) learnPrefillRate() {
	r.statesMu.Lock()
	rate := 0.0
	for _, s := range r.states {
		rate = max(rate, s.rate.value())
	}
	r.statesMu.Unlock()
	r.prefill.Store(math.Float64bits(rate))
}

// prefillRate is the fleet's prefill rate in tokens per second; 0 until a
// replica's counters have shown it.
func (v *View) prefillRate() float64 { return math.Float64frombits(v.router.prefill.Load()) }

// slots is how many requests s runs at once: its sequence slots
// (max_num_seqs), or as many as its KV cache holds if fewer, the shared
// prefix counted once; at least one.
func (v *View) slots(s *replicaState) float64 {
	places, _ := v.places(s, int(v.router.TypicalPrompt()))
	return places
}

// slotWait is how long a turn with a prompt of tokens sent to s now waits
// for a place to run, in seconds: a turn beyond its slots waits for as many
// of the requests in flight there to end as are ahead of it, and they end
// at slots per turn's duration. 0 while the turns' duration is unknown.
func (v *View) slotWait(s *replicaState, tokens int) float64 {
	places, ahead := v.places(s, tokens)
	if ahead <= 0 {
		return 0
	}
	return ahead * v.router.turnSeconds.value() / places
}

// places is how many requests s runs at once, with a turn of a prompt of
// tokens sent there now, and how many of the requests in flight would have
// to end before that turn could run (0 or less: it runs at once). Its KV
// cache holds the shared prefix once and as many of the requests' own
// parts as fit, at their mean size.
func (v *View) places(s *replicaState, tokens int) (places, ahead float64) {
	places = float64(v.cfg.MaxNumSeqs)
	if kv := float64(s.kvTokens.Load()); kv > 0 {
		shared := float64(v.router.sharedTokens())
		own := max((float64(s.pending.Load())+float64(tokens))/float64(s.inFlight.Load()+1)-shared, 1)
		places = min(places, max(1, math.Floor((kv-shared)/own)))
	}
	return places, s.busy() + 1 - places
}

// turnCost is when a turn whose prompt has uncached tokens to compute
// would have its first token at s, in seconds from now: the prefill queued
// ahead of it, its wait for a place to run, its own prefill.
func (v *View) turnCost(s *replicaState, prompt, uncached int, now int64, rate float64) float64 {
	return (s.backlog.at(now, rate)+float64(uncached))/rate + v.slotWait(s, prompt)
}

// recomputeWeight is how many times a moved turn's recomputed tokens (what
// its pin had cached and t computes again) count against the move: once
// for its own prefill; once more for the turns queued behind it at t, which
// wait as long, unless t has no request in flight; once more for the cache
// of other conversations it evicts there, which they compute again, unless
// no conversation is active at t.
func recomputeWeight(t *replicaState) float64 {
	w := 1.0
	if t.inFlight.Load() > 0 || t.load.Load().external > 0 {
		w++
	}
	if t.active.Load() > 0 {
		w++
	}
	return w
}

// moveCost is what serving the turn at t, not its pin, costs: when its
// first token would come there, plus what its recomputed tokens (elsewhere
// less uncached, what the pin would compute) cost the other turns
// (recomputeWeight). Moving pays when it is less than the pin's turnCost.
func (v *View) moveCost(t *replicaState, prompt, uncached, elsewhere int, now int64, rate float64) float64 {
	others := (recomputeWeight(t) - 1) * float64(elsewhere-uncached) / rate
	return v.turnCost(t, prompt, elsewhere, now, rate) + others
}

// mayGain reports whether moving off the pin could pay, without looking
// at the other replicas: at best one would start the turn at once and its
// recomputed tokens would count once (moveCost).
func (v *View) mayGain(pin *replicaState, prompt, uncached, elsewhere int, now int64, rate float64) bool {
	if rate <= 0 {
		return false
	}
	wait := pin.backlog.at(now, rate)/rate + v.slotWait(pin, prompt)
	return wait > float64(elsewhere-uncached)/rate
}

// uncachedElsewhere is what of a prompt a replica other than the
// conversation's pin would compute: all but the shared prefix.
func (v *View) uncachedElsewhere(prompt int) int {
	return max(0, prompt-v.router.sharedTokens())
}

// uncachedAtPin is what of the turn's prompt the conversation's pin (e, its
// shard locked) would compute when the turn runs there: what the pin has
// evicted of the conversation and its host tier would not load back, but
// not the shared prefix, which it holds as any replica does.
func (v *View) uncachedAtPin(e *session, req Request) int {
	cached := e.cachedTokens()
	host := e.hostCached(e.evictedAtPin(cached, v.router.sharedTokens()))
	return min(max(0, req.PromptTokens-cached-host), v.uncachedElsewhere(req.PromptTokens))
}

// cheaperThan is the usable replica other than the conversation's pin (e,
// its shard locked) where the turn would start soonest, if moving there
// gains over staying; nil when staying is no worse (ties stay).
func (v *View) cheaperThan(e *session, req Request, key uint64, now int64) *replicaState {
	rate := v.prefillRate()
	uncached, elsewhere := v.uncachedAtPin(e, req), v.uncachedElsewhere(req.PromptTokens)
	if !v.mayGain(e.pin, req.PromptTokens, uncached, elsewhere, now, rate) {
		return nil
	}
	t := v.lowest(req.Usable, key, func(s *replicaState) bool { return s != e.pin && s.healthy.Load() }, func(s *replicaState) float64 {
		return v.moveCost(s, req.PromptTokens, uncached, elsewhere, now, rate)
	})
	if t == nil || v.turnCost(e.pin, req.PromptTokens, uncached, now, rate) <= v.moveCost(t, req.PromptTokens, uncached, elsewhere, now, rate) || v.keptByHostTier(e, t, req.PromptTokens) {
		return nil
	}
	return t
}
