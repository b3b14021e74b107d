package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

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
	// OutDir receives extra files the run writes (e.g. the admin API's JSON).
	OutDir string
	// Progress, if not nil, is told of each finished level.
	Progress func()
}

// endToEnd runs the benchmark through Caddy and simulated replicas and
// returns one row per policy, level and seed (report.ModeRun). It is nil
// until the end-to-end runner is wired in, e.g. in a file of this package:
//
//	func init() { endToEnd = func(ctx context.Context, o runOptions) ([]report.Row, error) { return e2e.Run(ctx, e2e.Options{...}) } }
var endToEnd func(ctx context.Context, opts runOptions) ([]report.Row, error)

var errNoEndToEnd = errors.New("the end-to-end runner is not built into this binary yet; use `wardenbench lab`")

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
	fs.StringVar(&opts.Topology, "topology", "servers", "servers (one vllmsim per replica) or ranks (one vllmsim with --data-parallel-size)")
	fs.BoolVar(&opts.Fresh, "fresh", false, "restart the replicas between series instead of keeping them warm")
	fs.Float64Var(&opts.TimeScale, "time-scale", 1, "run simulated time this many times faster than the wall clock")
	fs.StringVar(&opts.OutDir, "out", ".", "directory for extra files the run writes (admin API JSON)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if opts.Topology != "servers" && opts.Topology != "ranks" {
		return fmt.Errorf("topology must be servers or ranks, got %q", opts.Topology)
	}
	return endToEndAndPresent(ctx, opts, stdout, stderr)
}

// endToEndAndPresent runs the end-to-end benchmark with a progress bar and
// shows its rows.
func endToEndAndPresent(ctx context.Context, opts runOptions, stdout, stderr io.Writer) error {
	if endToEnd == nil {
		return errNoEndToEnd
	}
	bar := newProgress(stderr, len(opts.policies)*len(opts.levels)*len(opts.seedList()), "run")
	opts.Progress = func() { bar.Add(1) }
	rows, err := endToEnd(ctx, opts)
	bar.Finish()
	if err != nil {
		return err
	}
	return present(opts.common, rows, stdout)
}
