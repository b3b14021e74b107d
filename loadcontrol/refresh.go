package loadcontrol

import (
	"cmp"
	"slices"
	"time"
)

// Refreshing a kept conversation's cache. The room load control keeps for
// a flow within its share (flowshare.go) does not keep its blocks: the
// engine evicts the blocks freed longest ago first, and a person's, idle
// between two turns, are always those, while the farm's conversations
// free and take blocks every few seconds. Sending the conversation's last
// prompt again, for one token, takes its blocks and frees them anew, last
// in the engine's order: the farm then evicts its own. A replica with a
// host-memory tier needs none: what its GPU evicts comes back from the
// tier. The caller sends those requests; load control says which
// conversations they are for.

// Kept is an idle conversation kept resident for a flow within its share,
// and the replica that holds it.
type Kept struct {
	Key     uint64
	Replica Replica
}

// KeptIdle lists the conversations kept resident and idle at now for flows
// within their share on replicas without a host tier, ordered by key; none
// unless several flows share the fleet and load control holds turns.
func (v *View) KeptIdle(now time.Time) []Kept {
	g := v.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	if !v.on || g.aside.Load() || !g.fair.several() {
		return nil
	}
	sh := v.shares()
	var out []Kept
	for flow, h := range g.fair.held {
		if !sh.within(&g.fair, flow) {
			continue
		}
		for res := range h.residents {
			if res.running == 0 && !res.leaving && now.UnixNano()-res.idleSince < int64(lateReturnWithin) &&
				v.routing.KVTokens(res.rep) <= v.routing.GPUKVTokens(res.rep) {
				out = append(out, Kept{Key: res.key, Replica: res.rep})
			}
		}
	}
	slices.SortFunc(out, func(a, b Kept) int { return cmp.Compare(a.Key, b.Key) })
	return out
}

// KeepsPrompt reports whether t's request is worth keeping for the
// refreshes of its conversation's cache: its flow is within its share while
// several flows share the fleet, and t is not a side call (sidecall.go), or
// is the first turn on a compacted prefix (compacted), from which the
// conversation goes on.
func (t *Ticket) KeepsPrompt(compacted bool) bool {
	if t == nil {
		return false
	}
	v, g := t.view, t.view.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	return (!t.side || compacted) && v.on && !g.aside.Load() && g.fair.several() && v.shares().within(&g.fair, t.fair.flow)
}
