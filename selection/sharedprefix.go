package selection

import "slices"

// The shared prefix. An agent fleet's conversations start with the same
// system prompt and tools, which a replica's prefix cache holds once however
// many of them are resident there. Counting every resident's prompt whole
// overstates what a replica holds by that prefix for each resident but one,
// and by how much depends on the agent: with the seed workload's 3.5k shared
// tokens load control needed a fill of 1.3 to keep the four conversations a
// replica holds; with 15k shared and 2k of its own per conversation, that
// fill kept two or three where six fit, and load control ran at 0.62-0.87×
// the best baseline's throughput; with nothing shared, it let in a fourth
// that did not fit (lab, docs/policy.md#the-shared-prefix).
//
// So load control learns the shared prefix from what new conversations find
// cached: the cached part vLLM reports (--enable-prompt-tokens-details,
// read by warden_stop_reason) for a turn it placed by load on a replica
// that already held residents, mostly a conversation's first, is the
// prefix it shares with them.
// A replica's residents then hold the sum of their prompts less the shared
// prefix for each but one. Until enough replies report it, nothing counts
// as shared: every prompt counts whole, and fewer conversations are
// resident than fit, never more.

// sharedWindow is how many recent first turns the shared prefix is read
// from, and sharedAfter how many it waits for: their lower quartile, so
// that a few unusual first turns move it little either way. A fork of a
// conversation, new to load control, finds its parent's whole history
// cached, which other conversations do not share; a first turn beside a
// resident still in its first prefill finds nothing. Of a fleet of two
// agents, it is the smaller one's prefix while that agent brings at least
// one first turn in four: overcounting the sharing would overfill the
// caches, undercounting only keeps fewer resident.
const (
	sharedWindow = 16
	sharedAfter  = 4
)

// sharedPrefix is the tokens new conversations find cached, read from the
// last sharedWindow first turns (g.mu held for its methods).
type sharedPrefix struct {
	recent [sharedWindow]int
	n      int // first turns observed
	tokens int // the lower quartile of recent
}

// observe adds a first turn that found cached tokens of its prompt.
func (p *sharedPrefix) observe(cached int) {
	p.recent[p.n%sharedWindow] = cached
	p.n++
	sorted := slices.Clone(p.recent[:min(p.n, sharedWindow)])
	slices.Sort(sorted)
	p.tokens = sorted[(len(sorted)-1)/4]
}

// known reports whether enough first turns were observed.
func (p *sharedPrefix) known() bool { return p.n >= sharedAfter }

// value is the shared prefix in tokens, 0 until known.
func (p *sharedPrefix) value() int {
	if !p.known() {
		return 0
	}
	return p.tokens
}

// distinct is what a replica holding h holds with a prompt of tokens more
// (0: none): the prompts less the shared prefix for each but one, and never
// less than the new prompt or a mean one, so that conversations that share
// less than the prefix (another agent's, a sub-agent with its own system
// prompt) cannot make a replica look all but empty.
func (g *gate) distinct(h residency, tokens int) int {
	n, sum := h.with(tokens)
	if n <= 1 {
		return sum
	}
	return max(sum-(n-1)*g.shared.value(), tokens, sum/n)
}

// with is how many conversations, and how many tokens, h holds with a
// prompt of tokens more (0: none).
func (h residency) with(tokens int) (count, sum int) {
	if tokens > 0 {
		return h.count + 1, h.tokens + tokens
	}
	return h.count, h.tokens
}
