package engine

import "time"

// hostPool is the host-memory tier of vLLM's OffloadingConnector with its CPU spec and LRU
// policy (vllm/v1/kv_offload/lru_manager.py): a fixed number of slots, each holding one KV
// block by hash, kept in least-recently-used order (head evicted first). A slot is ready once
// its store has completed; a ready slot that loads are reading is protected from eviction.
type hostPool struct {
	hashes   []uint64   // block hash in each slot; 0 when free
	loads    []int32    // loads in flight reading each slot
	ready    []bool     // the slot's store has completed: lookups may hit it
	lru      blockList  // used slots, least recently used first
	free     []int32    // unused slots
	slots    blockIndex // the slot storing each block, by hash
	kvEvents *[]KVEvent // changes, logged in order; nil when nobody asked
	// linkFree is when the host-to-GPU link finishes the loads already queued on it.
	linkFree time.Duration
}

func newHostPool(numSlots int) *hostPool {
	p := &hostPool{
		hashes: make([]uint64, numSlots),
		loads:  make([]int32, numSlots),
		ready:  make([]bool, numSlots),
		lru:    newBlockList(numSlots),
		free:   make([]int32, numSlots),
		slots:  newBlockIndex(numSlots),
	}
	for i := range p.free {
		p.free[i] = int32(numSlots - 1 - i) // slot 0 is taken first
	}
	return p
}

// slot returns the slot holding block h. hint is where the block was last seen (a request
// keeps one per block, since its blocks are looked up again and again); it is updated.
func (p *hostPool) slot(h uint64, hint *int32) (int32, bool) {
	if s := *hint; s >= 0 && p.hashes[s] == h {
		return s, true
	}
	s, ok := p.slots.get(h)
	if ok {
		*hint = s
	}
	return s, ok
}

// lookup counts the leading blocks that are stored and ready; hints go with hashes.
func (p *hostPool) lookup(hashes []uint64, hints []int32) int {
	for i, h := range hashes {
		if s, ok := p.slot(h, &hints[i]); !ok || !p.ready[s] {
			return i
		}
	}
	return len(hashes)
}

// loading reports whether a load in flight reads any of the blocks.
func (p *hostPool) loading(hashes []uint64, hints []int32) bool {
	for i, h := range hashes {
		if s, ok := p.slot(h, &hints[i]); ok && p.loads[s] > 0 {
			return true
		}
	}
	return false
}

// touch makes the stored blocks among hashes the most recently used, the first of them last,
// so that a conversation loses its newest blocks before its first ones.
func (p *hostPool) touch(hashes []uint64, hints []int32) {
	for i := len(hashes) - 1; i >= 0; i-- {
		if s, ok := p.slot(hashes[i], &hints[i]); ok && s != p.lru.tail {
			p.lru.unlink(s)
			p.lru.pushBack(s)
		}
	}
}

// prepareStore takes slots for the hashes not stored yet, evicting the least recently used
// ready blocks that no load reads, and returns those hashes (not ready until completeStore).
// When too few slots can be freed it changes nothing and returns ok false: vLLM skips the
// request's store for this step ("cannot store") and retries it on the next.
func (p *hostPool) prepareStore(hashes []uint64) (toStore []uint64, ok bool) {
	for _, h := range hashes {
		if _, stored := p.slots.get(h); !stored {
			toStore = append(toStore, h)
		}
	}
	var evict []int32
	for s := p.lru.head; len(p.free)+len(evict) < len(toStore); s = p.lru.next[s] {
		if s == noBlock {
			return nil, false
		}
		if p.ready[s] && p.loads[s] == 0 {
			evict = append(evict, s)
		}
	}
	if len(evict) > 0 {
		removed := make([]uint64, len(evict))
		for i, s := range evict {
			removed[i] = p.hashes[s]
			p.lru.unlink(s)
			p.slots.remove(p.hashes[s])
			p.hashes[s] = 0
			p.ready[s] = false
			p.free = append(p.free, s)
		}
		p.log(KVEvent{Kind: BlockRemoved, Medium: MediumCPU, BlockHashes: removed})
	}
	for _, h := range toStore {
		s := p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		p.hashes[s] = h
		p.slots.add(h, s)
		p.lru.pushBack(s)
	}
	return toStore, true
}

// completeStore makes stored blocks ready for lookups.
func (p *hostPool) completeStore(hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	for _, h := range hashes {
		s, _ := p.slots.get(h)
		p.ready[s] = true
	}
	p.log(KVEvent{Kind: BlockStored, Medium: MediumCPU, BlockHashes: append([]uint64(nil), hashes...)})
}

// addLoads protects ready blocks from eviction while a load reads them (delta 1), or ends
// that protection (delta -1).
func (p *hostPool) addLoads(hashes []uint64, hints []int32, delta int32) {
	for i, h := range hashes {
		s, _ := p.slot(h, &hints[i])
		p.loads[s] += delta
	}
}

// used is the number of slots holding a block.
func (p *hostPool) used() int { return p.slots.len() }

func (p *hostPool) log(ev KVEvent) {
	if p.kvEvents != nil {
		*p.kvEvents = append(*p.kvEvents, ev)
	}
}
