package selection

import (
	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// Residency from the replicas' KV cache events. Where a replica publishes
// them (vLLM's --kv-events-config) and something follows them
// (kvevents.Subscriber), what a conversation pinned there still has cached
// is read from the events about its chain of blocks rather than from the
// engine's counters (cached.go): the events tell which blocks the replica
// evicted, the counters only how much it wrote. A conversation the events cannot tell of
// (its chain not singled out, a turn without usage) is judged by the
// counters, as on a replica without events.

// ChainSource is what a replica's KV cache events tell of conversations'
// chains of blocks (kvevents.Chains, and kvevents.Subscriber, which feeds
// one): Mark when a turn is sent, Tail to find the chain it stored once its
// reply said how many blocks it computed, Evicted what the replica has
// evicted of that chain since.
type ChainSource interface {
	Mark() uint64
	Tail(mark, end, prev uint64, blocks int) (tail uint64, ok bool)
	Evicted(tail uint64) (blocks int, ok bool)
}

// NeedsUsage reports whether the request's reply usage is worth reading
// for End: its replica follows its KV cache events and the request is its
// conversation's on its pin.
func (d Decision) NeedsUsage() bool {
	return d.router != nil && d.rep != nil && d.rep.chains.Load() != nil
}

// chainSource boxes a ChainSource for an atomic pointer.
type chainSource struct{ ChainSource }

// FollowChains makes rehoming judge the conversations pinned to the replica
// id by src, or again by its counters when src is nil. It reports whether
// the router knows the replica. The setting outlives config loads, as the
// replica's state does.
func (v *View) FollowChains(id string, src ChainSource) bool {
	r := v.router
	r.statesMu.Lock()
	s := r.states[id]
	r.statesMu.Unlock()
	if s == nil {
		return false
	}
	if src == nil {
		s.chains.Store(nil)
	} else {
		s.chains.Store(&chainSource{src})
	}
	return true
}

// chain is what a conversation's entry knows of its chain on rep: the mark
// taken when its last turn there was sent, then the last block of the
// chain that turn stored (0: not known), and the blocks' size. pending
// says the chain was not found when the turn ended, and is looked for once
// more, with end and blocks, when the conversation comes back.
type chain struct {
	rep     *replicaState
	mark    uint64
	tail    uint64
	bs      int
	pending bool
	looks   int
	end     uint64
	blocks  int
}

// sent notes, when e's first request in flight goes to rep, rep's mark.
func (e *session) sent(rep *replicaState) {
	src := rep.chains.Load()
	if src == nil || e.busy > 0 {
		return
	}
	if e.chain.rep != rep {
		if e.chain.pending { // moved before its chain was found
			e.chain.rep.chainsMissed.Add(1)
		}
		e.chain = chain{rep: rep}
	}
	e.chain.find(src)
	e.chain.mark = src.Mark()
}

// replied finds, when the conversation's last request on its pin ends with
// reply, the chain the turn stored: from the blocks it computed, among the
// chains begun since its mark and before now, so that a fork sent
// meanwhile, which extends the same chain, is not taken for it. A chain
// begun by then whose last events have not arrived yet is looked for again
// when the conversation comes back; one whose first events come later is
// not found.
func (e *session) replied(reply loadcontrol.Reply) {
	src := e.pin.chains.Load()
	if src == nil {
		e.chain = chain{}
		return
	}
	bs := e.pin.load.Load().BlockSize
	if e.chain.rep != e.pin || bs <= 0 || reply.PromptTokens <= 0 || !reply.CacheReported {
		e.chain = chain{}
		e.pin.chainsMissed.Add(1)
		return
	}
	// vLLM computes the KV of every token but the last it generates.
	computed := (reply.PromptTokens + reply.OutputTokens - 1) / bs
	e.chain.bs, e.chain.end, e.chain.blocks = bs, src.Mark(), computed-reply.CachedTokens/bs
	e.chain.pending, e.chain.looks = true, 0
	e.chain.find(src)
}

// find looks for a pending chain: when the turn ends, then once more when
// the conversation comes back, after which it is found or given up.
func (c *chain) find(src ChainSource) {
	if !c.pending {
		return
	}
	tail, ok := src.Tail(c.mark, c.end, c.tail, c.blocks)
	c.looks++
	switch {
	case ok:
		c.tail, c.pending = tail, false
		c.rep.chainsFound.Add(1)
	case c.looks > 1:
		c.tail, c.pending = 0, false
		c.rep.chainsMissed.Add(1)
	}
}

// evictedByChain is how many tokens of the conversation's last chain the
// pin's events say it evicted; ok is false when the events cannot tell.
func (e *session) evictedByChain() (tokens int, ok bool) {
	src := e.pin.chains.Load()
	if src == nil || e.chain.rep != e.pin {
		return 0, false
	}
	e.chain.find(src)
	if e.chain.tail == 0 || e.chain.pending {
		return 0, false
	}
	evicted, ok := src.Evicted(e.chain.tail)
	if !ok {
		return 0, false
	}
	return evicted * e.chain.bs, true
}
