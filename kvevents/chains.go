package kvevents

// Chains follows the tree of one replica's cached blocks from its KV cache events: each stored
// block extends its parent's chain, and a conversation's prompt is one chain from the root. Once
// the last block of a conversation's chain is known (Tail), how much of it the replica has
// evicted since is a walk up the tree (Evicted), with no tokenizer and no prompt hashing: the
// router never needs the hashes vLLM computes, only the events' links between them.
//
// Tail finds that block from the runs stored while the conversation's turn ran: a turn stores
// one chain of new blocks (its prompt's uncached part, then its reply's), and that chain either
// passes through the conversation's previous last block, or, for a new conversation, holds as
// many blocks as the turn's usage says it computed.
//
// vLLM frees a finished request's blocks tail first to the back of its free queue and evicts
// from the front, so what a replica holds of a chain is its first blocks, up to the deepest one
// still cached; Evicted counts from the tail up to that one.
//
// Chains is not safe for concurrent use.
type Chains struct {
	max   int
	nodes map[uint64]*node
	// uncached lists removals oldest first; the removed blocks' nodes are kept, so that a walk
	// up from an evicted tail can pass them, until forgetOldest drops them.
	uncached []removal
	removals uint64 // blocks removed so far
	// runs is a ring of the latest stored runs, by serial.
	runs   []run
	serial uint64 // runs stored so far
	blocks int    // nodes cached
	// Overflows counts stored blocks not kept because the map held max nodes, all cached.
	Overflows uint64
}

// node is one block: its parent (the root's: 0), the run that last stored it, how many copies
// of it the cache holds (vLLM may cache a block computed by two requests at once twice, and
// reports each copy), and the removal that last left it with none.
type node struct {
	parent  uint64
	serial  uint64
	copies  int
	removed uint64
}

// removal is a block left with no copy: the removal's number tells a stale entry of
// Chains.uncached (the block was stored again, then removed again) from the current one.
type removal struct{ hash, at uint64 }

// run is a stored run of blocks: the block it extends and its last one.
type run struct{ parent, last uint64 }

// maxRuns is how many stored runs Tail can look back over. vLLM stores a run per request for
// each prefill chunk and each block its decoding fills: a replica running 256 requests at a
// step every 10 ms stores about 1,600 a second, so this many cover 40 s.
const maxRuns = 1 << 16

// remembered is how many evicted blocks are kept beyond as many as are cached: enough to walk
// up from the tails of conversations evicted during their pause, and memory in proportion to
// the replica's cache rather than to how long it has run.
const remembered = 1 << 16

// NewChains returns an empty tree that keeps at most maxBlocks blocks (0: DefaultMaxBlocks).
func NewChains(maxBlocks int) *Chains {
	if maxBlocks <= 0 {
		maxBlocks = DefaultMaxBlocks
	}
	return &Chains{max: maxBlocks, nodes: map[uint64]*node{}, runs: make([]run, maxRuns)}
}

// Stored applies a BlockStored event: hashes, in token order, extend parent (0 for a run that
// starts the prompt).
func (c *Chains) Stored(parent uint64, hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	serial := c.serial
	c.serial++
	c.runs[serial%maxRuns] = run{parent: parent, last: hashes[len(hashes)-1]}
	for _, h := range hashes {
		n := c.nodes[h]
		if n == nil {
			if n = c.newNode(); n == nil {
				c.Overflows++
				parent = h
				continue
			}
			c.nodes[h] = n
		}
		if n.copies == 0 {
			c.blocks++
		}
		n.copies++
		n.parent, n.serial = parent, serial
		parent = h
	}
}

// newNode returns a node to add, forgetting the oldest removed blocks if the map is full; nil
// if every block kept is cached.
func (c *Chains) newNode() *node {
	for len(c.nodes) >= c.max && len(c.uncached) > 0 {
		c.forgetOldest()
	}
	if len(c.nodes) >= c.max {
		return nil
	}
	return &node{}
}

// Removed applies a BlockRemoved event.
func (c *Chains) Removed(hashes []uint64) {
	for _, h := range hashes {
		n := c.nodes[h]
		if n == nil || n.copies == 0 {
			continue
		}
		if n.copies--; n.copies == 0 {
			c.blocks--
			c.removals++
			n.removed = c.removals
			c.uncached = append(c.uncached, removal{h, c.removals})
		}
	}
	for len(c.uncached) > c.blocks+remembered {
		c.forgetOldest()
	}
}

// forgetOldest drops the block removed longest ago, unless it was stored again since.
func (c *Chains) forgetOldest() {
	r := c.uncached[0]
	c.uncached = c.uncached[1:]
	if n := c.nodes[r.hash]; n != nil && n.copies == 0 && n.removed == r.at {
		delete(c.nodes, r.hash)
	}
}

// Cleared applies AllBlocksCleared, or a restarted publisher: nothing is cached.
func (c *Chains) Cleared() {
	c.nodes, c.uncached, c.blocks = map[uint64]*node{}, nil, 0
}

// Mark returns the serial of the next stored run: a turn sent now stores runs from it on.
func (c *Chains) Mark() uint64 { return c.serial }

// Leading counts how many of chain's first blocks are cached, stopping at the first miss, as
// vLLM's prefix cache does.
func (c *Chains) Leading(chain []uint64) int {
	for i, h := range chain {
		if n := c.nodes[h]; n == nil || n.copies == 0 {
			return i
		}
	}
	return len(chain)
}

