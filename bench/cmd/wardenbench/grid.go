package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"slices"
	"time"

	"github.com/lmwarden/caddy-warden/bench/lab"
	"github.com/lmwarden/caddy-warden/bench/report"
)

// runGrid is `wardenbench grid`: the lab over a grid of workloads (think
// time x sessions x replicas, plus a few conversation shapes), warden
// against the best baseline in every cell, so that no tuning fits one
// workload only (issue 13).
func runGrid(_ context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := newCommon(args)
	if err != nil {
		return err
	}
	g := lab.DefaultGrid()
	c.levels, c.seeds = g.Sessions, g.Seeds
	thinks, replicas, variants := durationList(g.ThinkTimes), intList(g.Replicas), stringList(lab.VariantNames())
	fs := flag.NewFlagSet("wardenbench grid", flag.ContinueOnError)
	fs.SetOutput(stderr)
	// The grid's own lists replace the single think time and replica count;
	// --seeds alone sets the seeds.
	c.registerExcept(fs, "think-time", "replicas", "seed")
	fs.Var(&thinks, "think", "comma-separated mean think times")
	fs.Var(&replicas, "replicas", "comma-separated replica counts")
	fs.Var(&variants, "variants", fmt.Sprintf("comma-separated workload variants run at %s, or none", variantCellLabel()))
	fs.BoolVar(&g.Stretch, "stretch", g.Stretch, "scale each cell's --warmup and --duration by how much longer its sessions live than the seed's 3 s ones (turns × (think time + 7 s))")
	workers := fs.Int("jobs", runtime.NumCPU(), "runs simulated in parallel (results do not depend on it)")
	subject := fs.String("subject", lab.PolicyWarden, "the policy set against the best of the others in each cell")
	if err := parseAll(fs, args); err != nil {
		return err
	}
	if !slices.Contains(c.policies, *subject) {
		return fmt.Errorf("--subject %s is not among --policies %v", *subject, c.policies)
	}
	base, err := c.labConfig()
	if err != nil {
		return err
	}
	if base.SmallReplicas > 0 {
		return fmt.Errorf("--small-model: the grid weighs one model's rows; run wardenbench lab")
	}
	if slices.Equal(variants, stringList{"none"}) {
		variants = nil
	}
	if g.Variants, err = lab.LookupVariants(variants); err != nil {
		return err
	}
	g.ThinkTimes, g.Sessions, g.Replicas, g.Policies, g.Seeds = thinks, c.levels, replicas, c.policies, c.seeds

	bar := newProgress(stderr, g.Runs(), "grid")
	started := time.Now()
	rows, err := lab.RunGrid(base, g, *workers, func() { bar.Add(1) })
	bar.Finish()
	if err != nil {
		return err
	}
	elapsed := time.Since(started)
	cells, err := report.CompareGrid(rows, *subject)
	if err != nil {
		return err
	}
	window := ""
	if g.Stretch {
		window = ", stretched with the sessions' length"
	}
	fmt.Fprintf(stdout, "grid: %s%s, %v warm-up then %v measured per run%s, seeds %v; %d runs in %.0fs\n",
		base.Profile.Name, hostTierNote(base.EngineProfile()), base.Warmup, base.Duration, window, g.Seeds, len(rows), elapsed.Seconds())
	isBase := func(c report.GridCell) bool { return c.Workload == lab.DefaultWorkload }
	if grid := filterCells(cells, isBase); len(grid) > 0 {
		fmt.Fprintf(stdout, "\nThe %s workload at every think time, level and replica count:\n\n", lab.DefaultWorkload)
		if err := report.PrintGrid(stdout, grid, *subject); err != nil {
			return err
		}
		if c.plotsDir != "" {
			paths, err := report.WriteHeatmaps(c.plotsDir, grid, *subject)
			if err != nil {
				return err
			}
			printPaths(stdout, "Heat maps", paths)
		}
	}
	if len(g.Variants) > 0 {
		atVariantCell := func(c report.GridCell) bool {
			v := lab.VariantCell
			return c.ThinkTimeS == v.ThinkTime.Seconds() && c.Sessions == v.Sessions && c.Replicas == v.Replicas
		}
		fmt.Fprintf(stdout, "\nWorkload variants at %s:\n\n", variantCellLabel())
		if err := report.PrintGrid(stdout, filterCells(cells, atVariantCell), *subject); err != nil {
			return err
		}
	}
	return writeJSON(c, rows, stdout)
}

func variantCellLabel() string {
	v := lab.VariantCell
	return fmt.Sprintf("%v think time, %d sessions, %d replicas", v.ThinkTime, v.Sessions, v.Replicas)
}

func filterCells(cells []report.GridCell, keep func(report.GridCell) bool) []report.GridCell {
	var out []report.GridCell
	for _, c := range cells {
		if keep(c) {
			out = append(out, c)
		}
	}
	return out
}
