package report

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// PrintTable writes the seed's table layout (DESIGN §1) with one line per
// policy and level, the seed's own numbers first at each level (added from
// SeedRows when rows hold none), then ours, plus the host tier's hits when
// the replicas had one, the hit bound, the TTFB
// mean, the time per conversation (p50, p95), preemptions and errors. Over
// several seeds each cell is "mean±standard deviation"; "-" is a figure not
// measured (the seed's columns it lacks; no conversation timed).
func PrintTable(w io.Writer, rows []Row) error {
	if !hasMode(rows, ModeSeed) {
		rows = append(SeedFor(rows), rows...)
	}
	points, order := aggregate(rows)
	mixed := mixedModes(order)
	metrics := metricsFor(rows)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := []string{"Sessions", "Policy", "Seeds"}
	for _, m := range metrics {
		header = append(header, m.header)
	}
	writeLine(tw, header)
	for i, p := range points {
		if i > 0 && points[i-1].sessions != p.sessions {
			writeLine(tw, make([]string, len(header)))
		}
		seeds := strconv.Itoa(len(p.rows))
		if p.mode == ModeSeed {
			seeds = "-"
		}
		line := []string{strconv.Itoa(p.sessions), p.label(mixed), seeds}
		for _, m := range metrics {
			line = append(line, p.cell(m))
		}
		writeLine(tw, line)
	}
	return tw.Flush()
}

func writeLine(w io.Writer, cells []string) {
	fmt.Fprintln(w, strings.Join(cells, "\t")+"\t")
}

func hasMode(rows []Row, mode string) bool {
	for _, r := range rows {
		if r.Mode == mode {
			return true
		}
	}
	return false
}
