package lab

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
	"github.com/lmwarden/caddy-warden/loadcontrol"
	"github.com/lmwarden/caddy-warden/promptprefix"
)

// Arrival is what a proxy knows of a request when it picks its upstream.
type Arrival struct {
	// Key is the session header's value.
	Key string
	// Flow names whose request it is (Person.Name; "": no one told apart),
	// as a proxy tells flows apart by their API keys, and FlowWeight is
	// its weight (0 is 1).
	Flow       string
	FlowWeight float64
	// PromptBytes is the request body's size (its Content-Length).
	PromptBytes int64
	// Prefix is the system prompt part of the body, as promptprefix.Read
	// reads it from a real one.
	Prefix promptprefix.Prefix
	// Now is the arrival's virtual time.
	Now time.Duration
	// Side marks a side call to the small model (Config.SmallReplicas),
	// which the agent names auxiliary: load control lets it through.
	Side bool
}

// Policy routes requests to engines, as a proxy in front of them would.
type Policy interface {
	// Pick chooses the engine for a request. It returns -1 when no engine
	// can take it; otherwise release is called once when the request ends,
	// however it ends.
	Pick(a Arrival) (engine int, release func())
}

// Holder is a Policy that may hold a request at the proxy before choosing
// its engine (load control). dispatch is called once, at once or later in
// virtual time, with the engine (-1: none) and the release to call when the
// request ends, with what a proxy reads of its reply (warden_stop_reason):
// a conversation's last request (a session's last turn) ends the agent's
// task where every other reply calls a tool, as agentload asks of the
// simulator over HTTP, and the engine's prompt and cached tokens are what
// vLLM reports in usage; a request that got no whole reply gives the zero
// Reply. cancel, called when the run ends first, drops the request and
// reports whether it was still held.
type Holder interface {
	Hold(a Arrival, dispatch func(engine int, release func(loadcontrol.Reply))) (cancel func() bool)
}

// PolicyFactory builds a policy over env's engines. It may register periodic
// work with env.Every (metrics polls, sweeps).
type PolicyFactory func(env *Env) (Policy, error)

// Env is what a policy sees of the simulated fleet: the engines' addresses and
// their exported stats, a seeded random stream and a virtual-time scheduler.
type Env struct {
	cfg   Config
	fleet *simFleet
	rng   *rand.Rand
	tasks []*task
	run   *sim // the run in progress
	// whole is, for the Env of one model's engines (Env.part), the Env of
	// every engine, which runs the tasks and the runs; nil on that one.
	whole *Env
	first int // the part's first engine in whole's
	// kvEvents, when set, receives each engine's KV cache events at the
	// end of each of its steps, as vLLM publishes them.
	kvEvents func(engine int, events []engine.KVEvent)
	// refreshes is set when a policy refreshes conversations
	// (RefreshEvery): the runs then keep each one's last turn.
	refreshes bool
}

// task is periodic work of a policy; next survives from one run to the next
// when the fleet is kept warm.
type task struct {
	interval time.Duration
	next     time.Duration
	fn       func(now time.Duration)
}

func newEnv(cfg Config, f *simFleet, seed int64) *Env {
	for _, e := range f.engines { // a warm fleet: the last policy may have followed them
		e.DisableKVEvents()
	}
	return &Env{cfg: cfg, fleet: f, rng: rand.New(rand.NewPCG(uint64(seed), 0x1ab))}
}

// FollowKVEvents has fn receive each engine's KV cache events at the end of
// each of its steps, as a subscriber to vLLM's publisher would.
func (e *Env) FollowKVEvents(fn func(engine int, events []engine.KVEvent)) {
	for _, eng := range e.fleet.engines {
		eng.EnableKVEvents()
	}
	if e.whole == nil {
		e.kvEvents = fn
		return
	}
	others, first, n := e.whole.kvEvents, e.first, len(e.fleet.engines)
	e.whole.kvEvents = func(i int, events []engine.KVEvent) {
		switch {
		case i >= first && i < first+n:
			fn(i-first, events)
		case others != nil:
			others(i, events)
		}
	}
}

// part is the Env of the engines [first, first+n) of e's, as a policy that
// routes one model's requests sees them; its tasks run with e's.
func (e *Env) part(first, n int, seed uint64) *Env {
	f := *e.fleet
	f.engines, f.addresses = f.engines[first:first+n], f.addresses[first:first+n]
	return &Env{cfg: e.cfg, fleet: &f, rng: rand.New(rand.NewPCG(seed, 0x1ab)), whole: e, first: first}
}

// top is the Env that runs the tasks and the runs: e, or its whole.
func (e *Env) top() *Env {
	if e.whole != nil {
		return e.whole
	}
	return e
}

// Config returns the lab's configuration (profile, metrics interval, spill threshold).
func (e *Env) Config() Config { return e.cfg }

// Engines returns the number of engines.
func (e *Env) Engines() int { return len(e.fleet.engines) }

// Address returns engine i's upstream address, as a proxy would dial it.
func (e *Env) Address(i int) string { return e.fleet.addresses[i] }

// Stats returns what engine i's /metrics shows now.
func (e *Env) Stats(i int) engine.Stats { return e.fleet.engines[i].Stats() }

// Now is the run's virtual time.
func (e *Env) Now() time.Duration { return e.top().run.now }

// Rand is the policy's own random stream, seeded by the run's seed.
func (e *Env) Rand() *rand.Rand { return e.rng }

// Every calls fn now and then every interval of virtual time while requests run.
func (e *Env) Every(interval time.Duration, fn func(now time.Duration)) {
	top := e.top()
	top.tasks = append(top.tasks, &task{interval: interval, next: e.fleet.clock, fn: fn})
}

// Refresh is a conversation whose last turn a policy has sent again to an
// engine, for one token, so that the engine's cache keeps it.
type Refresh struct {
	Engine int
	Key    uint64 // selection.HashKey of the conversation's key
}

// RefreshEvery calls fn every interval of virtual time while requests run
// and sends each conversation it lists its last turn again (side calls
// aside), unless the one sent before still runs, as warden does for the
// conversations load control keeps (loadcontrol/refresh.go).
func (e *Env) RefreshEvery(interval time.Duration, fn func(now time.Duration) []Refresh) {
	top := e.top()
	top.refreshes = true
	e.Every(interval, func(now time.Duration) {
		for _, r := range fn(now) {
			top.run.refresh(e.first+r.Engine, r.Key)
		}
	})
}

// Policy names of DESIGN §4, plus vLLM balancer variants.
const (
	PolicyWarden     = "warden"
	PolicyOff        = "off"
	PolicyVLLM       = "vllm"
	PolicyVLLMv026   = "vllm-v026"
	PolicyVLLMv027   = "vllm-v027"
	PolicyHeader     = "header"
	PolicyLeastConn  = "least_conn"
	PolicyRoundRobin = "round_robin"
)

// DefaultPolicies are the rules the benchmark compares by default.
var DefaultPolicies = []string{PolicyWarden, PolicyOff, PolicyVLLM, PolicyHeader, PolicyLeastConn, PolicyRoundRobin}

// PolicyNames lists every policy the lab knows, sorted.
func PolicyNames() []string {
	names := make([]string, 0, len(policyFactories))
	for name := range policyFactories {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// CheckPolicies reports the first name the lab does not know.
func CheckPolicies(names []string) error {
	for _, n := range names {
		if _, ok := policyFactories[n]; !ok {
			return fmt.Errorf("unknown policy %q (known: %v)", n, PolicyNames())
		}
	}
	return nil
}
