package engine

import "math/bits"

// blockIndex maps a KV block's content hash to where it is held: the GPU block caching it,
// as vLLM's cached_block_hash_to_block does, or the host tier's slot storing it. Every
// prefix lookup, every cached or stored block and every eviction goes through it, so it is
// an open-addressing table with linear probing rather than a Go map: the hashes are already
// mixed and never 0, so a hash's top bits are its slot and 0 marks an empty one. It has room
// for twice the blocks it may hold, one hash per GPU block or host slot, which keeps probes
// short.
type blockIndex struct {
	hashes []uint64
	blocks []int32
	shift  uint // a hash's slot is its top bits: hash >> shift
	n      int
}

func newBlockIndex(numBlocks int) blockIndex {
	size := 1 << bits.Len(uint(2*numBlocks)) // above twice numBlocks
	return blockIndex{
		hashes: make([]uint64, size),
		blocks: make([]int32, size),
		shift:  uint(64 - bits.TrailingZeros(uint(size))),
	}
}

func (x *blockIndex) home(h uint64) int { return int(h >> x.shift) }

func (x *blockIndex) next(i int) int { return (i + 1) & (len(x.hashes) - 1) }

// get returns where h is held.
func (x *blockIndex) get(h uint64) (int32, bool) {
	for i := x.home(h); ; i = x.next(i) {
		switch x.hashes[i] {
		case h:
			return x.blocks[i], true
		case 0:
			return 0, false
		}
	}
}

// add maps h to b unless h is mapped already, and reports whether it did.
func (x *blockIndex) add(h uint64, b int32) bool {
	i := x.home(h)
	for ; x.hashes[i] != 0; i = x.next(i) {
		if x.hashes[i] == h {
			return false
		}
	}
	x.hashes[i], x.blocks[i] = h, b
	x.n++
	return true
}

// remove forgets h, which must be there. The entries after it in its run move back into the
// gap when their home allows, so that no later probe stops at the gap too early.
func (x *blockIndex) remove(h uint64) {
	gap := x.home(h)
	for x.hashes[gap] != h {
		gap = x.next(gap)
	}
	for j := x.next(gap); x.hashes[j] != 0; j = x.next(j) {
		// The entry at j may fill the gap unless its home lies after the gap, up to j.
		if home := x.home(x.hashes[j]); !between(gap, home, j) {
			x.hashes[gap], x.blocks[gap] = x.hashes[j], x.blocks[j]
			gap = j
		}
	}
	x.hashes[gap] = 0
	x.n--
}

// between reports whether slot k lies in (i, j], going round the table from i.
func between(i, k, j int) bool {
	if i <= j {
		return i < k && k <= j
	}
	return i < k || k <= j
}

// len is how many hashes are held.
func (x *blockIndex) len() int { return x.n }
