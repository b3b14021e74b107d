package report

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// ShapeTolerance is the relative margin within which a policy ties the best
// baseline on a shape, whatever the spread: smaller differences are noise a
// user would never see.
const ShapeTolerance = 0.03

// minConversationsTimed is how many conversations a run must have timed for
// its mean time per conversation to be judged: with fewer, one long
// conversation decides it.
const minConversationsTimed = 8

// conversationMean is the mean time per conversation, NaN where too few
// were timed.
var conversationMean = metric{"Conv mean (s)", func(r Row) float64 {
	if r.ConversationsTimed < minConversationsTimed {
		return math.NaN()
	}
	return r.ConversationMeanS
}, fixed(1), true}

// shapeColumns are the columns a shape is judged on: throughput, the TTFB
// median and tail, and the mean time per conversation.
var shapeColumns = []versusColumn{
	{outputPerMin, true, "output_tokens"},
	{ttfbP50, false, "ttfb_p50"},
	{ttfbP95, false, "ttfb_p95"},
	{conversationMean, false, "conversation_mean"},
}

// ShapeColumns names the columns of ShapeCell.Columns, in order.
func ShapeColumns() []string {
	out := make([]string, len(shapeColumns))
	for i, c := range shapeColumns {
		out[i] = c.header
	}
	return out
}

// ShapeCell is one subject policy against the baselines on one shape.
type ShapeCell struct {
	Shape   string
	Subject string
	Seeds   int
	// Columns follow ShapeColumns; a lost column's Best is the baseline
	// it lost to.
	Columns []Versus
	// DominatedBy are the baselines that beat the subject outright: worse
	// in no column and better in one, each judged as a column is. A cell
	// can lose columns to different baselines, each best at one of them,
	// and still be the better choice against any one a user could run.
	DominatedBy []string
}

// CompareShapes sets each subject against the baselines (every policy of
// rows that is not a subject) on each shape (rows' Workload), column by
// column. A column is won when the subject is better than the best
// baseline by more than ShapeTolerance and more than their combined
// spread, lost when worse than any baseline by as much (the best one's
// spread may hide a loss to a steadier one), tied otherwise or when either
// was not measured.
func CompareShapes(rows []Row, subjects []string) ([]ShapeCell, error) {
	byShape := map[string][]Row{}
	var shapes []string
	for _, r := range rows {
		if _, ok := byShape[r.Workload]; !ok {
			shapes = append(shapes, r.Workload)
		}
		byShape[r.Workload] = append(byShape[r.Workload], r)
	}
	var out []ShapeCell
	for _, shape := range shapes {
		points, _ := aggregate(byShape[shape])
		var baselines []point
		for _, p := range points {
			if !slices.Contains(subjects, p.policy) {
				baselines = append(baselines, p)
			}
		}
		if len(baselines) == 0 {
			return nil, fmt.Errorf("report: %s has no baseline", shape)
		}
		for _, subject := range subjects {
			i := slices.IndexFunc(points, func(p point) bool { return p.policy == subject })
			if i < 0 {
				return nil, fmt.Errorf("report: %s has no rows of %s", shape, subject)
			}
			cell := ShapeCell{Shape: shape, Subject: subject, Seeds: len(points[i].rows)}
			for _, col := range shapeColumns {
				v := Versus{BestPolicy: baselines[0].policy}
				v.Ours.Mean, v.Ours.SD = points[i].stat(col.metric)
				v.Best.Mean, v.Best.SD = baselines[0].stat(col.metric)
				for _, b := range baselines[1:] {
					if mean, sd := b.stat(col.metric); col.better(mean, v.Best.Mean) || math.IsNaN(v.Best.Mean) {
						v.Best, v.BestPolicy = Stat{mean, sd}, b.policy
					}
				}
				v.Verdict = col.shapeVerdict(v.Ours, v.Best)
				if v.Verdict != Loss {
					v = col.lossToAny(v, baselines)
				}
				cell.Columns = append(cell.Columns, v)
			}
			for _, b := range baselines {
				if dominates(points[i], b) {
					cell.DominatedBy = append(cell.DominatedBy, b.policy)
				}
			}
			out = append(out, cell)
		}
	}
	return out, nil
}

// lossToAny is v lost to the baseline the subject is furthest behind
// among those it loses to, v itself when it loses to none.
func (c versusColumn) lossToAny(v Versus, baselines []point) Versus {
	out := v
	for _, b := range baselines {
		theirs := b.statOf(c.metric)
		if c.shapeVerdict(v.Ours, theirs) != Loss {
			continue
		}
		if out.Verdict != Loss || c.better(theirs.Mean, out.Best.Mean) {
			out = Versus{Ours: v.Ours, Best: theirs, BestPolicy: b.policy, Verdict: Loss}
		}
	}
	return out
}

// dominates reports whether baseline beats subject in one column and
// loses to it in none.
func dominates(subject, baseline point) bool {
	beaten := false
	for _, col := range shapeColumns {
		switch col.shapeVerdict(subject.statOf(col.metric), baseline.statOf(col.metric)) {
		case Win:
			return false
		case Loss:
			beaten = true
		}
	}
	return beaten
}

