package lab

import (
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/dplb"
	"github.com/lmwarden/caddy-warden/selection"
)

// policyFactories are the rules the lab can run, by name. New rules (issue 8)
// join here.
var policyFactories = map[string]PolicyFactory{
	PolicyWarden:     newRouterPolicy(true, ""), // the router's default rule
	PolicySeed:       newRouterPolicy(true, selection.RuleSeed),
	PolicyCacheFit:   newRouterPolicy(true, selection.RuleCacheFit),
	PolicyOff:        newRouterPolicy(false, ""),
	PolicyVLLM:       newVLLMPolicy(dplb.V026Dense),
	PolicyVLLMv026:   newVLLMPolicy(dplb.V026),
	PolicyVLLMv027:   newVLLMPolicy(dplb.V027),
	PolicyHeader:     newHeaderPolicy,
	PolicyLeastConn:  newLeastConnPolicy,
	PolicyRoundRobin: newRoundRobinPolicy,
}

// routerPolicy is the warden policy: selection.Router fed as in production,
// with the engines' metrics only at each poll, so it works on stale load
// between polls exactly as behind Caddy.
type routerPolicy struct {
	router *selection.Router
	index  map[string]int
}

func newRouterPolicy(affinity bool, rule string) PolicyFactory {
	return func(env *Env) (Policy, error) {
		cfg := env.Config()
		replicas := make([]selection.Replica, env.Engines())
		index := make(map[string]int, len(replicas))
		for i := range replicas {
			addr := env.Address(i)
			replicas[i] = selection.Replica{ID: addr, Address: addr}
			index[addr] = i
		}
		router := selection.NewRouter("lab", selection.Config{
			MaxNumSeqs:     cfg.Profile.MaxNumSeqs,
			SpillThreshold: cfg.SpillThreshold,
			Affinity:       affinity,
			Rule:           rule,
		}, replicas, virtualTime(env.fleet.clock))
		for _, r := range replicas {
			router.SetHealthy(r.ID, true)
		}
		capacity := float64(cfg.Profile.KVCapacityTokens()) // from vllm:cache_config_info
		env.Every(cfg.MetricsInterval, func(time.Duration) {
			for i, r := range replicas {
				st := env.Stats(i)
				router.SetLoad(r.ID, selection.Load{
					Running: float64(st.Running), Waiting: float64(st.Waiting), KVUsage: st.KVUsage,
					KVCapacityTokens: capacity, Known: true,
				})
			}
		})
		// Caddy's warden app sweeps every second.
		env.Every(time.Second, func(now time.Duration) { router.Sweep(virtualTime(now)) })
		return &routerPolicy{router: router, index: index}, nil
	}
}

func (p *routerPolicy) Pick(a Arrival) (int, func()) {
	d := p.router.Pick(selection.Request{Key: a.Key, PromptBytes: a.PromptBytes, Now: virtualTime(a.Now)})
	rep, ok := d.Replica()
	if !ok {
		return -1, nil
	}
	return p.index[rep.ID], d.Release
}

// vllmPolicy is one vLLM API server with --data-parallel-size N balancing
// over its engines with its internal balancer; engines publish their queues
// to it every dplb.StatsInterval in the modes that publish at all.
type vllmPolicy struct {
	balancer *dplb.Balancer
}

func newVLLMPolicy(mode dplb.Mode) PolicyFactory {
	return func(env *Env) (Policy, error) {
		b, err := dplb.New(mode, env.Engines())
		if err != nil {
			return nil, err
		}
		if b.PublishesStats() {
			loads := make([]dplb.EngineLoad, env.Engines())
			env.Every(dplb.StatsInterval, func(time.Duration) {
				for i := range loads {
					st := env.Stats(i)
					loads[i] = dplb.EngineLoad{Waiting: st.Waiting, Running: st.Running, KVUsage: st.KVUsage}
				}
				b.Publish(loads)
			})
		}
		return &vllmPolicy{balancer: b}, nil
	}
}

func (p *vllmPolicy) Pick(Arrival) (int, func()) {
	rank := p.balancer.Choose()
	return rank, func() { p.balancer.Done(rank) }
}

// headerPolicy is Caddy's `lb_policy header X-Claude-Code-Session-Id`:
// rendezvous hashing of the header value over the upstreams (Caddy v2.11.9
// hostByHashing: the highest xxhash of dial address + key wins), blind to load.
type headerPolicy struct {
	addresses []string
}

func newHeaderPolicy(env *Env) (Policy, error) {
	p := &headerPolicy{addresses: make([]string, env.Engines())}
	for i := range p.addresses {
		p.addresses[i] = env.Address(i)
	}
	return p, nil
}

func (p *headerPolicy) Pick(a Arrival) (int, func()) {
	best := -1
	var highest uint64
	for i, addr := range p.addresses {
		if h := xxhash.Sum64String(addr + a.Key); h > highest {
			best, highest = i, h
		}
	}
	return best, func() {}
}

// leastConnPolicy is Caddy's least_conn: the upstream with the fewest
// requests in flight through the proxy, ties broken by reservoir sampling.
type leastConnPolicy struct {
	env      *Env
	inFlight []int
}

func newLeastConnPolicy(env *Env) (Policy, error) {
	return &leastConnPolicy{env: env, inFlight: make([]int, env.Engines())}, nil
}

func (p *leastConnPolicy) Pick(Arrival) (int, func()) {
	best, ties := -1, 0
	for i, n := range p.inFlight {
		switch {
		case best < 0 || n < p.inFlight[best]:
			best, ties = i, 1
		case n == p.inFlight[best]:
			ties++
			if p.env.Rand().IntN(ties) == 0 {
				best = i
			}
		}
	}
	p.inFlight[best]++
	return best, func() { p.inFlight[best]-- }
}

// roundRobinPolicy is Caddy's round_robin: a counter advanced before each
// choice, so the first request goes to the second upstream.
type roundRobinPolicy struct {
	engines int
	robin   int
}

func newRoundRobinPolicy(env *Env) (Policy, error) {
	return &roundRobinPolicy{engines: env.Engines()}, nil
}

func (p *roundRobinPolicy) Pick(Arrival) (int, func()) {
	p.robin++
	return p.robin % p.engines, func() {}
}
