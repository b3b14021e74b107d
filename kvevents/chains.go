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
	// uncached lists removed blocks oldest first; their nodes are kept, so that a walk up
	// from an evicted tail can pass them, until the map is full.
	uncached []uint64
	// runs is a ring of the latest stored runs, by serial.
	runs   []run
	serial uint64 // runs stored so far
	blocks int    // nodes cached
	// Overflows counts stored blocks not kept because the map held max nodes, all cached.
	Overflows uint64
}

// node is one block: its parent ("" root: 0), when it was last stored, whether it is cached.
type node struct {
	parent uint64
	serial uint64 // the serial of the run that last stored it
	cached bool
}

// run is a stored run of blocks: the block it extends and its last one.
type run struct{ parent, last uint64 }

// maxRuns is how many stored runs Tail can look back over: at a run per request per step, a
// replica running 256 requests at a step every 10 ms stores this many in about 2.5 s.
const maxRuns = 1 << 16

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
		if !n.cached {
			c.blocks++
		}
		n.parent, n.serial, n.cached = parent, serial, true
		parent = h
	}
}

// newNode returns a node to add, forgetting the oldest removed blocks if the map is full; nil
// if every block kept is cached.
func (c *Chains) newNode() *node {
	for len(c.nodes) >= c.max && len(c.uncached) > 0 {
		h := c.uncached[0]
		c.uncached = c.uncached[1:]
		if n := c.nodes[h]; n != nil && !n.cached {
			delete(c.nodes, h)
		}
	}
	if len(c.nodes) >= c.max {
		return nil
	}
	return &node{}
}

// Removed applies a BlockRemoved event.
func (c *Chains) Removed(hashes []uint64) {
	for _, h := range hashes {
		if n := c.nodes[h]; n != nil && n.cached {
			n.cached, c.blocks = false, c.blocks-1
			c.uncached = append(c.uncached, h)
		}
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
		if n := c.nodes[h]; n == nil || !n.cached {
			return i
		}
	}
	return len(chain)
}

// Tail returns the last block of the chain a turn stored from mark on: the chain that
// continues prev, the conversation's last block before the turn (walkNew); or, when prev is 0
// or no chain continues it, the only chain of blocks new since mark that holds blocks blocks (within
// one, for the last token vLLM computes or not). ok is false when no chain or more than one
// fits, or mark is too old.
func (c *Chains) Tail(mark, prev uint64, blocks int) (tail uint64, ok bool) {
	if mark > c.serial || c.serial-mark > maxRuns {
		return 0, false
	}
	extended := map[uint64]bool{}
	for s := mark; s < c.serial; s++ {
		extended[c.runs[s%maxRuns].parent] = true
	}
	var found []uint64
	best, bestBack := uint64(0), -1
	for s := mark; s < c.serial; s++ {
		leaf := c.runs[s%maxRuns].last
		// A chain's end: no later run extends it, and no later run stored it again.
		if n := c.nodes[leaf]; n == nil || n.serial != s || extended[leaf] {
			continue
		}
		length, back := c.walkNew(leaf, mark, prev)
		switch {
		case back >= 0 && (bestBack < 0 || back < bestBack):
			best, bestBack = leaf, back
		case blocks > 0 && length >= blocks-1 && length <= blocks+1:
			found = append(found, leaf)
		}
	}
	if bestBack >= 0 {
		return best, true
	}
	if len(found) != 1 {
		return 0, false
	}
	return found[0], true
}

// walkNew walks up from leaf through the blocks stored since mark, and reports how many there
// are and how far before prev's end they leave prev's chain: 0 when prev is among them (stored
// again after an eviction) or is the block they extend, i when they extend prev's i-th ancestor
// (the server's template may render a reply otherwise than it was generated, so the next
// prompt leaves the chain a little before its end), -1 when they do not continue it within
// reach.
func (c *Chains) walkNew(leaf, mark, prev uint64) (length, back int) {
	x, passed := leaf, false
	for x != 0 {
		passed = passed || x == prev
		n := c.nodes[x]
		if n == nil || n.serial < mark {
			break
		}
		length++
		x = n.parent
	}
	if passed {
		return length, 0
	}
	if prev == 0 || x == 0 {
		return length, -1
	}
	for y, i := prev, 0; y != 0 && i <= reach; i++ {
		if y == x {
			return length, i
		}
		n := c.nodes[y]
		if n == nil {
			break
		}
		y = n.parent
	}
	return length, -1
}

// reach is how many blocks before a conversation's last one its next turn may leave its chain
// and still be recognised as continuing it: 1,024 tokens at vLLM's default block size.
const reach = 64

// Evicted reports how many blocks of the chain ending at tail the replica no longer holds,
// counted from the tail up to the deepest block still cached. ok is false when tail is not
// known (never stored, or forgotten).
func (c *Chains) Evicted(tail uint64) (evicted int, ok bool) {
	for x := tail; x != 0; evicted++ {
		n := c.nodes[x]
		if n == nil {
			return evicted, x != tail
		}
		if n.cached {
			return evicted, true
		}
		x = n.parent
	}
	return evicted, true
}
