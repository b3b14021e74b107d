package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmwarden/caddy-warden/bench/lab"
	"github.com/lmwarden/caddy-warden/bench/report"
)

// shapes runs each drawn shape under every policy, reports how each
// subject fares along each axis, and the lab command it prints for a shape
// gives that shape's rows again.
func TestShapesRunsEachShapeAndItsCommandReproducesIt(t *testing.T) {
	dir := t.TempDir()
	out, rows := runForRows(t, filepath.Join(dir, "shapes.json"), "shapes",
		"--count", "2", "--seeds", "1", "--subjects", "warden", "--baselines", "header,least_conn")
	if len(rows) != 2*3 {
		t.Fatalf("%d rows, want 2 shapes × 3 policies", len(rows))
	}
	for _, want := range []string{"shapes: 2 drawn with seed 1", "Fit (fleet KV ÷ working set)", "Think time", "warden"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	s := lab.DrawShapes(1, 2, lab.DefaultConfig().Profile.BlockSize)[1]
	args := append([]string{"lab"}, s.LabArgs()...)
	_, again := runForRows(t, filepath.Join(dir, "lab.json"), append(args, "--seeds", "1", "--policies", "header")...)
	var shaped []float64
	for _, r := range rows {
		if r.Workload == s.Name() && r.Policy == "header" {
			shaped = []float64{r.OutputTokensPerMin, r.TTFBP50S, r.TTFBP95S, r.ConversationMeanS}
		}
	}
	if len(again) != 1 || shaped == nil {
		t.Fatalf("lab rows %v, shape rows %v", again, shaped)
	}
	r := again[0]
	if got := []float64{r.OutputTokensPerMin, r.TTFBP50S, r.TTFBP95S, r.ConversationMeanS}; !equalFloats(got, shaped) {
		t.Fatalf("wardenbench lab %s: %v, the shape's run %v", strings.Join(s.LabArgs(), " "), got, shaped)
	}
}

func equalFloats(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// With --mid-conversation the shapes and the lab command start sessions
// mid-conversation alike, which changes the runs.
func TestShapesMidConversationReproducesInTheLab(t *testing.T) {
	dir := t.TempDir()
	args := []string{"shapes", "--count", "1", "--seeds", "1", "--subjects", "warden", "--baselines", "header"}
	out, mid := runForRows(t, filepath.Join(dir, "mid.json"), append(args, "--mid-conversation")...)
	if !strings.Contains(out, "sessions started mid-conversation") {
		t.Errorf("output does not say how sessions started:\n%s", out)
	}
	_, inStep := runForRows(t, filepath.Join(dir, "step.json"), args...)
	s := lab.DrawShapes(1, 1, lab.DefaultConfig().Profile.BlockSize)[0]
	labArgs := append(append([]string{"lab"}, s.LabArgs()...), "--mid-conversation", "--seeds", "1", "--policies", "warden")
	_, again := runForRows(t, filepath.Join(dir, "lab.json"), labArgs...)
	columns := func(r report.Row) []float64 {
		return []float64{r.OutputTokensPerMin, r.TTFBP50S, r.TTFBP95S, r.ConversationMeanS}
	}
	var midRow, stepRow []float64
	for i := range mid {
		if mid[i].Policy == "warden" {
			midRow, stepRow = columns(mid[i]), columns(inStep[i])
		}
	}
	if len(again) != 1 || !equalFloats(columns(again[0]), midRow) {
		t.Fatalf("wardenbench %s: %v, the shape's run %v", strings.Join(labArgs, " "), again, midRow)
	}
	if equalFloats(midRow, stepRow) {
		t.Fatalf("mid-conversation and in-step runs agree to the digit: %v", midRow)
	}
}
