// Package lab is the virtual-time benchmark: the seed's workload (bench/agentload),
// simulated vLLM engines (bench/vllmsim/engine) and a routing policy, run as a
// deterministic discrete-event simulation with no HTTP and no goroutines, so
// that every routing rule can be compared at every level in seconds.
//
// Requests are tokenized exactly as the simulator's HTTP server tokenizes
// them, and each reply the engine generates goes back into the session's
// history, so multi-turn prefix hits are faithful. The warden policy is the
// real selection.Router, fed the engines' metrics only at each metrics poll,
// so stale load is modelled too. Baselines are vLLM's internal balancer
// (bench/vllmsim/dplb) and Caddy's own header, least_conn and round_robin.
//
// Each run's closed loop runs for Config.Warmup before its measured
// Config.Duration; every number of the row (results, engine counters, busy
// samples, hit bound) covers the measured window only, but the time per
// conversation: the loop goes on past the window, at the same load, until
// every conversation sent in the window has ended (at most
// Config.ConversationTail), and each is timed to its end.
//
// Each (policy, level) starts from a fresh fleet (empty caches, zeroed
// counters) unless Config.Warm is set, in which case one fleet serves every
// run of a seed in order, policies then levels, as the seed's own
// measurements did (affinity off then on without restarting vLLM); its
// policies then keep their state across levels too.
package lab

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/report"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
)

// Config is everything a lab run depends on besides the policy, the level and the seed.
type Config struct {
	// Workload is the session model; its Seed is replaced by each run's seed.
	Workload agentload.Config
	// Profile is every engine's model.
	Profile engine.Profile
	// HostTierTimesGPU, when positive, sizes every engine's host-memory KV
	// tier as this multiple of its GPU KV cache, in place of
	// Profile.KVOffloadingSize, so that the tier follows the cache a shape
	// or a flag gives the engines.
	HostTierTimesGPU float64
	// Replicas is the number of engines.
	Replicas int
	// Warmup is how long each run's closed loop runs before its measured
	// Duration starts, so that sessions are staggered and caches filled as in
	// a steady state; nothing of the warm-up is measured.
	Warmup time.Duration
	// Duration is the simulated, measured length of each run (one level of one policy).
	Duration time.Duration
	// ConversationTail is how long past Duration the closed loop may go on
	// so that the conversations sent in the window finish and are timed;
	// those it cuts count as conversations cut. 0 times only the
	// conversations that finish in the window, as an end-to-end run does.
	ConversationTail time.Duration
	// MidConversation starts each session's first conversation at a turn
	// drawn at random from its turns, the turns before it filled in with
	// the replies the model would give but not sent, so that a run begins
	// with conversations of every age, as a fleet that has been running
	// for a while has. Started all at their first turn, conversations that
	// outlive the warm-up keep in step, and the window measures how far
	// each policy got along them rather than its steady state.
	MidConversation bool
	// MetricsInterval is how often the warden policy sees the engines' metrics.
	MetricsInterval time.Duration
	// SpillThreshold is the warden's manual spill threshold; 0 is auto (moves by expected cost).
	SpillThreshold int
	// BodyBytesPerToken is the request bodies' bytes per prompt token, as
	// a proxy sees them; 0 is the simulator's tokenizer, 4 bytes per
	// token. Another value scales every body's size, as a tokenizer denser
	// or looser than the simulator's would, while the engines' tokens stay
	// the same.
	BodyBytesPerToken float64
	// HideCachedTokens leaves the cached part out of the replies that load
	// control reads, as vLLM does without --enable-prompt-tokens-details,
	// its default; load control then reads the shared prefix from the
	// requests (Arrival.Prefix).
	HideCachedTokens bool
	// Warm keeps one fleet for all runs of a seed instead of a fresh one per
	// run; each run starts where the last one stopped, after its
	// ConversationTail.
	Warm bool
	// People, when set, share the fleet instead of the level's sessions
	// (whose number must be theirs in all): each has its own sessions and
	// think time, its turns in its own flow, and its own row. OneFlow puts
	// every person's turns in one flow, as a proxy that tells no one apart
	// (load control's queue is then first come, first served).
	People  []Person
	OneFlow bool
	// SmallReplicas are engines of the same profile that serve
	// Workload.SmallModel, the side calls' model, beside the Replicas that
	// serve the main turns, each model routed by its own instance of the
	// policy as a Caddy site routes by warden_model; each model gets its
	// own rows. 0 without a small model.
	SmallReplicas int
}

