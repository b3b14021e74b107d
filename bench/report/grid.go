package report

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// GridCell is one cell of a workload grid (wardenbench grid): a policy
// against the best of the others at one workload, think time, replica count
// and level.
type GridCell struct {
	Workload   string
	ThinkTimeS float64
	Replicas   int
	Comparison
}

// gridSetting is a cell but for its level: what one lab sweep varies.
type gridSetting struct {
	workload string
	thinkS   float64
	replicas int
}

// CompareGrid compares ours with the best of the other policies in every
// cell of the rows (their Workload, ThinkTimeS, Replicas and Sessions),
// ordered by workload as they first appear, then replicas, think time and
// sessions.
func CompareGrid(rows []Row, ours string) ([]GridCell, error) {
	var order []gridSetting
	bySetting := map[gridSetting][]Row{}
	for _, r := range rows {
		s := gridSetting{r.Workload, r.ThinkTimeS, r.Replicas}
		if _, ok := bySetting[s]; !ok {
			order = append(order, s)
		}
		bySetting[s] = append(bySetting[s], r)
	}
	var cells []GridCell
	for _, s := range order {
		comparisons, err := Compare(bySetting[s], ours)
		if err != nil {
			return nil, fmt.Errorf("%s, think %gs, %d replicas: %w", s.workload, s.thinkS, s.replicas, err)
		}
		for _, c := range comparisons {
			cells = append(cells, GridCell{s.workload, s.thinkS, s.replicas, c})
		}
	}
	workloadRank := func(name string) int {
		return slices.IndexFunc(order, func(s gridSetting) bool { return s.workload == name })
	}
	slices.SortStableFunc(cells, func(a, b GridCell) int {
		return cmp.Or(cmp.Compare(workloadRank(a.Workload), workloadRank(b.Workload)),
			cmp.Compare(a.Replicas, b.Replicas), cmp.Compare(a.ThinkTimeS, b.ThinkTimeS),
			cmp.Compare(a.Sessions, b.Sessions))
	})
	return cells, nil
}

// thinkLabel writes a think time as a duration ("3s", "1m0s").
func thinkLabel(seconds float64) string {
	return time.Duration(seconds * float64(time.Second)).String()
}

// PrintGrid writes cells as a Markdown table, three lines per cell as in
// docs/research/policy.md: ours, the best baseline of each column (name and value),
// then ours over the best and the verdict. It ends with the verdicts
// counted per column.
func PrintGrid(w io.Writer, cells []GridCell, ours string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	header := []string{"Workload", "Think", "Replicas", "Sessions", "Policy"}
	for _, col := range versusColumns {
		header = append(header, col.header)
	}
	writeMarkdownLine(tw, header)
	writeMarkdownLine(tw, slices.Repeat([]string{"---"}, len(header)))
	for _, c := range cells {
		key := []string{c.Workload, thinkLabel(c.ThinkTimeS), strconv.Itoa(c.Replicas), strconv.Itoa(c.Sessions)}
		mine := append(slices.Clone(key), "**"+ours+"**")
		best := append(slices.Clone(key), "best baseline")
		versus := append(slices.Clone(key), ours+" ÷ best")
		for i, col := range versusColumns {
			v := c.Columns[i]
			mine = append(mine, formatStat(col.metric, v.Ours, c.Seeds))
			best = append(best, v.BestPolicy+" "+formatStat(col.metric, v.Best, c.Seeds))
			versus = append(versus, fmt.Sprintf("%s %s", formatRatio(v.Ratio()), v.Verdict))
		}
		writeMarkdownLine(tw, mine)
		writeMarkdownLine(tw, best)
		writeMarkdownLine(tw, versus)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%s against the best baseline over %d cells:\n", ours, len(cells))
	for i, col := range versusColumns {
		count := map[Verdict]int{}
		for _, c := range cells {
			count[c.Columns[i].Verdict]++
		}
		fmt.Fprintf(w, "  %-14s %2d win, %2d tie, %2d loss\n", col.header, count[Win], count[Tie], count[Loss])
	}
	return nil
}

func writeMarkdownLine(w io.Writer, cells []string) {
	fmt.Fprintln(w, "| "+strings.Join(cells, "\t| ")+"\t|")
}

func formatRatio(r float64) string {
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return "-"
	}
	return strconv.FormatFloat(r, 'f', 2, 64)
}
