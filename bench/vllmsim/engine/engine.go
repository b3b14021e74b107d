// Package engine models one vLLM V1 engine (one data-parallel rank) closely enough to measure
// prefix-cache routing without a GPU: continuous batching with chunked prefill under
// max_num_seqs and a per-step token budget, a paged KV cache with prefix caching by chained
// block hashes and LRU eviction, preemption by recomputation, an optional host-memory KV tier
// (vLLM's OffloadingConnector), and the counters vLLM exports.
//
// The engine owns no clock and no goroutines. The caller passes its own notion of "now" (the
// time since any epoch it likes, virtual or scaled wall time) to Add and Step; Step says how
// long the step takes, and the caller makes that much time pass before it delivers the events
// and calls Step again. The same sequence of calls always gives the same results.
package engine

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// FinishReason says why a request stopped, with vLLM's names as String values.
type FinishReason uint8

// The finish reasons, in the order vLLM declares them.
const (
	NotFinished  FinishReason = iota // still waiting or running
	FinishStop                       // the reply ended before max_tokens
	FinishLength                     // max_tokens was reached
	FinishAbort                      // the caller aborted it
	numFinishReasons
)

// FinishReasons lists the reasons a finished request can have, for exporting counters.
var FinishReasons = []FinishReason{FinishStop, FinishLength, FinishAbort}

// String returns vLLM's label value for the reason.
func (f FinishReason) String() string {
	switch f {
	case FinishStop:
		return "stop"
	case FinishLength:
		return "length"
	case FinishAbort:
		return "abort"
	}
	return ""
}

type requestState uint8

const (
	stateNew requestState = iota
	stateWaiting
	stateLoading // waiting while its host-tier blocks load (vLLM's WAITING_FOR_REMOTE_KVS)
	stateRunning
	stateFinished
)

// Request is one generation request. The caller fills the exported fields above the line;
// the engine fills the ones below it.
type Request struct {
	// ID names the request for the caller; the engine does not read it.
	ID string
	// Prompt is the prompt's token ids.
	Prompt []uint32
	// MaxTokens is the most tokens the request may generate (the client's max_tokens).
	MaxTokens int
	// Output is the reply the model would give, token by token. The engine generates
	// min(MaxTokens, len(Output)) tokens: finish reason "length" if that is MaxTokens,
	// "stop" otherwise.
	Output []uint32
	// Stopped says the Output's last token is the model's own end of reply, so that a
	// reply of exactly MaxTokens tokens finishes with "stop" rather than "length".
	Stopped bool
	// PromptHashes, if set, are the chained hashes of the prompt's leading full blocks as
	// BlockHashes gives them, which a caller that keeps them from a conversation's previous
	// turn passes to spare the engine hashing the whole prompt again; it hashes the rest.
	PromptHashes []uint64

	// Arrival is the time of Add.
	Arrival time.Duration
	// CachedTokens is the prompt's prefix-cache hit, in tokens, when first scheduled: from
	// the GPU and, with a host tier, loaded from it.
	CachedTokens int
	// Preemptions counts how often the request lost its KV blocks and was recomputed.
	Preemptions int
	// Generated counts the tokens generated so far.
	Generated int
	// FinishReason is set when the request ends.
	FinishReason FinishReason

	state           requestState
	scheduledOnce   bool
	numComputed     int      // tokens whose KV has been computed
	blocks          []int32  // KV blocks, in token order
	numCachedBlocks int      // leading blocks registered in the prefix cache
	blockHashes     []uint64 // chained hashes of the full blocks of known tokens
	hostSlots       []int32  // where each block was last seen in the host tier (-1: not yet)
	prefixHits      []int32  // the prefix cache's blocks cachedPrefix last found, while it waits

	// With a host tier:
	externalTokens   int           // tokens loaded from the host tier when first scheduled
	loadFrom, loadTo int           // the blocks a load in flight brings back
	loadDone         time.Duration // when that load ends
	reserved         int           // blocks its prompt still needs, held for it while it loads
	nextStoredBlock  int           // its first prompt block not yet offered to the host tier
}

func (r *Request) numTokens() int { return len(r.Prompt) + r.Generated }

func (r *Request) token(i int) uint32 {
	if i < len(r.Prompt) {
		return r.Prompt[i]
	}
	return r.Output[i-len(r.Prompt)]
}

