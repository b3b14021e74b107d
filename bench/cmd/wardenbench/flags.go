package main

import (
	"flag"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/lab"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
)

// common holds the flags every subcommand shares.
type common struct {
	levels    intList
	warmup    time.Duration
	duration  time.Duration
	seed      int64
	seeds     int64List
	policies  stringList
	replicas  int
	jsonPath  string
	plotsDir  string
	workload  agentload.Config
	profile   engine.Profile
	spill     int
	metricsIv time.Duration
	// cachedTokens: the replicas report the cached part of each prompt, as
	// vLLM does with --enable-prompt-tokens-details.
	cachedTokens bool
	// hostTierTimes sizes the replicas' host tier as this multiple of their
	// GPU KV cache (--kv-offloading-size Nx) in place of profile's GiB.
	hostTierTimes float64
	// smallReplicasFlag serve the workload's small model, if it has one.
	smallReplicasFlag int
}

// newCommon returns the defaults: the seed's levels, 3 minutes per level,
// seed 1, every DESIGN §4 policy, the seed's workload on 4 replicas of the
// profile named in args (--profile, default a4000-qwen3-4b).
func newCommon(args []string) (*common, error) {
	name := profileName(args)
	p, ok := engine.Profiles[name]
	if !ok {
		return nil, fmt.Errorf("unknown profile %q", name)
	}
	return &common{
		levels:    intList{4, 8, 16, 24, 32},
		warmup:    time.Minute,
		duration:  3 * time.Minute,
		seed:      1,
		policies:  stringList(lab.DefaultPolicies),
		replicas:  4,
		workload:  agentload.DefaultConfig(),
		profile:   p,
		metricsIv: time.Second,

		cachedTokens:      true,
		smallReplicasFlag: 1,
	}, nil
}

func (c *common) register(fs *flag.FlagSet) {
	fs.Var(&c.levels, "sessions", "comma-separated concurrency levels")
	fs.DurationVar(&c.warmup, "warmup", c.warmup, "load before each measured level, so that sessions are staggered")
	fs.DurationVar(&c.duration, "duration", c.duration, "length of each measured level")
	fs.Int64Var(&c.seed, "seed", c.seed, "seed of the workload")
	fs.Var(&c.seeds, "seeds", "comma-separated seeds, reported as mean and standard deviation (overrides --seed)")
	fs.Var(&c.policies, "policies", "comma-separated routing policies")
	fs.IntVar(&c.replicas, "replicas", c.replicas, "number of replicas (engines)")
	fs.StringVar(&c.jsonPath, "json", "", "write the rows to this JSON file")
	fs.StringVar(&c.plotsDir, "plots", "", "write PNG plots into this directory")
	fs.IntVar(&c.spill, "spill-threshold", 0, "warden's manual spill threshold (0: auto, moves by expected cost)")
	fs.DurationVar(&c.metricsIv, "metrics-interval", c.metricsIv, "how often warden polls the replicas' metrics")
	fs.BoolVar(&c.cachedTokens, "prompt-tokens-details", c.cachedTokens, "the replicas report each prompt's cached part, as vLLM does with --enable-prompt-tokens-details (false: its default, so load control reads the shared prefix from the requests)")
	c.workload.RegisterFlags(fs)
	fs.IntVar(&c.smallReplicasFlag, "small-replicas", c.smallReplicasFlag, "with --small-model, replicas of the same profile serving it beside the --replicas of --model")
	profile := flag.NewFlagSet("", flag.ContinueOnError)
	c.profile.RegisterFlags(profile)
	profile.VisitAll(func(f *flag.Flag) {
		if f.Name == kvOffloadingSize {
			fs.Var(hostTierSize{&c.profile.KVOffloadingSize, &c.hostTierTimes}, f.Name, hostTierUsage)
			return
		}
		fs.Var(f.Value, f.Name, f.Usage)
	})
}

// smallReplicas is how many replicas serve the small model: none without one.
func (c *common) smallReplicas() int {
	if c.workload.SmallModel == "" {
		return 0
	}
	return c.smallReplicasFlag
}

// peopleFlags are --people and --flows, which the lab and the run share.
type peopleFlags struct {
	spec  string
	flows bool
}

func (p *peopleFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&p.spec, "people", "", `people sharing the fleet, in place of --sessions, each with its turns in its own flow and its own rows: "two" (one person's 20 agents without pauses beside another's 2 conversations at a terminal, 30 s between turns) or name:sessions:think-time[:weight],...`)
	fs.BoolVar(&p.flows, "flows", true, "with --people, tell the people apart (false: every turn in one flow, as a proxy that tells no one apart)")
}

