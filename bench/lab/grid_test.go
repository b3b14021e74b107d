package lab

import (
	"testing"
	"time"
)

func TestGridAddsTheVariantsReferenceCellOnlyWhenMissing(t *testing.T) {
	g := DefaultGrid()
	// 4 think times x 2 replica counts, then the 5 variants.
	if n := len(g.sweeps()); n != 8+5 {
		t.Errorf("default grid: %d sweeps, want 13", n)
	}
	if got, want := g.Runs(), (4*2*4+5)*len(DefaultPolicies)*3; got != want {
		t.Errorf("default grid: %d runs, want %d", got, want)
	}
	g.ThinkTimes = []time.Duration{time.Minute}
	sweeps := g.sweeps()
	if len(sweeps) != 2+1+5 {
		t.Fatalf("grid without the variants' cell: %d sweeps, want 8", len(sweeps))
	}
	if ref := sweeps[2]; ref.variant.Name != DefaultWorkload || ref.think != VariantCell.ThinkTime ||
		ref.replicas != VariantCell.Replicas || len(ref.sessions) != 1 || ref.sessions[0] != VariantCell.Sessions {
		t.Errorf("reference sweep %+v", ref)
	}
	g.Variants = nil
	if n := len(g.sweeps()); n != 2 {
		t.Errorf("grid without variants: %d sweeps, want 2", n)
	}
}

func TestGridWindowGrowsWithTheSessionsLength(t *testing.T) {
	base := DefaultConfig() // 6 turns, 3 s think: a 60 s session
	g := Grid{Stretch: true}
	w := base.Workload
	w.ThinkTime = time.Minute // 6 x 67 s
	if warmup, duration := g.window(base, w); warmup != 402*time.Second || duration != 1206*time.Second {
		t.Errorf("1-minute think time: %v then %v, want 6m42s then 20m6s", warmup, duration)
	}
	w = base.Workload
	w.Turns = 20
	if warmup, _ := g.window(base, w); warmup != 200*time.Second {
		t.Errorf("20 turns: %v warm-up, want 3m20s", warmup)
	}
	if warmup, duration := g.window(base, base.Workload); warmup != base.Warmup || duration != base.Duration {
		t.Errorf("the base workload's window changed: %v then %v", warmup, duration)
	}
	g.Stretch = false
	if warmup, duration := g.window(base, w); warmup != base.Warmup || duration != base.Duration {
		t.Errorf("unstretched: %v then %v", warmup, duration)
	}
}

func TestRunGridLabelsRowsWithTheirCell(t *testing.T) {
	variants, err := LookupVariants([]string{"first-2k"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LookupVariants([]string{"nosuch"}); err == nil {
		t.Error("looked up an unknown variant")
	}
	base := shortConfig()
	base.Warmup = 10 * time.Second
	g := Grid{ThinkTimes: []time.Duration{10 * time.Second}, Sessions: []int{2}, Replicas: []int{2},
		Variants: variants, Policies: []string{PolicyWarden}, Seeds: []int64{1}, Stretch: true}
	rows, err := RunGrid(base, g, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != g.Runs() || len(rows) != 3 {
		t.Fatalf("%d rows, want %d", len(rows), g.Runs())
	}
	want := []struct {
		workload  string
		think     float64
		replicas  int
		sessions  int
		durationS float64
	}{
		{DefaultWorkload, 10, 2, 2, 20 * 17.0 / 10}, // stretched by (10 + 7) / (3 + 7)
		{DefaultWorkload, 3, 4, 16, 20},
		{"first-2k", 3, 4, 16, 20},
	}
	for i, w := range want {
		r := rows[i]
		if r.Workload != w.workload || r.ThinkTimeS != w.think || r.Replicas != w.replicas || r.Sessions != w.sessions || r.DurationS != w.durationS {
			t.Errorf("row %d: %s, think %gs, %d replicas, %d sessions, %gs; want %+v",
				i, r.Workload, r.ThinkTimeS, r.Replicas, r.Sessions, r.DurationS, w)
		}
	}
}