// outputLen is how many tokens the request will generate.
func (r *Request) outputLen() int { return min(r.MaxTokens, len(r.Output)) }

// blockHash returns the hash of full block b, hashing each block once, chained on its parent.
func (r *Request) blockHash(b, blockSize int) uint64 {
	for n := len(r.blockHashes); n <= b; n++ {
		parent := uint64(0)
		if n > 0 {
			parent = r.blockHashes[n-1]
		}
		h := chainHash(parent, n*blockSize, blockSize, r.token)
		r.blockHashes = append(r.blockHashes, h)
	}
	return r.blockHashes[b]
}

// chainHash hashes the block of tokens [from, from+blockSize) on its parent block's hash.
func chainHash(parent uint64, from, blockSize int, token func(int) uint32) uint64 {
	h := parent ^ 0x9e3779b97f4a7c15
	for i := from; i < from+blockSize; i++ {
		h = (h ^ uint64(token(i))) * 0x100000001b3
	}
	h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9
	h = (h ^ (h >> 27)) * 0x94d049bb133111eb
	return (h ^ (h >> 31)) | 1 // never 0, which means "no hash"
}

// BlockHashes returns the prefix-cache hashes of the full blocks of tokens, the chain the
// engine looks up and reports in its KV events.
func BlockHashes(tokens []uint32, blockSize int) []uint64 {
	return AppendBlockHashes(make([]uint64, 0, len(tokens)/blockSize), tokens, blockSize)
}

// AppendBlockHashes appends to hashes, those of a token sequence's leading full blocks, the
// hashes of the full blocks of tokens, which follow those blocks in the sequence.
func AppendBlockHashes(hashes []uint64, tokens []uint32, blockSize int) []uint64 {
	parent := uint64(0)
	if len(hashes) > 0 {
		parent = hashes[len(hashes)-1]
	}
	for b := range len(tokens) / blockSize {
		parent = chainHash(parent, b*blockSize, blockSize, func(i int) uint32 { return tokens[i] })
		hashes = append(hashes, parent)
	}
	return hashes
}

// Event reports the token a request generated in a step. It becomes visible at the end of
// the step.
type Event struct {
	// Req is the request that generated the token.
	Req *Request
	// Token is the generated token id.
	Token uint32
	// First is set on the request's first token (the end of its time to first token).
	First bool
	// Finished is set on the request's last token; Req.FinishReason says why.
	Finished bool
}

type scheduledRequest struct {
	req       *Request
	newTokens int
}

// Engine is one simulated vLLM engine. It is not safe for concurrent use.
type Engine struct {
	profile   Profile
	pool      *blockPool
	waiting   []*Request // FCFS; preempted and skipped requests go back to the front
	running   []*Request // in admission order; the last is preempted first
	counters  Stats
	scheduled []scheduledRequest // scratch, reused every step
	events    []Event            // returned by Step, reused every step

	host          *hostPool  // the host tier; nil without one
	reserved      int        // blocks held for the prompts of requests loading from it
	skipped       []*Request // scratch: waiting requests passed over in this step
	pendingStores []uint64   // blocks whose copy to the host tier completes with this step
}

// New returns an idle engine with an empty KV cache (and host tier, if the profile has one).
func New(p Profile) (*Engine, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	e := &Engine{profile: p, pool: newBlockPool(p.NumGPUBlocks)}
	if p.HostTier() {
		e.host = newHostPool(p.NumHostBlocks())
	}
	return e, nil
}

// Profile returns the profile the engine was built with.
func (e *Engine) Profile() Profile { return e.profile }

// Add queues a request that arrives at time now.
func (e *Engine) Add(r *Request, now time.Duration) error {
	switch {
	case r.state != stateNew:
		return errors.New("request was already added")
	case len(r.Prompt) == 0:
		return errors.New("prompt is empty")
	case r.MaxTokens < 1 || len(r.Output) == 0:
		return errors.New("request must generate at least one token")
	case len(r.PromptHashes) > len(r.Prompt)/e.profile.BlockSize:
		return errors.New("more prompt hashes than the prompt has full blocks")
	case len(r.Prompt)+r.outputLen() > e.profile.MaxModelLen:
		return fmt.Errorf("this model's maximum context length is %d tokens, and the request has %d input tokens and asks for %d output tokens",
			e.profile.MaxModelLen, len(r.Prompt), r.outputLen())
	}
	r.Arrival = now
	r.state = stateWaiting
	r.blockHashes = slices.Clip(r.PromptHashes)
	e.waiting = append(e.waiting, r)
	return nil
}

