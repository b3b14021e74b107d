package lab

import (
	"fmt"
	"slices"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/report"
)

// DefaultWorkload labels the grid's rows of the base workload (the seed's
// unless the caller changed it).
const DefaultWorkload = "default"

// WorkloadVariant is the base workload changed in one respect. The grid
// runs variants at VariantCell only: the grid varies the load, a variant
// the shape of a conversation.
type WorkloadVariant struct {
	Name  string
	apply func(*agentload.Config)
}

// WorkloadVariants are the variants the grid knows: longer conversations,
// first messages smaller and larger than the seed's 7.3k tokens, and the
// same 10.8k tokens a conversation starts with split otherwise between the
// prefix all conversations share and their own: an agent whose tools and
// instructions outweigh its task (15k shared, 2k own), and one that shares
// next to nothing.
var WorkloadVariants = []WorkloadVariant{
	{"turns-20", func(w *agentload.Config) { w.Turns = 20 }},
	{"first-2k", func(w *agentload.Config) { w.FirstMessageTokens = 2000 }},
	{"first-20k", func(w *agentload.Config) { w.FirstMessageTokens = 20000 }},
	{"shared-15k", func(w *agentload.Config) { w.SystemPromptTokens, w.FirstMessageTokens = 15000, 2000 }},
	{"shared-none", func(w *agentload.Config) { w.SystemPromptTokens, w.FirstMessageTokens = 16, 10800 }},
}

// VariantNames lists WorkloadVariants' names.
func VariantNames() []string {
	names := make([]string, len(WorkloadVariants))
	for i, v := range WorkloadVariants {
		names[i] = v.Name
	}
	return names
}

// LookupVariants returns the WorkloadVariants of these names.
func LookupVariants(names []string) ([]WorkloadVariant, error) {
	out := make([]WorkloadVariant, len(names))
	for i, name := range names {
		j := slices.IndexFunc(WorkloadVariants, func(v WorkloadVariant) bool { return v.Name == name })
		if j < 0 {
			return nil, fmt.Errorf("lab: unknown workload variant %q (known: %v)", name, VariantNames())
		}
		out[i] = WorkloadVariants[j]
	}
	return out, nil
}

// Cell is one point of the grid besides its workload.
type Cell struct {
	ThinkTime time.Duration
	Sessions  int
	Replicas  int
}

// VariantCell is where the variants run: the seed's think time, on its 4
// replicas, at 16 sessions, the busiest level the seed's workload still
// fits in their KV caches.
var VariantCell = Cell{ThinkTime: 3 * time.Second, Sessions: 16, Replicas: 4}

// Grid is a workload grid: every policy, for every seed, at every think
// time, level and replica count with the base workload, plus each variant
// at VariantCell.
type Grid struct {
	ThinkTimes []time.Duration
	Sessions   []int
	Replicas   []int
	// Variants run at VariantCell; with any, so does the base workload if
	// the grid lacks that cell, to compare them with.
	Variants []WorkloadVariant
	Policies []string
	Seeds    []int64
	// Stretch scales each cell's warm-up and measured window with its
	// sessions' length (see window); without it every cell gets the base's.
	Stretch bool
}

// seedTurnTime is about how long a turn of the seed's workload takes at
// light load (agentload.DefaultConfig explains it).
const seedTurnTime = 7 * time.Second

// window is the warm-up and measured window of a cell's workload w: with
// Stretch, base's scaled by how much longer a session of w lives than one
// of base (turns x (think time + a turn)), so that every cell warms up and
// measures about as many sessions. Unscaled, a 1-minute think time would
// spend the seed's 1-minute warm-up before most sessions' first turn and
// measure three turns a session.
func (g Grid) window(base Config, w agentload.Config) (warmup, duration time.Duration) {
	if !g.Stretch {
		return base.Warmup, base.Duration
	}
	lifetime := func(w agentload.Config) float64 { return float64(w.Turns) * float64(w.ThinkTime+seedTurnTime) }
	scale := lifetime(w) / lifetime(base.Workload)
	stretch := func(d time.Duration) time.Duration { return time.Duration(float64(d) * scale).Round(time.Second) }
	return stretch(base.Warmup), stretch(base.Duration)
}

// DefaultGrid is issue 13's grid: think times from the seed's 3 s to a
// minute, 8 to 64 sessions on 4 and 8 replicas, every variant, every
// default policy, seeds 1 to 3.
func DefaultGrid() Grid {
	return Grid{
		ThinkTimes: []time.Duration{3 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute},
		Sessions:   []int{8, 16, 32, 64},
		Replicas:   []int{4, 8},
		Variants:   WorkloadVariants,
		Policies:   DefaultPolicies,
		Seeds:      []int64{1, 2, 3},
		Stretch:    true,
	}
}

// gridSweep is what one Sweep of the grid runs: one workload, think time
// and replica count at several levels.
type gridSweep struct {
	variant  WorkloadVariant
	think    time.Duration
	replicas int
	sessions []int
}

func (g Grid) sweeps() []gridSweep {
	var out []gridSweep
	base := WorkloadVariant{Name: DefaultWorkload, apply: func(*agentload.Config) {}}
	for _, think := range g.ThinkTimes {
		for _, replicas := range g.Replicas {
			out = append(out, gridSweep{base, think, replicas, g.Sessions})
		}
	}
	at := func(v WorkloadVariant) gridSweep {
		return gridSweep{v, VariantCell.ThinkTime, VariantCell.Replicas, []int{VariantCell.Sessions}}
	}
	inGrid := slices.Contains(g.ThinkTimes, VariantCell.ThinkTime) &&
		slices.Contains(g.Replicas, VariantCell.Replicas) && slices.Contains(g.Sessions, VariantCell.Sessions)
	if len(g.Variants) > 0 && !inGrid {
		out = append(out, at(base))
	}
	for _, v := range g.Variants {
		out = append(out, at(v))
	}
	return out
}

// Runs is the number of (policy, level, seed) runs the grid holds.
func (g Grid) Runs() int {
	n := 0
	for _, s := range g.sweeps() {
		n += len(s.sessions)
	}
	return n * len(g.Policies) * len(g.Seeds)
}

// RunGrid runs the grid, one Sweep of base at a time on up to workers
// goroutines, and returns every run's row labelled with its think time and
// workload (report.CompareGrid's cells). base gives everything the grid
// does not vary; progress is Sweep's.
func RunGrid(base Config, g Grid, workers int, progress func()) ([]report.Row, error) {
	sweeps := g.sweeps()
	if len(sweeps) == 0 {
		return nil, fmt.Errorf("lab: the grid needs at least one think time and replica count, or a variant")
	}
	var rows []report.Row
	for _, s := range sweeps {
		cfg := base
		cfg.Replicas = s.replicas
		cfg.Workload.ThinkTime = s.think
		s.variant.apply(&cfg.Workload)
		cfg.Warmup, cfg.Duration = g.window(base, cfg.Workload)
		swept, err := Sweep(cfg, Plan{Policies: g.Policies, Levels: s.sessions, Seeds: g.Seeds}, workers, progress)
		if err != nil {
			return nil, fmt.Errorf("%s, think %v, %d replicas: %w", s.variant.Name, s.think, s.replicas, err)
		}
		for i := range swept {
			swept[i].ThinkTimeS = s.think.Seconds()
			swept[i].Workload = s.variant.Name
		}
		rows = append(rows, swept...)
	}
	return rows, nil
}
