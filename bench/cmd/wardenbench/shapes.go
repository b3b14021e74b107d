package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lmwarden/caddy-warden/bench/lab"
	"github.com/lmwarden/caddy-warden/bench/report"
)

// shapesSubjects are the policies `wardenbench shapes` judges by default:
// the default rule and the load-control presets.
var shapesSubjects = []string{lab.PolicyWarden, lab.PolicyAdmission, lab.PolicyAdmissionFarm}

// runShapes is `wardenbench shapes`: the lab on workload shapes drawn at
// random from wide ranges, each subject against the baselines on each.
func runShapes(_ context.Context, args []string, stdout, stderr io.Writer) error {
	base := lab.DefaultConfig()
	fs := flag.NewFlagSet("wardenbench shapes", flag.ContinueOnError)
	fs.SetOutput(stderr)
	count := fs.Int("count", 50, "number of shapes drawn")
	seed := fs.Int64("seed", 1, "seed of the draw: shape i of a seed is the same whatever --count")
	seeds := int64List{1, 2, 3}
	fs.Var(&seeds, "seeds", "comma-separated seeds each shape runs with")
	subjects := stringList(shapesSubjects)
	fs.Var(&subjects, "subjects", "comma-separated policies judged against the others")
	baselines := stringList{lab.PolicyOff, lab.PolicyVLLM, lab.PolicyHeader, lab.PolicyLeastConn, lab.PolicyRoundRobin}
	fs.Var(&baselines, "baselines", "comma-separated policies the subjects are judged against")
	var only intList0
	fs.Var(&only, "only", "comma-separated shape indexes to run (default: all of --count)")
	jsonPath := fs.String("json", "", "write the shapes and rows to this JSON file")
	workers := fs.Int("jobs", runtime.NumCPU(), "runs simulated in parallel (results do not depend on it)")
	fs.IntVar(&base.SpillThreshold, "spill-threshold", 0, "warden spill threshold (0: auto)")
	fs.DurationVar(&base.MetricsInterval, "metrics-interval", base.MetricsInterval, "how often warden polls the replicas' metrics")
	tier := hostTierSize{&base.Profile.KVOffloadingSize, &base.HostTierTimesGPU}
	fs.Var(tier, kvOffloadingSize, hostTierUsage)
	fs.BoolVar(&base.MidConversation, "mid-conversation", false, midConversationUsage)
	details := fs.Bool("prompt-tokens-details", true, "the replicas report each prompt's cached part (vLLM's --enable-prompt-tokens-details)")
	if err := parseAll(fs, args); err != nil {
		return err
	}
	if *count < 1 {
		return fmt.Errorf("--count must be at least 1, got %d", *count)
	}
	base.HideCachedTokens = !*details
	shapes := lab.DrawShapes(*seed, *count, base.Profile.BlockSize)
	if len(only) > 0 {
		var picked []lab.Shape
		for _, i := range only {
			if i >= *count {
				picked = append(picked, lab.DrawShapes(*seed, i+1, base.Profile.BlockSize)[i])
				continue
			}
			picked = append(picked, shapes[i])
		}
		shapes = picked
	}
	policies := slices.Concat(subjects, baselines)
	runs := len(shapes) * len(policies) * len(seeds)
	bar := newProgress(stderr, runs, "shapes")
	started := time.Now()
	rows, err := lab.RunShapes(base, shapes, policies, seeds, *workers, func() { bar.Add(1) })
	bar.Finish()
	if err != nil {
		return err
	}
	elapsed := time.Since(started)
	cells, err := report.CompareShapes(rows, subjects)
	if err != nil {
		return err
	}
	byName := map[string]lab.Shape{}
	for _, s := range shapes {
		byName[s.Name()] = s
	}
	runNote, extraArgs := "", ""
	if base.EngineProfile().HostTier() {
		extraArgs = " --" + kvOffloadingSize + "=" + tier.String()
		runNote = ", replicas with a host KV tier (" + extraArgs[1:] + ")"
	}
	if base.MidConversation {
		extraArgs += " --mid-conversation"
		runNote += ", sessions started mid-conversation"
	}
	fmt.Fprintf(stdout, "shapes: %d drawn with seed %d, each run with seeds %v%s; %d runs in %.0fs\n", len(shapes), *seed, []int64(seeds), runNote, runs, elapsed.Seconds())
	fmt.Fprintf(stdout, "A column is lost when worse than any of %v by more than %.0f%% and the combined spread, won when better than the best of them by as much.\n\n",
		[]string(baselines), 100*report.ShapeTolerance)
	describe := func(name string) string {
		s := byName[name]
		return fmt.Sprintf("%s\n    wardenbench shapes --seed %d --only %d --seeds %s%s   (or: wardenbench lab %s%s --seeds %s)",
			describeShape(s), *seed, s.Index, seeds.String(), extraArgs, strings.Join(s.LabArgs(), " "), extraArgs, seeds.String())
	}
	if err := report.PrintShapeSummary(stdout, cells, describe); err != nil {
		return err
	}
	if err := printFitSplit(stdout, cells, byName); err != nil {
		return err
	}
	if err := report.PrintShapeAxes(stdout, cells, shapeAxes(byName)); err != nil {
		return err
	}
	if *jsonPath != "" {
		if err := writeShapesJSON(*jsonPath, shapes, rows); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "\nJSON: %s\n", *jsonPath)
	}
	return nil
}