// Abort removes a waiting or running request and frees its blocks (a client that went away).
// It reports whether the request was still in the engine.
func (e *Engine) Abort(r *Request) bool {
	switch r.state {
	case stateLoading:
		e.endLoad(r)
		fallthrough
	case stateWaiting:
		e.waiting = removeRequest(e.waiting, r)
		e.release(r)
	case stateRunning:
		e.running = removeRequest(e.running, r)
	default:
		return false
	}
	e.finish(r, FinishAbort)
	return true
}

func removeRequest(queue []*Request, r *Request) []*Request {
	for i, q := range queue {
		if q == r {
			return append(queue[:i], queue[i+1:]...)
		}
	}
	return queue
}

// Step schedules and runs one engine step starting at time now. It returns the step's
// duration and the tokens generated in it, which become visible at now+duration. The
// returned slice is reused by the next call. With no work, Step returns 0 and no events.
// With a host tier, a step may compute nothing while blocks load: it then lasts StepOverhead
// (vLLM's busy loop polling the copies).
func (e *Engine) Step(now time.Duration) (time.Duration, []Event) {
	e.events = e.events[:0]
	e.schedule(now) // the only place the caches change, so KV events are per step
	if len(e.scheduled) == 0 {
		return e.idleStep(now), nil
	}
	if e.host != nil {
		e.storePrompts()
	}
	prefillTokens, contextTokens := 0, 0
	for _, s := range e.scheduled {
		r := s.req
		contextTokens += r.numComputed
		if r.Generated == 0 || r.numComputed < r.numTokens()-1 {
			prefillTokens += s.newTokens
		}
	}
	dur := e.profile.StepTime(prefillTokens, contextTokens)
	end := now + dur
	finished := false
	for _, s := range e.scheduled {
		r := s.req
		r.numComputed += s.newTokens
		if r.numComputed < r.numTokens() {
			continue // one chunk of a longer prefill: no token yet
		}
		ev := Event{Req: r, Token: r.Output[r.Generated], First: r.Generated == 0}
		r.Generated++
		e.counters.GenerationTokens++
		if ev.First {
			e.counters.PromptTokens += uint64(len(r.Prompt))
			e.counters.PromptTokensCached += uint64(r.CachedTokens)
			e.countSources(r)
			e.counters.TTFT.observe((end - r.Arrival).Seconds())
		}
		if r.Generated == r.outputLen() {
			reason := FinishStop
			if r.Generated == r.MaxTokens && !(r.Stopped && r.Generated == len(r.Output)) {
				reason = FinishLength
			}
			e.finish(r, reason)
			ev.Finished, finished = true, true
		}
		e.events = append(e.events, ev)
	}
	if finished {
		e.running = dropFinished(e.running)
	}
	if e.host != nil {
		e.host.completeStore(e.pendingStores)
		e.pendingStores = e.pendingStores[:0]
	}
	return dur, e.events
}

func dropFinished(running []*Request) []*Request {
	kept := running[:0]
	for _, r := range running {
		if r.state != stateFinished {
			kept = append(kept, r)
		}
	}
	clear(running[len(kept):])
	return kept
}