// DefaultWarmup is Config.Warmup's default: at every level of the seed's
// workload some sessions have ended and been replaced by then, so sessions no
// longer start and end in lockstep when the measurement begins.
const DefaultWarmup = time.Minute

// DefaultConversationTail is Config.ConversationTail's default: several times
// the longest conversation of the seed's workload at 32 sessions.
const DefaultConversationTail = 30 * time.Minute

// DefaultConfig is the seed's setup: its workload on 4 engines of the
// a4000-qwen3-4b profile, 3 minutes per level after a minute of warm-up,
// metrics every second.
func DefaultConfig() Config {
	return Config{
		Workload:         agentload.DefaultConfig(),
		Profile:          engine.Profiles[engine.DefaultProfile],
		Replicas:         4,
		Warmup:           DefaultWarmup,
		Duration:         3 * time.Minute,
		ConversationTail: DefaultConversationTail,
		MetricsInterval:  time.Second,
	}
}

// Validate reports the first setting that cannot run.
func (c Config) Validate() error {
	var errs []error
	if c.Replicas < 1 {
		errs = append(errs, fmt.Errorf("replicas must be at least 1, got %d", c.Replicas))
	}
	if c.Warmup < 0 {
		errs = append(errs, fmt.Errorf("warm-up must not be negative, got %v", c.Warmup))
	}
	if c.Duration <= 0 {
		errs = append(errs, fmt.Errorf("duration must be positive, got %v", c.Duration))
	}
	if c.ConversationTail < 0 {
		errs = append(errs, fmt.Errorf("conversation tail must not be negative, got %v", c.ConversationTail))
	}
	if c.MetricsInterval <= 0 {
		errs = append(errs, fmt.Errorf("metrics interval must be positive, got %v", c.MetricsInterval))
	}
	if (c.Workload.SmallModel != "") != (c.SmallReplicas > 0) {
		errs = append(errs, fmt.Errorf("a small model and its replicas go together: got model %q and %d replicas", c.Workload.SmallModel, c.SmallReplicas))
	}
	if c.SpillThreshold < 0 {
		errs = append(errs, fmt.Errorf("spill threshold must be 0 (auto) or positive, got %d", c.SpillThreshold))
	}
	if c.HostTierTimesGPU < 0 || math.IsNaN(c.HostTierTimesGPU) {
		errs = append(errs, fmt.Errorf("host tier must be 0 (the profile's) or a positive multiple of the GPU KV cache, got %g", c.HostTierTimesGPU))
	}
	if c.BodyBytesPerToken < 0 {
		errs = append(errs, fmt.Errorf("body bytes per token must be 0 (the simulator's) or positive, got %g", c.BodyBytesPerToken))
	}
	errs = append(errs, c.Workload.Validate(), c.EngineProfile().Validate())
	return errors.Join(errs...)
}

// EngineProfile is Profile with its host tier sized by HostTierTimesGPU, if set.
func (c Config) EngineProfile() engine.Profile {
	return WithHostTierTimesGPU(c.Profile, c.HostTierTimesGPU)
}

// WithHostTierTimesGPU returns p with a host tier of times its GPU KV cache,
// or p unchanged when times is 0.
func WithHostTierTimesGPU(p engine.Profile, times float64) engine.Profile {
	if times > 0 {
		p.KVOffloadingSize = times * p.KVCacheGiB()
	}
	return p
}

// Run simulates policy with sessions concurrent sessions for cfg.Warmup then
// cfg.Duration from a fresh fleet and returns its row of the table.
func Run(cfg Config, policy string, sessions int, seed int64) (report.Row, error) {
	rows, err := Sweep(cfg, Plan{Policies: []string{policy}, Levels: []int{sessions}, Seeds: []int64{seed}}, 1, nil)
	if err != nil {
		return report.Row{}, err
	}
	return rows[0], nil
}

