package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/lmwarden/caddy-warden/bench/faults"
)

// runFaults is `wardenbench faults`: simulated replicas under agent load
// behind Caddy, through reloads, a killed replica and broken /metrics and
// /health, printed as the fault table of docs/reliability.md.
func runFaults(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o faults.Options
	fs := flag.NewFlagSet("wardenbench faults", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.Replicas, "replicas", 3, "simulated vLLM servers")
	fs.IntVar(&o.Sessions, "sessions", 4, "closed-loop agent sessions")
	fs.Float64Var(&o.TimeScale, "time-scale", 10, "run simulated time this many times faster than the wall clock")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the workload and the simulators")
	fs.BoolVar(&o.Short, "short", false, "hold each fault for fewer intervals and skip half of the /metrics faults")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.Progress = func(phase string) { fmt.Fprintln(stderr, "faults:", phase) }
	table, err := faults.Run(ctx, o)
	if err != nil {
		return err
	}
	if err := table.Print(stdout); err != nil {
		return err
	}
	if v := table.Violations(); len(v) > 0 {
		return errors.New("expectations broken:\n  " + strings.Join(v, "\n  "))
	}
	return nil
}