// schedule fills e.scheduled the way vLLM V1's scheduler does with FCFS policy: running
// requests first, each taking what it needs of the token budget, preempting the newest running
// request when the KV cache is full; then, if nothing was preempted, waiting requests in order
// while a sequence slot, budget and blocks remain (blocks for the whole prompt when
// ReserveFullPrompt is set, for the first chunk otherwise). With a host tier, a waiting request
// whose prefix continues in it is parked while those blocks load, and requests passed over
// (loading, or waiting for another's load) go back to the front of the queue.
func (e *Engine) schedule(now time.Duration) {
	e.scheduled = e.scheduled[:0]
	budget := e.profile.MaxNumBatchedTokens
	preempted := false
	for i := 0; i < len(e.running) && budget > 0; i++ {
		r := e.running[i]
		newTokens := min(r.numTokens()-r.numComputed, budget)
		for !e.allocateSlots(r, nil, newTokens) {
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			preempted = true
			if victim == r {
				return
			}
		}
		e.scheduled = append(e.scheduled, scheduledRequest{r, newTokens})
		budget -= newTokens
	}
	if preempted {
		return
	}
	for len(e.waiting) > 0 && budget > 0 && len(e.running) < e.profile.MaxNumSeqs {
		r := e.waiting[0]
		if r.state == stateLoading && !e.finishLoad(r, now) {
			e.skipHead()
			continue
		}
		loaded := len(r.blocks) > 0 // it holds blocks loaded from the host tier
		var hits []int32
		if !loaded {
			hits = e.cachedPrefix(r)
		}
		if e.host != nil && !loaded {
			blocks, deferred := e.hostPrefix(r, len(hits))
			if deferred {
				e.skipHead()
				continue
			}
			if blocks > 0 {
				if e.park(r, hits, blocks, now) || len(e.running) == 0 {
					e.skipHead()
					continue
				}
				break
			}
		}
		newTokens := min(r.numTokens()-r.numComputed-len(hits)*e.profile.BlockSize, budget)
		if e.profile.ReserveFullPrompt && !e.fits(r, hits) || !e.allocateSlots(r, hits, newTokens) {
			if e.host != nil && len(e.running) == 0 {
				// Nothing running will free blocks; requests behind it that hold theirs
				// (loaded from the host tier) may still run.
				e.skipHead()
				continue
			}
			break // the head of the queue waits for blocks; so does everyone behind it
		}
		if r.Preemptions == 0 && !loaded {
			// Counted at admission, once per request (vLLM PR #48860); resumed requests
			// go to separate counters vLLM does not export.
			e.countLookup(r, len(hits)*e.profile.BlockSize, 0)
		}
		e.waiting[0] = nil
		e.waiting = e.waiting[1:]
		e.release(r)
		r.prefixHits = nil
		r.state = stateRunning
		e.running = append(e.running, r)
		if !r.scheduledOnce {
			r.scheduledOnce = true
			r.CachedTokens = r.numComputed
		}
		e.scheduled = append(e.scheduled, scheduledRequest{r, newTokens})
		budget -= newTokens
	}
	if len(e.skipped) > 0 {
		e.waiting = slices.Concat(e.skipped, e.waiting)
		clear(e.skipped)
		e.skipped = e.skipped[:0]
	}
}

// skipHead passes over the head of the waiting queue for this step.
func (e *Engine) skipHead() {
	e.skipped = append(e.skipped, e.waiting[0])
	e.waiting[0] = nil
	e.waiting = e.waiting[1:]
}

// countLookup counts a request's prefix-cache lookup: local tokens hit on the GPU, external
// loaded from the host tier, which was asked for everything after the GPU hit.
func (e *Engine) countLookup(r *Request, local, external int) {
	e.counters.PrefixCacheQueries += uint64(r.numTokens())
	e.counters.PrefixCacheHits += uint64(local)
	if e.host != nil {
		e.counters.ExternalPrefixCacheQueries += uint64(r.numTokens() - local)
		e.counters.ExternalPrefixCacheHits += uint64(external)
	}
}

// cachedPrefix finds the longest run of r's leading full blocks in the prefix cache, leaving at
// least one token to compute (its logits give the next token). A request at the head of the
// queue asks again every step while it waits for blocks: the blocks it found last time are
// checked by their hashes, cheaper than a lookup, and only the rest is looked up.
func (e *Engine) cachedPrefix(r *Request) []int32 {
	bs := e.profile.BlockSize
	full := (r.numTokens() - 1) / bs
	hits := r.prefixHits[:0]
	for b, blk := range r.prefixHits[:min(len(r.prefixHits), full)] {
		if e.pool.hashes[blk] != r.blockHashes[b] {
			break
		}
		hits = append(hits, blk)
	}
	for b := len(hits); b < full; b++ {
		blk, ok := e.pool.lookup(r.blockHash(b, bs))
		if !ok {
			break
		}
		hits = append(hits, blk)
	}
	r.prefixHits = hits
	return hits
}

