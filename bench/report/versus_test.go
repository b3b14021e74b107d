package report

import (
	"math"
	"testing"
)

// versusRow is a lab row with the compared columns set.
func versusRow(policy string, seed int64, tokens, p50, p95, mean, hits float64) Row {
	return Row{Mode: ModeLab, Policy: policy, Sessions: 8, Seed: seed, Replicas: 4,
		OutputTokensPerMin: tokens, TTFBP50S: p50, TTFBP95S: p95, TTFBMeanS: mean, PrefixHitPercent: hits}
}

func versusRows() []Row {
	return []Row{
		versusRow("warden", 1, 100, 1, 3, 1, 80),
		versusRow("warden", 2, 110, 1, 5, 1, 80),
		versusRow("a", 1, 90, 0.5, 3.5, 1, 70),
		versusRow("a", 2, 90, 0.5, 4.5, 1, 70),
		versusRow("b", 1, 95, 2, 10, 1, 75),
		versusRow("b", 2, 97, 2, 10, 1, 75),
	}
}

func TestCompareTakesTheBestOtherPolicyPerColumn(t *testing.T) {
	got, err := Compare(versusRows(), "warden")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Sessions != 8 || got[0].Seeds != 2 || len(got[0].Columns) != len(versusColumns) {
		t.Fatalf("comparisons %+v", got)
	}
	want := []struct {
		best    string
		ratio   float64
		verdict Verdict
	}{
		{"b", 105.0 / 96, Win}, // higher is better; 9 apart, spread √(7.07² + 1.41²) = 7.2
		{"a", 2, Loss},         // lower is better, no spread
		{"a", 1, Tie},          // 4±1.41 against 4±0.71
		{"a", 1, Tie},          // equal means: the first best stays
		{"b", 80.0 / 75, Win},  // hits
	}
	for i, w := range want {
		v := got[0].Columns[i]
		if v.BestPolicy != w.best || math.Abs(v.Ratio()-w.ratio) > 1e-9 || v.Verdict != w.verdict {
			t.Errorf("%s: best %s, ratio %.4f, %s; want %s, %.4f, %s",
				versusColumns[i].header, v.BestPolicy, v.Ratio(), v.Verdict, w.best, w.ratio, w.verdict)
		}
	}
	if _, err := Compare(versusRows()[2:], "warden"); err == nil {
		t.Error("compared without warden's rows")
	}
	if _, err := Compare(versusRows()[:2], "warden"); err == nil {
		t.Error("compared without another policy")
	}
}
