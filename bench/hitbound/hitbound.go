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

// Chain is where a token sequence's block hashes stopped: the hash of its
// last full block and how many tokens those blocks cover.
type Chain struct {
	hash   uint64
	tokens int
}

// Arrive returns the bound hit of a request with prompt, in tokens, and
// records its prompt's full blocks as computed.
func (b *Bound) Arrive(prompt []uint32) (hitTokens int, c Chain) {
	limit := (len(prompt) - 1) / b.blockSize
	hitting := true
	for blk := range len(prompt) / b.blockSize {
		c = b.next(c, prompt)
		if _, ok := b.seen[c.hash]; !ok {
			hitting = false
			b.seen[c.hash] = struct{}{}
		} else if hitting && blk < limit {
			hitTokens = c.tokens
		} else {
			hitting = false
		}
	}
	return hitTokens, c
}

// Finish records the full blocks of prompt followed by the computed output
// tokens (all but the last), continuing from the prompt's chain c.
func (b *Bound) Finish(c Chain, prompt, output []uint32) {
	if len(output) < 2 {
		return
	}
	tail := append(prompt[c.tokens:len(prompt):len(prompt)], output[:len(output)-1]...)
	rest := Chain{hash: c.hash}
	for range len(tail) / b.blockSize {
		rest = b.next(rest, tail)
		b.seen[rest.hash] = struct{}{}
	}
}

// next extends c by the block of tokens starting at c.tokens: FNV-1a, a token
// at a time, over the parent hash and the block, so equal hashes mean equal
// prefixes.
func (b *Bound) next(c Chain, tokens []uint32) Chain {
	const prime = 1099511628211
	h := uint64(14695981039346656037) ^ c.hash
	h *= prime
	for _, t := range tokens[c.tokens : c.tokens+b.blockSize] {
		h = (h ^ uint64(t)) * prime
	}
	return Chain{hash: h, tokens: c.tokens + b.blockSize}
}