// CachedTokens returns the prefix-cache hit, in tokens, that a request with this prompt would
// find if it were scheduled now: its leading full blocks the cache holds, leaving at least one
// token to compute, as Request.CachedTokens counts them. It changes nothing: no block is taken
// or moved in the eviction order, and no counter counts the lookup.
func (e *Engine) CachedTokens(prompt []uint32) int {
	bs := e.profile.BlockSize
	token := func(i int) uint32 { return prompt[i] }
	parent, hit := uint64(0), 0
	for b := range (len(prompt) - 1) / bs {
		parent = chainHash(parent, b*bs, bs, token)
		if _, ok := e.pool.lookup(parent); !ok {
			break
		}
		hit += bs
	}
	return hit
}

// fits reports whether the blocks for r's whole prompt, after the prefix hit and the blocks it
// holds, are free now, beside those held for the prompts of other requests loading from the
// host tier.
func (e *Engine) fits(r *Request, hits []int32) bool {
	bs := e.profile.BlockSize
	need := (r.numTokens()+bs-1)/bs - len(hits) - len(r.blocks)
	return e.blocksToTake(hits, need)+e.reserved-r.reserved <= e.pool.numFree
}

// blocksToTake counts the free blocks that taking hits plus newBlocks new blocks uses up: a hit
// on a free but cached block takes it off the free queue too.
func (e *Engine) blocksToTake(hits []int32, newBlocks int) int {
	for _, b := range hits {
		if e.pool.refs[b] == 0 {
			newBlocks++
		}
	}
	return newBlocks
}

// allocateSlots mirrors vLLM's KVCacheManager.allocate_slots: it takes the prefix-hit blocks
// and enough new blocks for newTokens more tokens, or changes nothing and returns false when
// the free queue cannot supply them. Blocks that become full of known tokens enter the prefix
// cache right away, so a request scheduled later in the same step can hit them.
func (e *Engine) allocateSlots(r *Request, hits []int32, newTokens int) bool {
	bs := e.profile.BlockSize
	computed := r.numComputed + len(hits)*bs
	needed := max(0, (computed+newTokens+bs-1)/bs-len(r.blocks)-len(hits))
	if e.blocksToTake(hits, needed) > e.pool.numFree {
		return false
	}
	for _, b := range hits {
		e.pool.touch(b)
		r.blocks = append(r.blocks, b)
	}
	r.numCachedBlocks += len(hits)
	r.numComputed = computed
	for range needed {
		r.blocks = append(r.blocks, e.pool.allocate())
	}
	e.cacheBlocks(r, min(computed+newTokens, r.numTokens())/bs)
	return true
}

// cacheBlocks registers r's blocks up to full (exclusive) in the prefix cache, logging each
// run of blocks that entered it.
func (e *Engine) cacheBlocks(r *Request, full int) {
	bs := e.profile.BlockSize
	run := noRun // first block of the current run of newly cached blocks
	for b := r.numCachedBlocks; b < full; b++ {
		if e.pool.cache(r.blocks[b], r.blockHash(b, bs)) {
			run = min(run, b)
			continue
		}
		e.pool.logStored(r, run, b, bs)
		run = noRun
	}
	e.pool.logStored(r, run, full, bs)
	r.numCachedBlocks = max(r.numCachedBlocks, full)
}

// preempt frees a running request's blocks and puts it back at the front of the queue, to be
// recomputed (mostly from its own still-cached blocks) when it is scheduled again.
func (e *Engine) preempt(r *Request) {
	e.freeBlocks(r)
	r.state = stateWaiting
	r.Preemptions++
	e.counters.Preemptions++
	e.waiting = append(e.waiting, nil)
	copy(e.waiting[1:], e.waiting)
	e.waiting[0] = r
}

func (e *Engine) finish(r *Request, reason FinishReason) {
	e.freeBlocks(r)
	r.state = stateFinished
	r.FinishReason = reason
	e.counters.RequestSuccess[reason]++
}

// freeBlocks releases a request's blocks tail first, so that its last blocks are evicted
// before its first ones (which other requests are likelier to share), as vLLM does.
func (e *Engine) freeBlocks(r *Request) {
	for i := len(r.blocks) - 1; i >= 0; i-- {
		e.pool.release(r.blocks[i])
	}
	r.blocks = r.blocks[:0]
	r.numComputed = 0
	r.numCachedBlocks = 0
}
