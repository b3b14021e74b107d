package report

import (
	"bytes"
	"strings"
	"testing"
)

// shapeRows are three seeds of policy on shape, each column at its value
// plus the seed's offset times spread.
func shapeRows(shape, policy string, tok, p50, p95, conv, spread float64, timed int) []Row {
	var rows []Row
	for i, off := range []float64{-1, 0, 1} {
		rows = append(rows, Row{Mode: ModeLab, Workload: shape, Policy: policy, Seed: int64(i + 1), Sessions: 8,
			OutputTokensPerMin: tok + off*spread, TTFBP50S: p50, TTFBP95S: p95, ConversationMeanS: conv, ConversationsTimed: timed})
	}
	return rows
}

// A column is lost only when the subject is worse than the best baseline
// of that column by more than 3% and more than the combined spread; the
// time per conversation is judged only where enough conversations were
// timed.
func TestCompareShapes(t *testing.T) {
	var rows []Row
	// s1: throughput 2% below the best (a tie), p50 5% worse (a loss),
	// p95 10% better (a win), conversations 10% longer but too few timed.
	rows = append(rows, shapeRows("s1", "ours", 9800, 1.05, 0.9, 110, 0, 3)...)
	rows = append(rows, shapeRows("s1", "a", 10000, 1.2, 1.0, 100, 0, 3)...)
	rows = append(rows, shapeRows("s1", "b", 9000, 1.0, 2.0, 100, 0, 3)...)
	// s2: throughput 5% below, but within the seeds' spread (a tie).
	rows = append(rows, shapeRows("s2", "ours", 9500, 1, 1, 100, 400, 20)...)
	rows = append(rows, shapeRows("s2", "a", 10000, 1, 1, 100, 400, 20)...)
	rows = append(rows, shapeRows("s2", "b", 1000, 1, 1, 100, 0, 20)...)
	cells, err := CompareShapes(rows, []string{"ours"})
	if err != nil {
		t.Fatal(err)
	}
	if len(cells) != 2 {
		t.Fatalf("%d cells", len(cells))
	}
	verdicts := func(c ShapeCell) []Verdict {
		var out []Verdict
		for _, v := range c.Columns {
			out = append(out, v.Verdict)
		}
		return out
	}
	if got, want := verdicts(cells[0]), []Verdict{Tie, Loss, Win, Tie}; !equalVerdicts(got, want) {
		t.Errorf("s1: %v, want %v", got, want)
	}
	if cells[0].Columns[1].BestPolicy != "b" || cells[0].Columns[0].BestPolicy != "a" {
		t.Errorf("s1 best baselines: %s, %s", cells[0].Columns[0].BestPolicy, cells[0].Columns[1].BestPolicy)
	}
	if got, want := verdicts(cells[1]), []Verdict{Tie, Tie, Tie, Tie}; !equalVerdicts(got, want) {
		t.Errorf("s2: %v, want %v", got, want)
	}
	if !cells[0].Lost([]bool{false, true, false, false}) || cells[0].Lost([]bool{true, false, true, true}) {
		t.Error("Lost does not read the columns asked for")
	}
	var out bytes.Buffer
	if err := PrintShapeSummary(&out, cells, func(shape string) string { return "rerun " + shape }); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ours loses 1 shapes", "s1: TTFB p50 (s) 1.05±0.00 against b 1.00±0.00 (1.05)", "rerun s1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
	if _, err := CompareShapes(shapeRows("s3", "ours", 1, 1, 1, 1, 0, 9), []string{"ours"}); err == nil {
		t.Error("a shape without baselines compared")
	}
}

func equalVerdicts(a, b []Verdict) bool {
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
