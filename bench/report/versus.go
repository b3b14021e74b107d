package report

import (
	"errors"
	"fmt"
	"math"
)

// Verdict is how one policy's mean compares with another's, given their
// combined spread √(sd₁² + sd₂²): a difference within it is a tie.
type Verdict string

// Verdicts, from the side of the policy compared.
const (
	Win  Verdict = "win"
	Tie  Verdict = "tie"
	Loss Verdict = "loss"
)

// Stat is a column's mean over seeds and its sample standard deviation.
type Stat struct{ Mean, SD float64 }

// versusColumn is a column a policy is compared on, and which way is better.
type versusColumn struct {
	metric
	higherIsBetter bool
	// name names the column in file names.
	name string
}

// versusColumns are the columns of docs/research/policy.md's comparison.
var versusColumns = []versusColumn{
	{outputPerMin, true, "output_tokens"},
	{ttfbP50, false, "ttfb_p50"},
	{ttfbP95, false, "ttfb_p95"},
	{ttfbMean, false, "ttfb_mean"},
	{prefixHits, true, "prefix_hits"},
}

// Versus is one column of a comparison: a policy against the best of the others.
type Versus struct {
	Ours, Best Stat
	// BestPolicy is the other policy with the best mean on the column.
	BestPolicy string
	Verdict    Verdict
}

// Ratio is the policy's mean over the best other's, whichever way the
// column is better.
func (v Versus) Ratio() float64 { return v.Ours.Mean / v.Best.Mean }

// Comparison is a policy against the best of the others at one level,
// column by column in versusColumns' order.
type Comparison struct {
	Sessions int
	// Seeds is how many seeds the policy's means cover.
	Seeds   int
	Columns []Versus
}

// Compare sets the policy ours against the best of the other policies in
// rows, column by column, at each level of the rows. Every level needs rows
// of ours and of another policy.
func Compare(rows []Row, ours string) ([]Comparison, error) {
	if len(rows) == 0 {
		return nil, errors.New("report: no rows to compare")
	}
	points, _ := aggregate(rows)
	var out []Comparison
	for _, level := range levels(points) {
		c, err := compareLevel(points, level, ours)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

func compareLevel(points []point, sessions int, ours string) (Comparison, error) {
	var mine *point
	var others []point
	for i, p := range points {
		switch {
		case p.sessions != sessions:
		case p.policy == ours:
			mine = &points[i]
		default:
			others = append(others, p)
		}
	}
	if mine == nil || len(others) == 0 {
		return Comparison{}, fmt.Errorf("report: %d sessions: need %s and another policy", sessions, ours)
	}
	c := Comparison{Sessions: sessions, Seeds: len(mine.rows)}
	for _, col := range versusColumns {
		v := Versus{BestPolicy: others[0].policy}
		v.Ours.Mean, v.Ours.SD = mine.stat(col.metric)
		v.Best.Mean, v.Best.SD = others[0].stat(col.metric)
		for _, p := range others[1:] {
			if mean, sd := p.stat(col.metric); col.better(mean, v.Best.Mean) {
				v.Best, v.BestPolicy = Stat{mean, sd}, p.policy
			}
		}
		v.Verdict = col.verdict(v.Ours, v.Best)
		c.Columns = append(c.Columns, v)
	}
	return c, nil
}

// formatStat formats a metric's stat over seeds as "mean" or, over several
// seeds, "mean±sd".
func formatStat(m metric, s Stat, seeds int) string {
	if seeds < 2 {
		return m.format(s.Mean)
	}
	return m.format(s.Mean) + "±" + m.format(s.SD)
}

func (c versusColumn) better(a, b float64) bool {
	if c.higherIsBetter {
		return a > b
	}
	return a < b
}

func (c versusColumn) verdict(ours, best Stat) Verdict {
	switch {
	case math.Abs(ours.Mean-best.Mean) <= math.Hypot(ours.SD, best.SD):
		return Tie
	case c.better(ours.Mean, best.Mean):
		return Win
	}
	return Loss
}
