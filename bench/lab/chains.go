package lab

import (
	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
	"github.com/lmwarden/caddy-warden/kvevents"
	"github.com/lmwarden/caddy-warden/loadcontrol"
	"github.com/lmwarden/caddy-warden/selection"
)

// PolicyWardenEvents is warden on a fleet that publishes its KV cache
// events: rehoming judges a conversation by what its pin's events say of
// its chain of blocks (selection/chains.go, kvevents.Chains), and by the
// engine's counters only where they cannot tell. The events arrive at the
// end of each engine step, as vLLM publishes them.
const PolicyWardenEvents = "warden-events"

// eventsPolicy is warden following each engine's KV cache events.
type eventsPolicy struct {
	*wardenPolicy
}

func newEventsPolicy(env *Env) (Policy, error) {
	w, err := newWarden(env, func(*selection.Config) {})
	if err != nil {
		return nil, err
	}
	chains := make([]*kvevents.Chains, env.Engines())
	for i := range chains {
		chains[i] = kvevents.NewChains(0)
		w.view.FollowChains(env.Address(i), chains[i])
	}
	env.FollowKVEvents(func(eng int, events []engine.KVEvent) { applyKVEvents(chains[eng], events) })
	return &eventsPolicy{w}, nil
}

// applyKVEvents is what a kvevents.Subscriber does with a batch: the host
// tier's events are skipped, since they say nothing of the GPU's cache.
func applyKVEvents(c *kvevents.Chains, events []engine.KVEvent) {
	for _, ev := range events {
		if ev.Medium != engine.MediumGPU {
			continue
		}
		switch ev.Kind {
		case engine.BlockStored:
			c.Stored(ev.ParentBlockHash, ev.BlockHashes)
		case engine.BlockRemoved:
			c.Removed(ev.BlockHashes)
		}
	}
}

// Hold sends the turn at once, as Pick does, and ends its decision with
// the reply's usage, as warden_stop_reason gives it in Caddy.
func (p *eventsPolicy) Hold(a Arrival, dispatch func(engine int, release func(loadcontrol.Reply))) func() bool {
	eng, d := p.decide(a)
	if eng < 0 {
		dispatch(eng, nil)
	} else {
		dispatch(eng, func(reply loadcontrol.Reply) { d.End(virtualTime(p.env.Now()), reply) })
	}
	return func() bool { return false }
}
