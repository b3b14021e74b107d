package lab

import (
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/dplb"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
	"github.com/lmwarden/caddy-warden/fleet"
	"github.com/lmwarden/caddy-warden/loadcontrol"
	"github.com/lmwarden/caddy-warden/metricsfeed"
	"github.com/lmwarden/caddy-warden/selection"
)

// policyFactories are the rules the lab can run, by name.
var policyFactories = map[string]PolicyFactory{
	PolicyWarden:          newWardenPolicy(true),
	PolicyOff:             newWardenPolicy(false),
	PolicyVLLM:            newVLLMPolicy(dplb.V026Dense),
	PolicyVLLMv026:        newVLLMPolicy(dplb.V026),
	PolicyVLLMv027:        newVLLMPolicy(dplb.V027),
	PolicyHeader:          newHeaderPolicy,
	PolicyLeastConn:       newLeastConnPolicy,
	PolicyRoundRobin:      newRoundRobinPolicy,
	PolicyAdmission:       newAdmissionPolicy(loadcontrol.Config{}),
	PolicyAdmissionGentle: newAdmissionPolicy(gentleAdmission),
	PolicyAdmissionFarm:   newAdmissionPolicy(farmAdmission),
	PolicyWardenEvents:    newEventsPolicy,
}

// wardenPolicy is the warden policy as Caddy runs it: the same fleet
// runtime (health trackers, scrape to load, sweeper, history) fed each
// engine's metrics and health at every poll, so that it routes on load as
// stale between polls as behind Caddy.
type wardenPolicy struct {
	env   *Env
	view  *selection.View
	index map[string]int
}

func newWardenPolicy(affinity bool) PolicyFactory {
	return func(env *Env) (Policy, error) {
		return newWarden(env, func(c *selection.Config) { c.Affinity = affinity })
	}
}

// newWarden wires the warden policy with the lab's routing settings, as
// tune changes them.
func newWarden(env *Env, tune func(*selection.Config)) (*wardenPolicy, error) {
	cfg := env.Config()
	replicas := make([]selection.Replica, env.Engines())
	index := make(map[string]int, len(replicas))
	for i := range replicas {
		addr := env.Address(i)
		replicas[i] = selection.Replica{ID: addr, Address: addr}
		index[addr] = i
	}
	model := fleet.New("lab", cfg.MetricsInterval, virtualTime(env.fleet.clock), nil)
	routing := selection.Config{
		MaxNumSeqs:     cfg.Profile.MaxNumSeqs,
		SpillThreshold: cfg.SpillThreshold,
		Affinity:       true,
	}
	tune(&routing)
	plan := model.Prepare(fleet.Spec{
		Routing:         routing,
		Replicas:        replicas,
		MetricsInterval: cfg.MetricsInterval,
	})
	model.Apply(plan)
	env.Every(cfg.MetricsInterval, func(now time.Duration) {
		at := virtualTime(now)
		for i, r := range replicas {
			model.ObserveScrape(r.Address, at, scrapeOf(env.Stats(i), cfg.Profile), nil)
			model.ObserveHealth(r.Address, at, nil)
		}
	})
	env.Every(fleet.SweepInterval, func(now time.Duration) { model.Tick(virtualTime(now)) })
	return &wardenPolicy{env: env, view: plan.View(), index: index}, nil
}

func (p *wardenPolicy) Pick(a Arrival) (int, func()) {
	eng, d := p.decide(a)
	if eng < 0 {
		return -1, nil
	}
	return eng, func() { d.End(virtualTime(p.env.Now()), loadcontrol.Reply{}) }
}

// decide is Pick's choice with the router's decision, whose outcome tests
// judge: the engine, -1 for none.
func (p *wardenPolicy) decide(a Arrival) (int, selection.Decision) {
	req := selection.Request{Key: a.Key, PromptTokens: p.view.EstimateTokens(a.PromptBytes), Now: virtualTime(a.Now)}
	if p.view.WantsPrefix(selection.HashKey(a.Key)) {
		req.Prefix = a.Prefix
	}
	d := p.view.Pick(req)
	rep, ok := d.Replica()
	if !ok {
		return -1, d
	}
	return p.index[rep.ID], d
}

// outcomeCounter is a policy that counts why it routed each request where
// it did (selection.Outcome), since it started.
type outcomeCounter interface{ outcomes() map[string]uint64 }

func (p *wardenPolicy) outcomes() map[string]uint64 {
	out := map[string]uint64{}
	for _, r := range p.view.Status().Replicas {
		for name, n := range map[string]uint64{
			"sticky": r.Sticky, "placed": r.Placed, "replaced": r.Replaced, "spilled": r.SpilledIn,
			"unpinned": r.Unpinned, "joined": r.Joined, "rehomed": r.Rehomed,
		} {
			if n > 0 {
				out[name] += n
			}
		}
	}
	return out
}

// scrapeOf is what metricsfeed parses from the engine's /metrics as the
// simulator serves it: one engine, every series present, the host tier's
// with a tier.
func scrapeOf(st engine.Stats, p engine.Profile) metricsfeed.Scrape {
	var success uint64
	for _, n := range st.RequestSuccess {
		success += n
	}
	present := allFields
	if p.HostTier() {
		present |= metricsfeed.FieldExternalQueries | metricsfeed.FieldExternalHits | metricsfeed.FieldHostStoredBytes
	}
	return metricsfeed.Scrape{Engines: []metricsfeed.EngineStats{{
		Running:            st.Running,
		Waiting:            st.Waiting,
		KVUsage:            st.KVUsage,
		PrefixQueries:      float64(st.PrefixCacheQueries),
		PrefixHits:         float64(st.PrefixCacheHits),
		PromptTokens:       float64(st.PromptTokens),
		PromptTokensCached: float64(st.PromptTokensCached),
		GenerationTokens:   float64(st.GenerationTokens),
		Preemptions:        float64(st.Preemptions),
		TTFTSeconds:        st.TTFT.Sum,
		TTFTCount:          float64(st.TTFT.Count),
		RequestSuccess:     float64(success),
		BlockSize:          p.BlockSize,
		NumGPUBlocks:       p.NumGPUBlocks,
		ExternalQueries:    float64(st.ExternalPrefixCacheQueries),
		ExternalHits:       float64(st.ExternalPrefixCacheHits),
		HostStoredBytes:    st.Offload[engine.GPUToCPU].Bytes,
		HostTierGiB:        p.KVOffloadingSize,
		Present:            present,
	}}}
}

// allFields are every series the simulator's /metrics carries.
const allFields = metricsfeed.FieldRunning | metricsfeed.FieldWaiting | metricsfeed.FieldKVUsage |
	metricsfeed.FieldPrefixQueries | metricsfeed.FieldPrefixHits | metricsfeed.FieldPromptTokens |
	metricsfeed.FieldPromptTokensCached | metricsfeed.FieldGenerationTokens | metricsfeed.FieldPreemptions |
	metricsfeed.FieldRequestSuccess | metricsfeed.FieldBlockSize | metricsfeed.FieldNumGPUBlocks | metricsfeed.FieldTTFT

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
