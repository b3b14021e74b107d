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
	// s3: "a" ties the throughput and wins the p50, losing nothing: it
	// beats ours outright; "b" wins the p95 but loses the throughput.
	rows = append(rows, shapeRows("s3", "ours", 10000, 1.1, 1.0, 100, 0, 20)...)
	rows = append(rows, shapeRows("s3", "a", 10100, 1.0, 1.0, 100, 0, 20)...)
	rows = append(rows, shapeRows("s3", "b", 9000, 1.1, 0.8, 100, 0, 20)...)
	// s4: "a" has the best p50 but so spread that ours ties it; "b", 5%
	// better than ours and steady, wins the column.
	rows = append(rows, shapeRows("s4", "ours", 10000, 1.05, 1.0, 100, 0, 20)...)
	rows = append(rows, shapeRows("s4", "a", 10000, 0.9, 1.0, 100, 0, 20)...)
	rows[len(rows)-3].TTFBP50S, rows[len(rows)-1].TTFBP50S = 0.5, 1.3
	rows = append(rows, shapeRows("s4", "b", 10000, 1.0, 1.0, 100, 0, 20)...)
	cells, err := CompareShapes(rows, []string{"ours"})
	if err != nil {
		t.Fatal(err)
	}
	if len(cells) != 4 {
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
	// s1 loses the p50 to b and wins the p95 against both: a trade, not a
	// defeat by either.
	if len(cells[0].DominatedBy) != 0 || len(cells[1].DominatedBy) != 0 {
		t.Errorf("beaten outright on s1 by %v, on s2 by %v", cells[0].DominatedBy, cells[1].DominatedBy)
	}
	if got := cells[2].DominatedBy; len(got) != 1 || got[0] != "a" {
		t.Errorf("s3 beaten outright by %v, want [a]", got)
	}
	if v := cells[3].Columns[1]; v.Verdict != Loss || v.BestPolicy != "b" {
		t.Errorf("s4 p50: %v against %s, want a loss to b", v.Verdict, v.BestPolicy)
	}
	if !cells[0].Lost([]bool{false, true, false, false}) || cells[0].Lost([]bool{true, false, true, true}) {
		t.Error("Lost does not read the columns asked for")
	}
	var out bytes.Buffer
	if err := PrintShapeSummary(&out, cells, func(shape string) string { return "rerun " + shape }); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ours loses 3 shapes", "s1: TTFB p50 (s) 1.05±0.00 against b 1.00±0.00 (1.05)\n", "rerun s1",
		"s3: TTFB p50 (s) 1.10±0.00 against a 1.00±0.00 (1.10); TTFB p95 (s) 1.00±0.00 against b 0.80±0.00 (1.25); beaten outright by a\n"} {
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
