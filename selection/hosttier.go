package selection

import (
	"math"
	"sync/atomic"
	"time"
)

// The host tier. A replica with a second KV tier in host memory (vLLM's
// --kv-offloading-size) copies prompt blocks there as they fill and loads
// back what its GPU prefix cache evicted, far faster than computing it
// again. The router cannot see what the pool holds. It counts the tokens
// of the turns it sends back to their pin that it believes the GPU evicted
// (the only ones the pool can hold: a new message or a moved conversation
// was never there), learns from the replica's counters what share of them
// the pool served, and counts that share of a conversation's evicted
// prefix as cached at its pin, so that a conversation whose prefix sits in
// its pin's host pool is not moved as if it had lost it.

// hostMemory is how long past scrapes weigh in the share: long enough to
// span a conversation's pauses, short enough to follow a change of load.
const hostMemory = 5 * time.Minute

// hostShare learns a replica's host-tier hit share: the tokens its tier
// served (vllm:external_prefix_cache_hits) over the tokens of returning
// turns we sent it believing its GPU had evicted them, both decayed with
// hostMemory. Requests add to sent; one poller writes the rest, any request
// reads share; 0 without a tier, or until the counters show one.
type hostShare struct {
	sent          atomic.Int64
	lastSent      int64   // sent at the last observation; the poller's alone
	hits, evicted float64 // decayed sums; the poller's alone
	share         atomic.Uint64
	// stored and copied sum the bytes the tier stored and the tokens the
	// engine computed meanwhile (the poller's alone); tokens is the tier's
	// size in tokens they give, 0 until known.
	stored, copied float64
	tokens         atomic.Int64
}

// minSizingTokens is how many computed tokens must have been stored before
// a tier's bytes per token are trusted: a few blocks' worth is skewed by
// the partial blocks a tier does not store.
const minSizingTokens = 50000

// observe folds in the interval between the scrapes prev and now; counters
// that went back (a restarted engine) teach nothing.
func (h *hostShare) observe(prev, now Load) {
	h.size(prev, now)
	sent := h.sent.Load()
	evicted := float64(sent - h.lastSent)
	h.lastSent = sent
	dt := now.At.Sub(prev.At).Seconds()
	hit := now.ExternalHits - prev.ExternalHits
	if prev.At.IsZero() || dt <= 0 || hit < 0 || now.ExternalQueries <= 0 {
		return
	}
	keep := math.Exp(-dt / hostMemory.Seconds())
	h.hits, h.evicted = h.hits*keep+hit, h.evicted*keep+evicted
	if h.evicted > 0 {
		h.share.Store(math.Float64bits(min(1, h.hits/h.evicted)))
	}
}

func (h *hostShare) value() float64 { return math.Float64frombits(h.share.Load()) }

// size learns the tier's size in tokens: the engine copies the blocks it
// computes to the tier as they fill, so the bytes stored over the tokens it
// computed (written, less what the tier itself loaded back) are a token's
// KV bytes, and the tier's GiB over those is what it holds.
func (h *hostShare) size(prev, now Load) {
	stored, computed := now.HostStoredBytes-prev.HostStoredBytes, (now.Written-now.ExternalHits)-(prev.Written-prev.ExternalHits)
	if now.HostTierGiB <= 0 || stored <= 0 || computed <= 0 {
		return // no tier, nothing stored, or counters that went back
	}
	h.stored, h.copied = h.stored+stored, h.copied+computed
	if h.copied >= minSizingTokens {
		h.tokens.Store(int64(now.HostTierGiB * (1 << 30) / (h.stored / h.copied)))
	}
}

// capacityTokens is what the replica's caches hold, in tokens: its GPU
// cache, or its host tier when larger; 0 while neither is known.
func (s *replicaState) capacityTokens() int {
	return int(max(s.kvTokens.Load(), s.host.tokens.Load()))
}

// evictedAtPin is what of the conversation's last prompt, beyond the
// shared prefix every replica holds, we believe its pin's GPU evicted (it
// holds gpuCached of it); none once the pin restarted, which empties a
// host tier too. e's shard locked.
func (e *session) evictedAtPin(gpuCached, shared int) int {
	if e.pin.restarts.Load() != e.relRestarts {
		return 0
	}
	return max(0, e.lastPrompt-max(gpuCached, shared))
}

// hostCached is what of the conversation's evicted prefix (evictedAtPin)
// the pin's host tier is expected to load back.
func (e *session) hostCached(evicted int) int {
	return int(e.pin.host.value() * float64(evicted))
}

// keptByHostTier reports whether the turn stays on its pin (e, its shard
// locked) rather than move to t because the pin has a host tier and t has
// no free place to run the turn. With a tier the pin keeps what its GPU
// evicts, so a move recomputes the conversation; where t's turns queue, it
// also delays every turn queued behind it there, more than moveCost's
// weight counts, and only changes which turns wait.
func (v *View) keptByHostTier(e *session, t *replicaState, prompt int) bool {
	if e.pin.host.value() <= 0 {
		return false
	}
	_, ahead := v.places(t, prompt)
	return ahead > 0
}
