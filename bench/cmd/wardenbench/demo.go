package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/lmwarden/caddy-warden/bench/lab"
)

// Demo settings: 4 simulated replicas behind Caddy at 4 and 16 sessions,
// affinity off then on, simulated time running demoTimeScale times faster
// than the wall clock so the whole run takes about
// 2 levels x 2 policies x (1 min warm-up + demoDuration) / demoTimeScale =
// 3 minutes after the build.
const (
	demoDuration  = 2 * time.Minute
	demoTimeScale = 4
)

// runDemo is `wardenbench demo` (and `make demo`).
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := newCommon(args)
	if err != nil {
		return err
	}
	c.levels = intList{4, 16}
	c.duration = demoDuration
	c.policies = stringList{lab.PolicyOff, lab.PolicyWarden}
	fs := flag.NewFlagSet("wardenbench demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "wardenbench-demo", "directory for the JSON, the plots and the admin API's JSON")
	if err := parseAll(fs, args); err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	c.jsonPath = filepath.Join(*out, "results.json")
	c.plotsDir = *out
	opts := runOptions{common: c, Topology: "servers", TimeScale: demoTimeScale, OutDir: *out}
	if err := endToEndAndPresent(ctx, opts, stdout, stderr); err != nil {
		return err
	}
	admin, _ := filepath.Glob(filepath.Join(*out, "admin-*.json"))
	fmt.Fprintln(stdout, "\nwarden's admin JSON after each level (GET /warden/models/{model}):")
	for _, p := range admin {
		fmt.Fprintf(stdout, "  %s\n", p)
	}
	fmt.Fprintf(stdout, "\nEverything the demo wrote is in %s\n", *out)
	return nil
}