// people returns the people --people names (nil without it), and makes
// their sessions in all c's one level.
func (p *peopleFlags) people(c *common) ([]lab.Person, error) {
	if p.spec == "" {
		return nil, nil
	}
	people, err := lab.ParsePeople(p.spec)
	if err != nil {
		return nil, fmt.Errorf("--people: %w", err)
	}
	c.levels = intList{lab.Sessions(people)}
	return people, nil
}

// engineProfile is every replica's profile, its host tier sized.
func (c *common) engineProfile() engine.Profile {
	return lab.WithHostTierTimesGPU(c.profile, c.hostTierTimes)
}

// kvOffloadingSize is vLLM's flag for the host-memory KV tier, which
// wardenbench also takes as a multiple of the GPU KV cache (hostTierUsage).
const (
	kvOffloadingSize = "kv-offloading-size"
	hostTierUsage    = `host-memory KV tier per replica: GiB, as vLLM's flag (0: none), or "<N>x", N times each replica's GPU KV cache`
)

// hostTierSize is --kv-offloading-size: GiB per replica as vLLM takes it, or
// "<N>x", a multiple of each replica's GPU KV cache, so that the tier keeps
// its ratio to a cache that other flags or a shape change. Setting one
// clears the other.
type hostTierSize struct {
	gib, times *float64
}

func (t hostTierSize) String() string {
	if t.times != nil && *t.times > 0 {
		return strconv.FormatFloat(*t.times, 'g', -1, 64) + "x"
	}
	if t.gib != nil {
		return strconv.FormatFloat(*t.gib, 'g', -1, 64)
	}
	return "0"
}

func (t hostTierSize) Set(s string) error {
	number, multiple := strings.CutSuffix(strings.TrimSpace(s), "x")
	v, err := strconv.ParseFloat(number, 64)
	switch {
	case err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v):
		return fmt.Errorf("%q is not a size in GiB (0: no tier) nor a multiple of the GPU KV cache such as 4x", s)
	case multiple && v == 0:
		return fmt.Errorf("%q: a tier of 0x the GPU KV cache is none; write 0", s)
	case multiple:
		*t.gib, *t.times = 0, v
	default:
		*t.gib, *t.times = v, 0
	}
	return nil
}

// registerExcept registers the common flags but the named ones, which a
// subcommand defines its own way.
func (c *common) registerExcept(fs *flag.FlagSet, names ...string) {
	all := flag.NewFlagSet("", flag.ContinueOnError)
	c.register(all)
	all.VisitAll(func(f *flag.Flag) {
		if !slices.Contains(names, f.Name) {
			fs.Var(f.Value, f.Name, f.Usage)
		}
	})
}

// parseAll parses args, which must all be flags.
func parseAll(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return nil
}

// seedList is --seeds if given, else --seed.
func (c *common) seedList() []int64 {
	if len(c.seeds) > 0 {
		return c.seeds
	}
	return []int64{c.seed}
}

// profileName finds --profile in args before parsing, since the profile
// gives the other profile flags their defaults.
func profileName(args []string) string {
	for i, a := range args {
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "profile" {
			continue
		}
		if hasValue {
			return value
		}
		if i+1 < len(args) {
			return args[i+1]
		}
	}
	return engine.DefaultProfile
}

// intList is a comma-separated list of positive integers.
type intList []int

func (l *intList) String() string { return joinList(*l) }

func (l *intList) Set(s string) error {
	var out intList
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	*l = out
	return nil
}

// int64List is a comma-separated list of integers.
type int64List []int64

func (l *int64List) String() string { return joinList(*l) }

func (l *int64List) Set(s string) error {
	var out int64List
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return fmt.Errorf("%q is not an integer", f)
		}
		out = append(out, n)
	}
	*l = out
	return nil
}

// durationList is a comma-separated list of positive durations.
type durationList []time.Duration

func (l *durationList) String() string {
	parts := make([]string, len(*l))
	for i, d := range *l {
		parts[i] = d.String()
	}
	return strings.Join(parts, ",")
}

func (l *durationList) Set(s string) error {
	var out durationList
	for _, f := range strings.Split(s, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d <= 0 {
			return fmt.Errorf("%q is not a positive duration", f)
		}
		out = append(out, d)
	}
	*l = out
	return nil
}

// stringList is a comma-separated list of names.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(s string) error {
	var out stringList
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return fmt.Errorf("empty list")
	}
	*l = out
	return nil
}

func joinList[T int | int64](l []T) string {
	parts := make([]string, len(l))
	for i, v := range l {
		parts[i] = strconv.FormatInt(int64(v), 10)
	}
	return strings.Join(parts, ",")
}
