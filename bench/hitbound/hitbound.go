// Package hitbound computes the best prefix-cache hit rate any router could
// reach on a request stream: that of one prefix cache of unlimited size
// shared by every replica, so that nothing is ever evicted and no
// conversation is ever on the wrong replica.
//
// Requests are taken in arrival order. A request's bound hit is, in tokens,
// the block size times the length of the longest run of its leading full
// blocks whose contents some earlier request computed, counting at most
// (len(prompt)-1)/blockSize blocks because the last prompt token is always
// computed (its logits give the first output token), as vLLM's prefix lookup
// does. A request computes its prompt's full blocks from its arrival on and,
// once finished, the full blocks of its prompt followed by its output tokens
// except the last (whose KV is never computed).
package hitbound

// Bound follows a request stream. It is not safe for concurrent use.
type Bound struct {
	blockSize int
	seen      map[uint64]struct{}
}

// New returns a Bound for an engine with blockSize tokens per KV block.
func New(blockSize int) *Bound {
	return &Bound{blockSize: blockSize, seen: map[uint64]struct{}{}}
}

// Arrive returns the bound hit of a request whose prompt has promptTokens
// tokens and whose full blocks have the chained hashes given (equal hashes
// meaning equal prefixes, as the engine's BlockHashes), and records those
// blocks as computed. after is the hashes of an earlier request's prompt
// (the conversation's previous turn), or nil: the blocks the two share need
// no lookup, which keeps a long conversation from costing the square of its
// length.
func (b *Bound) Arrive(hashes []uint64, promptTokens int, after []uint64) (hitTokens int) {
	limit := (promptTokens - 1) / b.blockSize
	known := 0
	for known < min(len(hashes), len(after)) && hashes[known] == after[known] {
		known++
	}
	hitting := known <= limit
	hitTokens = min(known, limit) * b.blockSize
	for blk := known; blk < len(hashes); blk++ {
		if _, ok := b.seen[hashes[blk]]; !ok {
			hitting = false
			b.seen[hashes[blk]] = struct{}{}
		} else if hitting && blk < limit {
			hitTokens = (blk + 1) * b.blockSize
		} else {
			hitting = false
		}
	}
	return hitTokens
}

// Finish records the blocks a request computed past its prompt's full
// blocks: hashes are those of the full blocks of its prompt followed by its
// output tokens but the last (whose KV is never computed), from the first
// past the prompt's.
func (b *Bound) Finish(hashes []uint64) {
	for _, h := range hashes {
		b.seen[h] = struct{}{}
	}
}