// Tail returns the last block of the chain a turn stored from mark on, among the chains whose
// first new block was stored before end (the mark when the turn ended: later chains are of
// later requests, a fork extending the same chain among them; their blocks may arrive late, so
// a chain begun before end is followed to its last block however late), given prev, the
// conversation's last block before the turn (0 if none), and blocks, how many blocks the turn
// computed (its prompt and output tokens less the cached part, in blocks; negative if unknown):
//   - the chain that passes through prev (the turn stored prev again after an eviction, or
//     extended it), cut to blocks blocks when a later request extends it further (a fork);
//   - else the chain of blocks blocks (within one, for the last token vLLM computes or not)
//     that leaves prev's chain closest before prev, at most reach blocks: the server's
//     template may render a reply otherwise than it was generated, so the next prompt leaves
//     the chain a little before its end (a new conversation's chain leaves it further up, in
//     the shared system prompt);
//   - else, prev itself if the turn filled no block;
//   - else the only chain of blocks new blocks, for a new conversation.
//
// ok is false when no chain or more than one fits, or mark is too old.
func (c *Chains) Tail(mark, end, prev uint64, blocks int) (tail uint64, ok bool) {
	if mark > c.serial || c.serial-mark > maxRuns {
		return 0, false
	}
	extended := map[uint64]bool{}
	for s := mark; s < c.serial; s++ {
		extended[c.runs[s%maxRuns].parent] = true
	}
	lengthOK := func(n int) bool { return blocks > 0 && n >= blocks-1 && n <= blocks+1 }
	var through, near, fresh []uint64
	nearest := reach + 1 // the least back of the chains in near
	for s := mark; s < c.serial; s++ {
		leaf := c.runs[s%maxRuns].last
		// A chain's end: no later run extends it, and no later run stored it again.
		if n := c.nodes[leaf]; n == nil || n.serial != s || extended[leaf] {
			continue
		}
		length, back, top, ok := c.walkNew(leaf, mark, prev)
		switch {
		case !ok || top >= end:
		case back == 0:
			if blocks > 0 && length > blocks+1 { // a later request extends the turn's chain: a fork
				leaf = c.up(leaf, length-blocks)
			}
			through = append(through, leaf)
		case back > 0 && lengthOK(length) && back <= nearest:
			if back < nearest { // a stranger's chain may leave earlier, in the shared prefix
				near, nearest = near[:0], back
			}
			near = append(near, leaf)
		case back > 0:
		case lengthOK(length):
			fresh = append(fresh, leaf)
		}
	}
	for _, found := range [][]uint64{through, near} {
		if len(found) > 0 {
			return only(found)
		}
	}
	if prev != 0 && blocks == 0 {
		return prev, c.nodes[prev] != nil
	}
	return only(fresh)
}

// up returns the n-th ancestor of x.
func (c *Chains) up(x uint64, n int) uint64 {
	for ; n > 0 && x != 0; n-- {
		x = c.nodes[x].parent
	}
	return x
}

// only returns found's one block, which may be listed more than once.
func only(found []uint64) (uint64, bool) {
	if len(found) == 0 {
		return 0, false
	}
	for _, h := range found {
		if h != found[0] {
			return 0, false
		}
	}
	return found[0], true
}

// walkNew walks up from leaf through the blocks stored since mark, and reports how many there
// are, the serial of the run that stored the first of them, and how far before prev's end they
// leave prev's chain: 0 when prev is among them or is the block they extend, i when they extend
// prev's i-th ancestor, -1 when they do not continue it within reach. ok is false when the walk
// loops (a publisher's parents that cycle).
func (c *Chains) walkNew(leaf, mark, prev uint64) (length, back int, top uint64, ok bool) {
	x, passed := leaf, false
	for x != 0 {
		passed = passed || x == prev
		n := c.nodes[x]
		if n == nil || n.serial < mark {
			break
		}
		if length++; length > len(c.nodes) {
			return 0, -1, 0, false
		}
		top = n.serial
		x = n.parent
	}
	if passed {
		return length, 0, top, true
	}
	if prev == 0 || x == 0 {
		return length, -1, top, true
	}
	for y, i := prev, 0; y != 0 && i <= reach; i++ {
		if y == x {
			return length, i, top, true
		}
		n := c.nodes[y]
		if n == nil {
			break
		}
		y = n.parent
	}
	return length, -1, top, true
}

// reach is how many blocks before a conversation's last one its next turn may leave its chain
// and still be recognised as continuing it: 1,024 tokens at vLLM's default block size.
const reach = 64

// Evicted reports how many blocks of the chain ending at tail the replica no longer holds,
// counted from the tail up to the deepest block still cached. ok is false when tail is not
// known (never stored, or forgotten), when the walk reaches a block no longer known (evicted
// and forgotten, so how many more are gone is unknown), or when it loops.
func (c *Chains) Evicted(tail uint64) (evicted int, ok bool) {
	for x := tail; x != 0; evicted++ {
		n := c.nodes[x]
		switch {
		case n == nil || evicted > len(c.nodes):
			return evicted, false
		case n.copies > 0:
			return evicted, true
		}
		x = n.parent
	}
	return evicted, true
}