// shapeVerdict is verdict with ShapeTolerance: a difference must pass both
// the combined spread and the tolerance to count.
func (c versusColumn) shapeVerdict(ours, best Stat) Verdict {
	if math.IsNaN(ours.Mean) || math.IsNaN(best.Mean) || best.Mean == 0 {
		return Tie
	}
	diff := math.Abs(ours.Mean - best.Mean)
	if diff <= math.Hypot(ours.SD, best.SD) || diff <= ShapeTolerance*math.Abs(best.Mean) {
		return Tie
	}
	if c.better(ours.Mean, best.Mean) {
		return Win
	}
	return Loss
}

// Lost reports whether the cell loses any of the columns for which counts
// says true (ShapeColumns' order).
func (c ShapeCell) Lost(counts []bool) bool {
	for i, v := range c.Columns {
		if counts[i] && v.Verdict == Loss {
			return true
		}
	}
	return false
}

// PrintShapeSummary writes, per subject, the wins, ties and losses of each
// column over the shapes and how many shapes a baseline beat it outright
// on, then every lost column: the subject's mean, the best baseline's,
// their ratio and describe(shape), which should say how to run that shape
// again.
func PrintShapeSummary(w io.Writer, cells []ShapeCell, describe func(shape string) string) error {
	subjects := subjectsOf(cells)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "Policy\tShapes")
	for _, col := range shapeColumns {
		fmt.Fprintf(tw, "\t%s win/tie/loss", col.header)
	}
	fmt.Fprintln(tw, "\tBeaten outright\t")
	for _, s := range subjects {
		mine := cellsOf(cells, s)
		fmt.Fprintf(tw, "%s\t%d", s, len(mine))
		for i := range shapeColumns {
			fmt.Fprintf(tw, "\t%s", tally(mine, i))
		}
		beaten := 0
		for _, c := range mine {
			if len(c.DominatedBy) > 0 {
				beaten++
			}
		}
		fmt.Fprintf(tw, "\t%d\t\n", beaten)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range subjects {
		var lost []ShapeCell
		for _, c := range cellsOf(cells, s) {
			if slices.ContainsFunc(c.Columns, func(v Versus) bool { return v.Verdict == Loss }) {
				lost = append(lost, c)
			}
		}
		if len(lost) == 0 {
			fmt.Fprintf(w, "\n%s loses no cell.\n", s)
			continue
		}
		fmt.Fprintf(w, "\n%s loses %d shapes:\n", s, len(lost))
		for _, c := range lost {
			var parts []string
			for i, v := range c.Columns {
				if v.Verdict == Loss {
					col := shapeColumns[i]
					parts = append(parts, fmt.Sprintf("%s %s against %s %s (%s)", col.header,
						formatStat(col.metric, v.Ours, c.Seeds), v.BestPolicy, formatStat(col.metric, v.Best, c.Seeds), formatRatio(v.Ratio())))
				}
			}
			if len(c.DominatedBy) > 0 {
				parts = append(parts, "beaten outright by "+strings.Join(c.DominatedBy, ", "))
			}
			fmt.Fprintf(w, "  %s: %s\n    %s\n", c.Shape, strings.Join(parts, "; "), describe(c.Shape))
		}
	}
	return nil
}

// ShapeAxis bins the shapes along one of their dimensions for
// PrintShapeAxes: Bins in display order, Bin a shape's.
type ShapeAxis struct {
	Name string
	Bins []string
	Bin  func(shape string) string
}

// PrintShapeAxes writes, for each axis, one line per bin and subject with
// the number of shapes and each column's wins/ties/losses, so that where a
// policy loses can be read along each dimension.
func PrintShapeAxes(w io.Writer, cells []ShapeCell, axes []ShapeAxis) error {
	subjects := subjectsOf(cells)
	for _, axis := range axes {
		fmt.Fprintf(w, "\n%s:\n", axis.Name)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "  Bin\tPolicy\tShapes")
		for _, col := range shapeColumns {
			fmt.Fprintf(tw, "\t%s", col.header)
		}
		fmt.Fprintln(tw, "\t")
		for _, bin := range axis.Bins {
			for _, s := range subjects {
				var mine []ShapeCell
				for _, c := range cellsOf(cells, s) {
					if axis.Bin(c.Shape) == bin {
						mine = append(mine, c)
					}
				}
				if len(mine) == 0 {
					continue
				}
				fmt.Fprintf(tw, "  %s\t%s\t%d", bin, s, len(mine))
				for i := range shapeColumns {
					fmt.Fprintf(tw, "\t%s", tally(mine, i))
				}
				fmt.Fprintln(tw, "\t")
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func subjectsOf(cells []ShapeCell) []string {
	var out []string
	for _, c := range cells {
		if !slices.Contains(out, c.Subject) {
			out = append(out, c.Subject)
		}
	}
	return out
}

func cellsOf(cells []ShapeCell, subject string) []ShapeCell {
	var out []ShapeCell
	for _, c := range cells {
		if c.Subject == subject {
			out = append(out, c)
		}
	}
	slices.SortStableFunc(out, func(a, b ShapeCell) int { return cmp.Compare(a.Shape, b.Shape) })
	return out
}

// tally is column i's "wins/ties/losses" over cells.
func tally(cells []ShapeCell, i int) string {
	n := map[Verdict]int{}
	for _, c := range cells {
		n[c.Columns[i].Verdict]++
	}
	return fmt.Sprintf("%d/%d/%d", n[Win], n[Tie], n[Loss])
}
