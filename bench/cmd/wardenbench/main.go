// Command wardenbench reproduces the seed's benchmark (DESIGN §1): the seed's
// Claude-Code-like load at several concurrency levels under several routing
// policies, printed as the seed's table with its own numbers beside ours, and
// optionally written as JSON and PNG plots.
//
//	wardenbench lab   virtual time, no HTTP: simulated engines, the routing
//	                  core and the baselines, all levels in seconds
//	wardenbench run   end to end: simulated vLLM replicas behind Caddy
//	wardenbench grid  the lab over a grid of think times, levels, replica
//	                  counts and conversation shapes: warden against the
//	                  best baseline in every cell (docs/grid.md)
//	wardenbench shapes  the lab on workload shapes drawn at random from wide
//	                    ranges: where each warden mode loses to the best
//	                    baseline (docs/shapes.md)
//	wardenbench demo    a short end-to-end run at 4 and 16 sessions
//	wardenbench faults  reloads, a killed replica, broken /metrics and /health
//	                    under load: the fault table of docs/reliability.md
//
// Run `wardenbench SUBCOMMAND -h` for the flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// subcommands maps names to their entry points, which parse their own flags.
var subcommands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{
	"lab":    runLab,
	"grid":   runGrid,
	"shapes": runShapes,
	"run":    runEndToEnd,
	"demo":   runDemo,
	"faults": runFaults,
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(mainWithArgs(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func mainWithArgs(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(stderr, "usage: wardenbench lab|grid|shapes|run|demo|faults [flags]  (wardenbench SUBCOMMAND -h for the flags)")
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := subcommands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "wardenbench: unknown subcommand %q (want lab, grid, shapes, run, demo or faults)\n", args[0])
		return 2
	}
	if err := cmd(ctx, args[1:], stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "wardenbench %s: %v\n", args[0], err)
		return 1
	}
	return 0
}
