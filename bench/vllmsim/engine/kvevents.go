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

// KVEvent is one change of the engine's prefix cache, with what vLLM's BlockStored and
// BlockRemoved events carry.
type KVEvent struct {
	Kind KVEventKind
	// BlockHashes are the blocks' hashes: a run of consecutive blocks of one request for
	// BlockStored, in token order; one block for BlockRemoved, as vLLM evicts one at a time.
	BlockHashes []uint64
	// ParentBlockHash is the hash of the block before the run, 0 for a run that starts the
	// prompt (vLLM's None). BlockStored only.
	ParentBlockHash uint64
	// TokenIDs are the tokens of the run's blocks. BlockStored only.
	TokenIDs []uint32
}

// noRun marks that no run of newly cached blocks is open.
const noRun = math.MaxInt

// EnableKVEvents makes the engine log every change of its prefix cache for TakeKVEvents.
func (e *Engine) EnableKVEvents() {
	if e.pool.kvEvents == nil {
		e.pool.kvEvents = new([]KVEvent)
	}
}

// DisableKVEvents stops the log and drops what it holds.
func (e *Engine) DisableKVEvents() { e.pool.kvEvents = nil }

// TakeKVEvents returns the cache changes since the last call, in the order they happened, and
// forgets them, like vLLM's KVCacheManager.take_events after each step. The caller owns the
// slice. It returns nil unless EnableKVEvents was called.
func (e *Engine) TakeKVEvents() []KVEvent {
	if e.pool.kvEvents == nil || len(*e.pool.kvEvents) == 0 {
		return nil
	}
	events := *e.pool.kvEvents
	*e.pool.kvEvents = nil
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
