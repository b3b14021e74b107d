package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/lmwarden/caddy-warden/bench/e2e"
	"github.com/lmwarden/caddy-warden/bench/faults"
)

// runFaults is `wardenbench faults`: simulated replicas under agent load
// behind Caddy, through reloads, a killed replica, broken /metrics and
// /health and a graceful restart, printed as the fault table of
// docs/reliability.md; with --instances N, several Caddy instances behind a
// random front through a killed instance (and with --pin-store redis, a
// killed Redis).
func runFaults(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o faults.Options
	fs := flag.NewFlagSet("wardenbench faults", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.Replicas, "replicas", 3, "simulated vLLM servers")
	fs.IntVar(&o.Sessions, "sessions", 4, "closed-loop agent sessions")
	fs.Float64Var(&o.TimeScale, "time-scale", 10, "run simulated time this many times faster than the wall clock")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the workload and the simulators")
	fs.BoolVar(&o.Short, "short", false, "hold each fault for fewer intervals and skip half of the /metrics faults")
	fs.IntVar(&o.Instances, "instances", 1, "Caddy instances behind a random front; with more than one, the run kills one of them instead of the replica faults")
	fs.StringVar(&o.PinStore, "pin-store", e2e.PinStoreNone, "what the instances share: none, or redis (a private redis-server, killed and restarted during the run)")
	fs.DurationVar(&o.RedisOutage, "redis-outage", 10*time.Second, "how long Redis stays down, in wall time")
	if err := parseAll(fs, args); err != nil {
		return err
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
