package engine

// noBlock marks the end of a list and an unlinked block.
const noBlock = -1

// blockList is a doubly linked list over block indexes 0..n-1, each in it at most once: a
// pool's eviction order, head first.
type blockList struct {
	prev, next []int32
	head, tail int32
}

func newBlockList(n int) blockList {
	return blockList{prev: make([]int32, n), next: make([]int32, n), head: noBlock, tail: noBlock}
}

// pushBack appends block b at the tail.
func (l *blockList) pushBack(b int32) {
	l.prev[b], l.next[b] = l.tail, noBlock
	if l.tail == noBlock {
		l.head = b
	} else {
		l.next[l.tail] = b
	}
	l.tail = b
}

// unlink takes block b out of the list, wherever it is.
func (l *blockList) unlink(b int32) {
	if l.prev[b] == noBlock {
		l.head = l.next[b]
	} else {
		l.next[l.prev[b]] = l.next[b]
	}
	if l.next[b] == noBlock {
		l.tail = l.prev[b]
	} else {
		l.prev[l.next[b]] = l.prev[b]
	}
	l.prev[b], l.next[b] = noBlock, noBlock
}

// blockPool is vLLM V1's BlockPool: a fixed set of KV blocks, a free queue ordered by eviction
// priority (head evicted first), and a map from block hash to the cached block holding it.
// A free block keeps its hash and stays a cache hit until it is reused for something else.
type blockPool struct {
	refs     []int32  // requests using each block
	hashes   []uint64 // content hash of each block; 0 when it caches nothing
	free     blockList
	numFree  int
	cached   blockIndex
	kvEvents *[]KVEvent // changes of cached, logged in order; nil when nobody asked
}

func newBlockPool(numBlocks int) *blockPool {
	p := &blockPool{
		refs:   make([]int32, numBlocks),
		hashes: make([]uint64, numBlocks),
		free:   newBlockList(numBlocks),
		cached: newBlockIndex(numBlocks),
	}
	for b := range numBlocks {
		p.pushFree(int32(b))
	}
	return p
}

// pushFree appends a block to the tail of the free queue (evicted last).
func (p *blockPool) pushFree(b int32) {
	p.free.pushBack(b)
	p.numFree++
}

// unlinkFree takes a block out of the free queue, wherever it is.
func (p *blockPool) unlinkFree(b int32) {
	p.free.unlink(b)
	p.numFree--
}

// allocate takes the least recently freed block for a new use, evicting what it cached.
func (p *blockPool) allocate() int32 {
	b := p.free.head
	p.unlinkFree(b)
	if h := p.hashes[b]; h != 0 {
		p.cached.remove(h)
		p.hashes[b] = 0
		if p.kvEvents != nil {
			*p.kvEvents = append(*p.kvEvents, KVEvent{Kind: BlockRemoved, BlockHashes: []uint64{h}})
		}
	}
	p.refs[b] = 1
	return b
}

// touch adds a user to a cached block found by a prefix hit, taking it off the free queue.
func (p *blockPool) touch(b int32) {
	if p.refs[b] == 0 {
		p.unlinkFree(b)
	}
	p.refs[b]++
}

// release drops one user of a block; a block nobody uses joins the free queue's tail.
func (p *blockPool) release(b int32) {
	p.refs[b]--
	if p.refs[b] == 0 {
		p.pushFree(b)
	}
}

// cache records that block b holds the content with hash h and reports whether it did. If
// another block already holds it, b stays uncached: one copy is enough to serve hits.
func (p *blockPool) cache(b int32, h uint64) bool {
	if !p.cached.add(h, b) {
		return false
	}
	p.hashes[b] = h
	return true
}

// lookup returns the cached block holding hash h.
func (p *blockPool) lookup(h uint64) (int32, bool) {
	return p.cached.get(h)
}
