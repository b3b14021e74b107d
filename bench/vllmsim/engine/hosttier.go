package engine

import "time"

// The host tier, after vLLM's OffloadingConnector (scheduler side,
// vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py) and its CPU spec with
// the LRU manager. Offloaded blocks are the GPU's blocks (blocks_per_chunk 1), so a block's
// hash is the same in both tiers.

// hostPrefix is the connector's get_num_new_matched_tokens: it refreshes the host tier's LRU
// recency of all r's full blocks, then counts the consecutive ready blocks after the gpuBlocks
// the GPU hit, up to the last full block (a load that ends the prompt recomputes its last
// token). It defers r (deferred true) while another request loads one of those blocks
// (vLLM PR #29087): once loaded, they are GPU hits.
func (e *Engine) hostPrefix(r *Request, gpuBlocks int) (blocks int, deferred bool) {
	bs := e.profile.BlockSize
	full := r.numTokens() / bs
	if full == 0 {
		return 0, false
	}
	hashes, hints := r.hostBlocks(full, bs)
	e.host.touch(hashes, hints)
	if full <= gpuBlocks {
		return 0, false
	}
	blocks = e.host.lookup(hashes[gpuBlocks:], hints[gpuBlocks:])
	if blocks > 0 && e.host.loading(hashes[gpuBlocks:gpuBlocks+blocks], hints[gpuBlocks:]) {
		return 0, true
	}
	return blocks, false
}

// hostBlocks returns the hashes of r's first n full blocks and their host-tier slot hints.
func (r *Request) hostBlocks(n, blockSize int) ([]uint64, []int32) {
	r.blockHash(n-1, blockSize)
	for len(r.hostSlots) < n {
		r.hostSlots = append(r.hostSlots, -1)
	}
	return r.blockHashes[:n], r.hostSlots[:n]
}

// endLoad ends the protection of the host blocks r's load reads.
func (e *Engine) endLoad(r *Request) {
	e.host.addLoads(r.blockHashes[r.loadFrom:r.loadTo], r.hostSlots[r.loadFrom:r.loadTo], -1)
}

// park admits r to wait for its host hit, as vLLM's scheduler does with an asynchronous
// load: it takes the GPU hit and new blocks for the loaded ones, protects the host blocks,
// and queues the copy on the host-to-GPU link behind the loads already on it. It does so only
// if the blocks for r's whole prompt are free (and holds the rest for it), so that requests
// loading at once never wait on each other's blocks; else it changes nothing and returns false.
func (e *Engine) park(r *Request, hits []int32, blocks int, now time.Duration) bool {
	if !e.fits(r, hits) {
		return false
	}
	bs := e.profile.BlockSize
	for _, b := range hits {
		e.pool.touch(b)
		r.blocks = append(r.blocks, b)
	}
	r.numCachedBlocks += len(hits)
	for range blocks {
		r.blocks = append(r.blocks, e.pool.allocate())
	}
	r.loadFrom, r.loadTo = len(hits), len(hits)+blocks
	e.host.addLoads(r.blockHashes[r.loadFrom:r.loadTo], r.hostSlots[r.loadFrom:r.loadTo], 1)
	bytes := float64(blocks) * e.profile.BlockBytes()
	dur := e.profile.TransferTime(bytes)
	r.loadDone = max(now, e.host.linkFree) + dur
	e.host.linkFree = r.loadDone
	e.counters.Offload[CPUToGPU].record(bytes, dur)
	r.state = stateLoading
	r.reserved = (r.numTokens()+bs-1)/bs - len(r.blocks)
	e.reserved += r.reserved
	r.nextStoredBlock = r.loadTo
	if r.Preemptions == 0 {
		e.countLookup(r, len(hits)*bs, blocks*bs)
	}
	if !r.scheduledOnce {
		// vLLM sets these when the request runs after its load; they are the same then.
		r.scheduledOnce = true
		r.CachedTokens = e.loadedTokens(r)
		r.externalTokens = blocks * bs
	}
	return true
}

// loadedTokens is how many of r's tokens are computed once its load ends: all its blocks',
// but for the last token if that is the whole of them.
func (e *Engine) loadedTokens(r *Request) int {
	n := min(len(r.blocks)*e.profile.BlockSize, r.numTokens())
	if n == r.numTokens() {
		n--
	}
	return n
}

