package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/lmwarden/caddy-warden/bench/e2e"
	"github.com/lmwarden/caddy-warden/bench/lab"
	"github.com/lmwarden/caddy-warden/bench/report"
)

// runOptions is what the end-to-end runner needs: the common flags plus the
// layout of the simulated replicas.
type runOptions struct {
	*common
	// Topology is "servers" (one vllmsim per replica) or "ranks" (one
	// vllmsim with --data-parallel-size Replicas).
	Topology string
	// Fresh restarts the replicas between series instead of switching
	// affinity through the admin API on warm replicas, as the seed did.
	Fresh bool
	// TimeScale runs simulated time this many times faster than the wall clock.
	TimeScale float64
	// OutDir receives the binaries and the admin API's JSON after each level.
	OutDir string
	// Instances and PinStore lay out the Caddy side (see e2e.Options);
	// with Compare and more than one instance, one instance and (with a
	// store) the same instances without it are measured first.
	Instances int
	PinStore  string
	Compare   bool
	// CompactionInterval is warden's compaction_interval, simulated time
	// (0: the product's default).
	CompactionInterval time.Duration
	// People share the fleet in place of the levels (see e2e.Options).
	People  []lab.Person
	OneFlow bool
}

// setup is one layout of the Caddy side.
type setup struct {
	instances int
	pinStore  string
}

// setups lists the layouts to measure, the asked one last.
func (o runOptions) setups() []setup {
	asked := setup{max(o.Instances, 1), o.PinStore}
	if asked.pinStore == "" {
		asked.pinStore = e2e.PinStoreNone
	}
	if !o.Compare || asked.instances == 1 {
		return []setup{asked}
	}
	out := []setup{{1, e2e.PinStoreNone}}
	if asked.pinStore != e2e.PinStoreNone {
		out = append(out, setup{asked.instances, e2e.PinStoreNone})
	}
	return append(out, asked)
}

// runEndToEnd is `wardenbench run`.
func runEndToEnd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opts, err := parseRunOptions(args, stderr)
	if err != nil {
		return err
	}
	return endToEndAndPresent(ctx, opts, stdout, stderr)
}

// parseRunOptions reads `wardenbench run`'s flags.
func parseRunOptions(args []string, stderr io.Writer) (runOptions, error) {
	c, err := newCommon(args)
	if err != nil {
		return runOptions{}, err
	}
	opts := runOptions{common: c}
	fs := flag.NewFlagSet("wardenbench run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.register(fs)
	fs.StringVar(&opts.Topology, "topology", e2e.TopologyServers, "servers (one vllmsim per replica) or ranks (one vllmsim with --data-parallel-size)")
	fs.BoolVar(&opts.Fresh, "fresh", false, "restart the replicas between series instead of keeping them warm")
	fs.Float64Var(&opts.TimeScale, "time-scale", 10, "run simulated time this many times faster than the wall clock")
	fs.StringVar(&opts.OutDir, "out", "wardenbench-run", "directory for the binaries and the admin API's JSON")
	fs.IntVar(&opts.Instances, "instances", 1, "identically configured Caddy instances; with more than one, a front Caddy sends each request to one at random")
	fs.StringVar(&opts.PinStore, "pin-store", e2e.PinStoreNone, "what the instances share: none, or redis (a private redis-server the run starts)")
	fs.DurationVar(&opts.CompactionInterval, "compaction-interval", 0, "warden's compaction_interval in simulated time (0: the product's default, 1m)")
	fs.BoolVar(&opts.Compare, "compare", true, "with --instances > 1, measure one instance and (with a pin store) the instances without it first, and compare")
	var people peopleFlags
	people.register(fs)
	if err := parseAll(fs, args); err != nil {
		return runOptions{}, err
	}
	if opts.People, err = people.people(c); err != nil {
		return runOptions{}, err
	}
	opts.OneFlow = !people.flows
	policiesSet := false
	fs.Visit(func(f *flag.Flag) { policiesSet = policiesSet || f.Name == "policies" })
	if !policiesSet {
		c.policies = stringList(e2e.DefaultPolicies(opts.Topology))
	}
	return opts, nil
}

// endToEndAndPresent runs the end-to-end benchmark for every seed with a
// progress bar, and shows its rows.
func endToEndAndPresent(ctx context.Context, opts runOptions, stdout, stderr io.Writer) error {
	setups := opts.setups()
	bar := newProgress(stderr, len(setups)*len(opts.policies)*len(opts.levels)*len(opts.seedList()), "run")
	var rows []report.Row
	for _, seed := range opts.seedList() {
		for _, setup := range setups {
			seedRows, err := endToEnd(ctx, opts, seed, setup, bar)
			rows = append(rows, seedRows...)
			if err != nil {
				bar.Finish()
				return err
			}
		}
	}
	bar.Finish()
	if err := present(opts.common, rows, stdout); err != nil {
		return err
	}
	if report.HasSetups(rows) {
		fmt.Fprintln(stdout, "\nCaddy instances behind a random front, with and without a shared pin store:")
		return report.PrintSetups(stdout, rows)
	}
	return nil
}

// endToEnd is one seed's end-to-end run with one layout of the Caddy side.
func endToEnd(ctx context.Context, opts runOptions, seed int64, setup setup, bar *progressbar.ProgressBar) ([]report.Row, error) {
	rows, err := e2e.Run(ctx, opts.e2eOptions(seed, setup, func(_ string, _ int, done bool) {
		if done {
			bar.Add(1)
		}
	}))
	for i := range rows {
		rows[i].HostTierGiB = opts.engineProfile().KVOffloadingSize
	}
	return rows, err
}

// e2eOptions lays out one seed's run with one layout of the Caddy side.
func (opts runOptions) e2eOptions(seed int64, setup setup, progress func(policy string, sessions int, done bool)) e2e.Options {
	workload := opts.workload
	workload.Seed = seed
	return e2e.Options{
		Topology:   opts.Topology,
		Replicas:   opts.replicas,
		MaxNumSeqs: opts.profile.MaxNumSeqs,
		Sessions:   opts.levels,
		Warmup:     opts.warmup,
		Duration:   opts.duration,
		BlockSize:  opts.profile.BlockSize,
		TimeScale:  opts.TimeScale,
		Policies:   opts.policies,
		Seed:       uint64(seed),
		Workload:   workload,
		Fresh:      opts.Fresh,
		Instances:  setup.instances,
		PinStore:   setup.pinStore,
		SimArgs:    append(opts.engineProfile().Args(), fmt.Sprintf("--enable-prompt-tokens-details=%t", opts.cachedTokens)),

		CompactionInterval: opts.CompactionInterval,
		People:             opts.People,
		OneFlow:            opts.OneFlow,
		SmallReplicas:      opts.smallReplicas(),
		WorkDir:            opts.OutDir,
		Progress:           progress,
	}
}
