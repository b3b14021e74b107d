package engine

import "math"

// KVEventKind says how the prefix cache changed.
type KVEventKind uint8

// The changes vLLM reports (vllm/distributed/kv_events.py). AllBlocksCleared has no
// counterpart: the engine never resets its cache.
const (
	BlockStored  KVEventKind = iota + 1 // blocks entered the prefix cache
	BlockRemoved                        // a block was evicted from it
)

// Medium says which tier a KV event is about, with vLLM's names as String values.
type Medium uint8

// The tiers: the GPU's prefix cache, and the host-memory tier of the OffloadingConnector.
const (
	MediumGPU Medium = iota
	MediumCPU
)

var mediumNames = [...]string{MediumGPU: "GPU", MediumCPU: "CPU"}

// String returns vLLM's medium name.
func (m Medium) String() string { return mediumNames[m] }

// KVEvent is one change of the engine's prefix cache or host tier, with what vLLM's
// BlockStored and BlockRemoved events carry.
type KVEvent struct {
	Kind KVEventKind
	// Medium is the tier that changed. The host tier's events carry hashes only, as the
	// OffloadingConnector's: no parent, no tokens.
	Medium Medium
	// BlockHashes are the blocks' hashes. GPU: a run of consecutive blocks of one request for
	// BlockStored, in token order; one block for BlockRemoved, as vLLM evicts one at a time.
	// CPU: the blocks of one completed store, or all those one store evicted.
	BlockHashes []uint64
	// ParentBlockHash is the hash of the block before the run, 0 for a run that starts the
	// prompt (vLLM's None). GPU BlockStored only.
	ParentBlockHash uint64
	// TokenIDs are the tokens of the run's blocks. GPU BlockStored only.
	TokenIDs []uint32
}

// noRun marks that no run of newly cached blocks is open.
const noRun = math.MaxInt

// EnableKVEvents makes the engine log every change of its prefix cache and host tier for
// TakeKVEvents.
func (e *Engine) EnableKVEvents() {
	if e.pool.kvEvents == nil {
		e.pool.kvEvents = new([]KVEvent)
	}
	if e.host != nil && e.host.kvEvents == nil {
		e.host.kvEvents = new([]KVEvent)
	}
}

// DisableKVEvents stops the log and drops what it holds.
func (e *Engine) DisableKVEvents() {
	e.pool.kvEvents = nil
	if e.host != nil {
		e.host.kvEvents = nil
	}
}

// TakeKVEvents returns the changes since the last call and forgets them, like vLLM's
// scheduler after each step: the prefix cache's (KVCacheManager.take_events) in the order
// they happened, then the host tier's (the connector's take_events). The caller owns the
// slice. It returns nil unless EnableKVEvents was called.
func (e *Engine) TakeKVEvents() []KVEvent {
	if e.pool.kvEvents == nil {
		return nil
	}
	events := *e.pool.kvEvents
	*e.pool.kvEvents = nil
	if e.host != nil {
		events = append(events, *e.host.kvEvents...)
		*e.host.kvEvents = nil
	}
	if len(events) == 0 {
		return nil
	}
	return events
}

// logStored logs that blocks [from, to) of r entered the cache, if logging is on and the run
// is not empty.
func (p *blockPool) logStored(r *Request, from, to, blockSize int) {
	if p.kvEvents == nil || from >= to {
		return
	}
	ev := KVEvent{Kind: BlockStored, BlockHashes: append([]uint64(nil), r.blockHashes[from:to]...)}
	if from > 0 {
		ev.ParentBlockHash = r.blockHashes[from-1]
	}
	ev.TokenIDs = make([]uint32, 0, (to-from)*blockSize)
	for i := from * blockSize; i < to*blockSize; i++ {
		ev.TokenIDs = append(ev.TokenIDs, r.token(i))
	}
	*p.kvEvents = append(*p.kvEvents, ev)
}