// printFitSplit counts, per subject, the shapes lost where the working set
// fits the fleet's KV caches and where it does not: load control must lose
// no column where it fits, and only the TTFB columns where it does not.
func printFitSplit(w io.Writer, cells []report.ShapeCell, shapes map[string]lab.Shape) error {
	all := []bool{true, true, true, true}
	work := []bool{true, false, false, true}
	fmt.Fprintln(w, "\nShapes lost, by whether the working set fits the caches:")
	subjects := []string{}
	for _, c := range cells {
		if !slices.Contains(subjects, c.Subject) {
			subjects = append(subjects, c.Subject)
		}
	}
	for _, s := range subjects {
		var fitN, fitLost, overN, overLostAny, overLostWork int
		for _, c := range cells {
			if c.Subject != s {
				continue
			}
			if shapes[c.Shape].Fits() {
				fitN++
				if c.Lost(all) {
					fitLost++
				}
				continue
			}
			overN++
			if c.Lost(all) {
				overLostAny++
			}
			if c.Lost(work) {
				overLostWork++
			}
		}
		fmt.Fprintf(w, "  %-24s fits: %d of %d lost any column; overflows: %d of %d lost any column, %d lost tok/min or conv mean\n",
			s, fitLost, fitN, overLostAny, overN, overLostWork)
	}
	return nil
}

// describeShape is a shape in one line.
func describeShape(s lab.Shape) string {
	return fmt.Sprintf("%d sessions on %d replicas (max_num_seqs %d, %d KV tokens each, fit %.2f); system %d, first %d, %d turns (±%.0f%%) of %d, replies ≤ %d (spread %.2f), think %v",
		s.Sessions, s.Replicas, s.MaxNumSeqs, s.NumGPUBlocks*lab.DefaultConfig().Profile.BlockSize, s.Fit,
		s.SystemTokens, s.FirstTokens, s.Turns, 100*s.TurnsSpread, s.TurnTokens, s.MaxOutputTokens, s.OutputSpread, s.ThinkTime)
}

// shapeAxes are the dimensions the shapes are tabulated along.
func shapeAxes(shapes map[string]lab.Shape) []report.ShapeAxis {
	axis := func(name string, edges []float64, unit string, of func(lab.Shape) float64) report.ShapeAxis {
		bins := make([]string, len(edges)+1)
		for i := range bins {
			switch {
			case i == 0:
				bins[i] = fmt.Sprintf("< %g%s", edges[0], unit)
			case i == len(edges):
				bins[i] = fmt.Sprintf("≥ %g%s", edges[i-1], unit)
			default:
				bins[i] = fmt.Sprintf("%g-%g%s", edges[i-1], edges[i], unit)
			}
		}
		return report.ShapeAxis{Name: name, Bins: bins, Bin: func(shape string) string {
			v := of(shapes[shape])
			i := 0
			for i < len(edges) && v >= edges[i] {
				i++
			}
			return bins[i]
		}}
	}
	return []report.ShapeAxis{
		axis("Fit (fleet KV ÷ working set)", []float64{0.5, 1, 2}, "", func(s lab.Shape) float64 { return s.Fit }),
		axis("Conversations per replica", []float64{1, 2, 4, 8}, "", func(s lab.Shape) float64 { return float64(s.Sessions) / float64(s.Replicas) }),
		axis("Replicas", []float64{3, 5, 7}, "", func(s lab.Shape) float64 { return float64(s.Replicas) }),
		axis("System prompt (tokens)", []float64{2000, 8000}, "", func(s lab.Shape) float64 { return float64(s.SystemTokens) }),
		axis("First message (tokens)", []float64{1000, 5000}, "", func(s lab.Shape) float64 { return float64(s.FirstTokens) }),
		axis("Turns", []float64{5, 12}, "", func(s lab.Shape) float64 { return float64(s.Turns) }),
		axis("Turn (tokens)", []float64{300, 1500}, "", func(s lab.Shape) float64 { return float64(s.TurnTokens) }),
		axis("Reply (max tokens)", []float64{128, 512}, "", func(s lab.Shape) float64 { return float64(s.MaxOutputTokens) }),
		axis("Think time", []float64{0.1, 5, 20}, " s", func(s lab.Shape) float64 { return s.ThinkTime.Seconds() }),
		axis("max_num_seqs", []float64{32, 128}, "", func(s lab.Shape) float64 { return float64(s.MaxNumSeqs) }),
	}
}

// writeShapesJSON writes the runs in DESIGN §4's form, each labelled with
// its shape's name (workload), and the shapes.
func writeShapesJSON(path string, shapes []lab.Shape, rows []report.Row) error {
	described, err := json.Marshal(shapes)
	if err != nil {
		return err
	}
	return report.WriteFile(path, report.File{Runs: rows, Shapes: described})
}

// intList0 is a comma-separated list of non-negative integers.
type intList0 []int

func (l *intList0) String() string { return joinList(*l) }

func (l *intList0) Set(s string) error {
	var out intList0
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return fmt.Errorf("%q is not a non-negative integer", f)
		}
		out = append(out, n)
	}
	*l = out
	return nil
}