// Plan lists the runs of a sweep: every policy at every level for every seed.
type Plan struct {
	Policies []string
	Levels   []int
	Seeds    []int64
}

// Runs is the number of (policy, level, seed) runs in the plan.
func (p Plan) Runs() int { return len(p.Policies) * len(p.Levels) * len(p.Seeds) }

func (p Plan) check() error {
	if p.Runs() == 0 {
		return errors.New("lab: the plan needs at least one policy, level and seed")
	}
	for _, l := range p.Levels {
		if l < 1 {
			return fmt.Errorf("lab: sessions must be at least 1, got %d", l)
		}
	}
	return CheckPolicies(p.Policies)
}

// models are the names of the models the rows measure: "" for the only
// one, else the main model and the small one.
func (c Config) models() []string {
	if c.SmallReplicas == 0 {
		return []string{""}
	}
	return []string{c.Workload.Model, c.Workload.SmallModel}
}

// Sweep runs the plan on up to workers goroutines (0: one per CPU) and returns
// one row per run (with people, one per person of each run; with a small
// model, those of each model, the main one's first), ordered by
// seed, policy, then level. The rows do not depend on workers. progress, if not nil, is called after each run, from any
// goroutine but never concurrently.
func Sweep(cfg Config, plan Plan, workers int, progress func()) ([]report.Row, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	if err := plan.check(); err != nil {
		return nil, err
	}
	// The engines, and the policies that read their profile, see the tier sized.
	cfg.Profile, cfg.HostTierTimesGPU = cfg.EngineProfile(), 0
	if err := checkPlan(cfg.People, plan); err != nil {
		return nil, err
	}
	perRun := max(1, len(cfg.People)) * len(cfg.models())
	// A job is what must run in sequence: one run from a fresh fleet, or a
	// whole seed on its warm fleet.
	type job struct {
		seed     int64
		policies []string
		levels   []int
		first    int // index of the job's first row
	}
	var jobs []job
	for _, seed := range plan.Seeds {
		if cfg.Warm {
			jobs = append(jobs, job{seed, plan.Policies, plan.Levels, len(jobs) * len(plan.Policies) * len(plan.Levels) * perRun})
			continue
		}
		for _, p := range plan.Policies {
			for _, l := range plan.Levels {
				jobs = append(jobs, job{seed, []string{p}, []int{l}, len(jobs) * perRun})
			}
		}
	}
	rows := make([]report.Row, plan.Runs()*perRun)
	errs := make([]error, len(jobs))
	var progressMu sync.Mutex
	done := func() {
		if progress != nil {
			progressMu.Lock()
			progress()
			progressMu.Unlock()
		}
	}
	if workers <= 0 {
		workers = runtime.NumCPU()
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, len(jobs)) {
		wg.Go(func() {
			for i := range next {
				j := jobs[i]
				errs[i] = runSeries(cfg, j.seed, j.policies, j.levels, rows[j.first:], done)
			}
		})
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return rows, nil
}

// runSeries runs policies x levels in order on one fleet, writing rows in order.
func runSeries(cfg Config, seed int64, policies []string, levels []int, rows []report.Row, done func()) error {
	f, err := newFleet(cfg)
	if err != nil {
		return err
	}
	i := 0
	for _, name := range policies {
		env := newEnv(cfg, f, seed)
		policy, policies, err := newModelsPolicy(env, name)
		if err != nil {
			return fmt.Errorf("lab: policy %s: %w", name, err)
		}
		for _, sessions := range levels {
			out, err := simulate(env, policy, sessions, seed)
			if err != nil {
				return fmt.Errorf("lab: %s at %d sessions, seed %d: %w", name, sessions, seed, err)
			}
			for m, modelRows := range out.rows(name, cfg.People) {
				for _, row := range modelRows {
					if o, ok := policies[m].(outcomeCounter); ok {
						row.Outcomes = o.outcomes()
					}
					rows[i] = row
					i++
				}
			}
			done()
		}
	}
	return nil
}