// finishLoad reports whether r's load has ended by now. If so, r is waiting again with its
// loaded blocks computed and entered in the prefix cache, ready to prefill the rest.
func (e *Engine) finishLoad(r *Request, now time.Duration) bool {
	if now < r.loadDone {
		return false
	}
	e.endLoad(r)
	r.numComputed = e.loadedTokens(r)
	e.cacheBlocks(r, r.numComputed/e.profile.BlockSize)
	r.state = stateWaiting
	return true
}

// release gives back the blocks held for r's prompt while it loaded, when it runs or leaves.
func (e *Engine) release(r *Request) {
	e.reserved -= r.reserved
	r.reserved = 0
}

// idleStep is the length of a step that scheduled nothing: none without a host tier or
// waiting requests. With them (requests loading, or waiting for another's load, or the step
// after a request preempted itself), vLLM's busy loop runs empty steps that poll the copies:
// each costs a step's overhead, so that a load's end and new arrivals are seen within one.
// Without an overhead to poll with, the step lasts until the first copy ends.
func (e *Engine) idleStep(now time.Duration) time.Duration {
	if e.host == nil || len(e.waiting) == 0 {
		return 0
	}
	if e.profile.StepOverhead > 0 {
		return e.profile.StepOverhead
	}
	wait := time.Duration(0)
	for _, r := range e.waiting {
		if r.state == stateLoading && (wait == 0 || r.loadDone-now < wait) {
			wait = r.loadDone - now
		}
	}
	return max(wait, 1)
}

// storePrompts offers the host tier the prompt blocks each scheduled request fills in this
// step (write-through, prompt blocks only: vLLM's offload_prompt_only), as the connector's
// build_connector_meta does. A request whose store finds no free slot is retried on the next
// step. The copies complete with the step.
func (e *Engine) storePrompts() {
	bs := e.profile.BlockSize
	for _, s := range e.scheduled {
		r := s.req
		full := min(r.numComputed+s.newTokens, len(r.Prompt)) / bs
		if full <= r.nextStoredBlock {
			continue
		}
		hashes, hints := r.hostBlocks(full, bs)
		stored, ok := e.host.prepareStore(hashes[r.nextStoredBlock:])
		if !ok {
			continue
		}
		r.nextStoredBlock = full
		if len(stored) == 0 {
			continue
		}
		e.host.touch(hashes, hints)
		e.pendingStores = append(e.pendingStores, stored...)
		bytes := float64(len(stored)) * e.profile.BlockBytes()
		e.counters.Offload[GPUToCPU].record(bytes, e.profile.TransferTime(bytes))
	}
}

// countSources counts a prompt by where its tokens came from, as vLLM's PromptTokenStats
// does when its first token comes: a prompt cached but for its last token counts that token
// as a cache hit recomputed.
func (e *Engine) countSources(r *Request) {
	n, cached := len(r.Prompt), r.CachedTokens
	recomputed := 0
	if cached+1 == n {
		recomputed = 1
	}
	e.counters.PromptTokensBySource[SourceLocalCompute] += uint64(n - cached)
	e.counters.PromptTokensBySource[SourceExternalKVTransfer] += uint64(r.externalTokens)
	e.counters.PromptTokensBySource[SourceLocalCacheHit] += uint64(cached + recomputed - r.externalTokens)
}

// HostCachedTokens returns how many tokens of a prompt the host tier would load if it were
// scheduled now, after its GPU hit (CachedTokens): its consecutive ready blocks from the first
// the GPU lacks. It changes nothing. It is 0 without a host tier.
func (e *Engine) HostCachedTokens(prompt []uint32) int {
	if e.host == nil {
		return 0
	}
	bs := e.profile.BlockSize
	hashes := BlockHashes(prompt, bs)
	gpu := e.CachedTokens(prompt) / bs
	if gpu >= len(hashes) {
		return 0
	}
	hints := make([]int32, len(hashes)-gpu)
	for i := range hints {
		hints[i] = -1
	}
	return e.host.lookup(hashes[gpu:], hints) * bs
}
