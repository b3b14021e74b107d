package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/lmwarden/caddy-warden/bench/e2e"
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
}

// runEndToEnd is `wardenbench run`.
func runEndToEnd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := newCommon(args)
	if err != nil {
		return err
	}
	opts := runOptions{common: c}
	fs := flag.NewFlagSet("wardenbench run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.register(fs)
	fs.StringVar(&opts.Topology, "topology", e2e.TopologyServers, "servers (one vllmsim per replica) or ranks (one vllmsim with --data-parallel-size)")
	fs.BoolVar(&opts.Fresh, "fresh", false, "restart the replicas between series instead of keeping them warm")
	fs.Float64Var(&opts.TimeScale, "time-scale", 10, "run simulated time this many times faster than the wall clock")
	fs.StringVar(&opts.OutDir, "out", "wardenbench-run", "directory for the binaries and the admin API's JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	policiesSet := false
	fs.Visit(func(f *flag.Flag) { policiesSet = policiesSet || f.Name == "policies" })
	if !policiesSet {
		c.policies = stringList(e2e.DefaultPolicies(opts.Topology))
	}
	return endToEndAndPresent(ctx, opts, stdout, stderr)
}

// endToEndAndPresent runs the end-to-end benchmark for every seed with a
// progress bar, and shows its rows.
func endToEndAndPresent(ctx context.Context, opts runOptions, stdout, stderr io.Writer) error {
	bar := newProgress(stderr, len(opts.policies)*len(opts.levels)*len(opts.seedList()), "run")
	var rows []report.Row
	for _, seed := range opts.seedList() {
		workload := opts.workload
		workload.Seed = seed
		seedRows, err := e2e.Run(ctx, e2e.Options{
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
			SimArgs:    opts.profile.Args(),
			WorkDir:    opts.OutDir,
			Progress: func(_ string, _ int, done bool) {
				if done {
					bar.Add(1)
				}
			},
		})
		rows = append(rows, seedRows...)
		if err != nil {
			bar.Finish()
			return err
		}
	}
	bar.Finish()
	return present(opts.common, rows, stdout)
}
