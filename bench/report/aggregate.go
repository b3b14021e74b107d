package report

import (
	"cmp"
	"math"
	"slices"

	"github.com/dustin/go-humanize"
)

// metric is one numeric column of the table.
type metric struct {
	header string
	value  func(Row) float64
	format func(float64) string
	// ours is true for columns the seed's table does not have.
	ours bool
}

func fixed(decimals int) func(float64) string {
	return func(v float64) string { return humanize.CommafWithDigits(round(v, decimals), decimals) }
}

func round(v float64, decimals int) float64 {
	p := math.Pow(10, float64(decimals))
	return math.Round(v*p) / p
}

// The table's numeric columns, in the seed's order, then ours.
var (
	sessionsPerHour = metric{"Sessions/h", func(r Row) float64 { return r.SessionsPerHour }, fixed(0), false}
	outputPerMin    = metric{"Output tok/min", func(r Row) float64 { return r.OutputTokensPerMin }, fixed(0), false}
	ttfbP50         = metric{"TTFB p50 (s)", func(r Row) float64 { return r.TTFBP50S }, fixed(2), false}
	ttfbP95         = metric{"TTFB p95 (s)", func(r Row) float64 { return r.TTFBP95S }, fixed(2), false}
	ttfbMean        = metric{"TTFB mean (s)", func(r Row) float64 { return r.TTFBMeanS }, fixed(2), true}
	conversationP50 = metric{"Conv p50 (s)", conversationTime(func(r Row) float64 { return r.ConversationP50S }), fixed(1), true}
	conversationP95 = metric{"Conv p95 (s)", conversationTime(func(r Row) float64 { return r.ConversationP95S }), fixed(1), true}
	replicasBusy    = metric{"Busy", func(r Row) float64 { return r.ReplicasBusy }, fixed(2), false}
	prefixHits      = metric{"Hits %", func(r Row) float64 { return r.PrefixHitPercent }, fixed(1), false}
	hostHits        = metric{"Host hits %", hostHitPercent, fixed(1), true}
	stayedPercent   = metric{"Stayed %", func(r Row) float64 { return r.StayedPercent }, fixed(1), false}
	hitBound        = metric{"Bound %", func(r Row) float64 { return r.HitBoundPercent }, fixed(1), true}
	preemptions     = metric{"Preempt", func(r Row) float64 { return float64(r.Preemptions) }, fixed(0), true}
	errorCount      = metric{"Errors", func(r Row) float64 { return float64(r.Errors) }, fixed(0), true}
)

var tableMetrics = []metric{
	sessionsPerHour, outputPerMin, ttfbP50, ttfbP95, replicasBusy, prefixHits, stayedPercent,
	hitBound, ttfbMean, conversationP50, conversationP95, preemptions, errorCount,
}

// hostHitPercent reads the host tier's hits, NaN (not measured) for a row
// of an end-to-end run, which does not read the tier's counters.
func hostHitPercent(r Row) float64 {
	if r.Mode != ModeLab {
		return math.NaN()
	}
	return r.HostHitPercent
}

// metricsFor are the table's columns for rows: tableMetrics, with the host
// tier's hits beside the GPU's when a row had a tier.
func metricsFor(rows []Row) []metric {
	if !slices.ContainsFunc(rows, func(r Row) bool { return r.HostTierGiB > 0 }) {
		return tableMetrics
	}
	i := slices.IndexFunc(tableMetrics, func(m metric) bool { return m.header == prefixHits.header })
	return slices.Insert(slices.Clone(tableMetrics), i+1, hostHits)
}

// conversationTime reads a time per conversation, NaN (not measured) for a
// row that timed none: its 0 is no duration, and a mean over seeds that
// counted it would be no one's.
func conversationTime(value func(Row) float64) func(Row) float64 {
	return func(r Row) float64 {
		if r.ConversationsTimed == 0 {
			return math.NaN()
		}
		return value(r)
	}
}

// series is one line of a plot and one label in the table: a mode and a policy.
type series struct {
	mode, policy string
	// setup is the row's Setup: "" for one Caddy without a pin store.
	setup string
	// person is the row's Person: "" for everyone's.
	person string
	// model is the row's Model: "" for the only one.
	model string
}

func (s series) label(mixedModes bool) string {
	if s.model != "" {
		plain := s
		plain.model = ""
		return plain.label(mixedModes) + " " + s.model
	}
	if s.person != "" {
		plain := s
		plain.person = ""
		return plain.label(mixedModes) + " " + s.person
	}
	if s.setup != "" {
		plain := s
		plain.setup = ""
		return plain.label(mixedModes) + " " + s.setup
	}
	switch {
	case s.mode == ModeSeed && s.policy == "warden":
		return "seed on"
	case s.mode == ModeSeed:
		return "seed " + s.policy
	case mixedModes:
		return s.mode + " " + s.policy
	}
	return s.policy
}

// point is a series at one level: the rows of every seed.
type point struct {
	series
	sessions int
	rows     []Row
}

// stat is the mean of a metric over a point's seeds and its sample standard
// deviation (0 for a single seed). NaN when the metric was not measured.
func (p point) stat(m metric) (mean, sd float64) {
	if m.ours && p.mode == ModeSeed {
		return math.NaN(), 0
	}
	for _, r := range p.rows {
		mean += m.value(r)
	}
	n := float64(len(p.rows))
	mean /= n
	if len(p.rows) < 2 {
		return mean, 0
	}
	for _, r := range p.rows {
		d := m.value(r) - mean
		sd += d * d
	}
	return mean, math.Sqrt(sd / (n - 1))
}

// statOf is stat as a Stat.
func (p point) statOf(m metric) Stat {
	mean, sd := p.stat(m)
	return Stat{mean, sd}
}

// cell formats a metric as "mean" or, over several seeds, "mean±sd".
func (p point) cell(m metric) string {
	mean, sd := p.stat(m)
	if math.IsNaN(mean) {
		return "-"
	}
	return formatStat(m, Stat{mean, sd}, len(p.rows))
}

// aggregate groups rows into points ordered by level, then seed rows first,
// then series in order of first appearance.
func aggregate(rows []Row) (points []point, order []series) {
	rank := map[series]int{}
	index := map[series]map[int]int{}
	for _, r := range rows {
		s := series{r.Mode, r.Policy, r.Setup(), r.Person, r.Model}
		if _, ok := rank[s]; !ok {
			rank[s] = len(order)
			order = append(order, s)
			index[s] = map[int]int{}
		}
		i, ok := index[s][r.Sessions]
		if !ok {
			i = len(points)
			index[s][r.Sessions] = i
			points = append(points, point{series: s, sessions: r.Sessions})
		}
		points[i].rows = append(points[i].rows, r)
	}
	seedFirst := func(s series) int {
		if s.mode == ModeSeed {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(order, func(a, b series) int {
		return cmp.Or(cmp.Compare(seedFirst(a), seedFirst(b)), cmp.Compare(rank[a], rank[b]))
	})
	for i, s := range order {
		rank[s] = i
	}
	slices.SortStableFunc(points, func(a, b point) int {
		return cmp.Or(cmp.Compare(a.sessions, b.sessions), cmp.Compare(rank[a.series], rank[b.series]))
	})
	return points, order
}

// mixedModes reports whether rows other than the seed's come from more than one mode.
func mixedModes(order []series) bool {
	modes := map[string]bool{}
	for _, s := range order {
		if s.mode != ModeSeed {
			modes[s.mode] = true
		}
	}
	return len(modes) > 1
}
