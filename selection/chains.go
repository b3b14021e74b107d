package selection

// Residency from the replicas' KV cache events. Where a replica publishes
// them (vLLM's --kv-events-config) and something follows them
// (kvevents.Subscriber), rehoming judges a conversation pinned there by what
// the events say of its chain of blocks rather than by the engine's counters
// (rehome.go): the events tell which blocks the replica evicted, the
// counters only how much it wrote. A conversation the events cannot tell of
// (its chain not singled out, a turn without usage) is judged by the
// counters, as on a replica without events.

// ChainSource is what a replica's KV cache events tell of conversations'
// chains of blocks (kvevents.Chains, and kvevents.Subscriber, which feeds
// one): Mark when a turn is sent, Tail to find the chain it stored once its
// reply said how many blocks it computed, Evicted what the replica has
// evicted of that chain since.
type ChainSource interface {
	Mark() uint64
	Tail(mark, prev uint64, blocks int) (tail uint64, ok bool)
	Evicted(tail uint64) (blocks int, ok bool)
}

// ChainColdShare is how much of a conversation's last prompt its pin may
// have evicted, by its KV cache events, for it still to count as cached
// there: a conversation moves once its pin holds less than half of it.
// The counters' ColdShare is lower because they guess; with the events'
// exact count, a quarter moved conversations whose pins still held most
// of them (lab, seed workload at 16 sessions: 14,482 tok/min against
// 15,065 at a half; the grid: two TTFB p95 losses at a quarter, none at
// a half; docs/policy.md#rehoming).
const ChainColdShare = 0.5

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
// chain that turn stored (0: not known), and the blocks' size.
type chain struct {
	rep  *replicaState
	mark uint64
	tail uint64
	bs   int
}

// sent notes, when e's first request in flight goes to rep, rep's mark.
func (e *session) sent(rep *replicaState) {
	src := rep.chains.Load()
	if src == nil || e.busy > 0 {
		return
	}
	if e.chain.rep != rep {
		e.chain = chain{rep: rep}
	}
	e.chain.mark = src.Mark()
}

// replied finds, when the conversation's last request on its pin ends with
// reply, the chain the turn stored: from the blocks it computed, among the
// runs stored since its mark. It looks now rather than at the next turn, so
// that a fork sent meanwhile, which extends the same chain, is not taken for
// it; if the events of the turn's last steps have not arrived yet, the
// chain found ends a few blocks short, which changes little of what its
// replica is found to have evicted.
func (e *session) replied(reply Reply) {
	src := e.pin.chains.Load()
	bs := e.pin.load.Load().BlockSize
	if src == nil || e.chain.rep != e.pin || bs <= 0 || reply.PromptTokens <= 0 || !reply.CacheReported {
		e.chain = chain{}
		return
	}
	// vLLM computes the KV of every token but the last it generates.
	computed := (reply.PromptTokens + reply.OutputTokens - 1) / bs
	tail, ok := src.Tail(e.chain.mark, e.chain.tail, computed-reply.CachedTokens/bs)
	if !ok {
		tail = 0
	}
	e.chain.tail, e.chain.bs = tail, bs
}

// coldByChain is cold as the pin's events tell it: the pin evicted more of
// the conversation's last chain than ChainColdShare of its last prompt. ok
// is false when the events cannot tell.
func (e *session) coldByChain() (cold, ok bool) {
	src := e.pin.chains.Load()
	if src == nil || e.chain.rep != e.pin || e.chain.tail == 0 {
		return false, false
	}
	evicted, ok := src.Evicted(e.chain.tail)
	if !ok {
		return false, false
	}
	return float64(evicted*e.chain.bs) > ChainColdShare*float64(e.lastPrompt), true
}
