package report

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Columns of the setups table (several Caddy instances, with and without a
// shared pin store), beside the ones it shares with the seed's table.
var (
	turnsOnReplica   = metric{"Turns on replica %", func(r Row) float64 { return r.TurnsOnReplicaPercent }, fixed(1), true}
	newConversations = metric{"New convs", func(r Row) float64 { return float64(r.NewConversations) }, fixed(0), true}
	newSpread        = metric{"Spread", func(r Row) float64 { return float64(r.NewSpread) }, fixed(1), true}
)

var setupMetrics = []metric{
	outputPerMin, ttfbP50, ttfbP95, conversationP50, conversationP95, prefixHits, stayedPercent, turnsOnReplica,
	newConversations, newSpread, errorCount,
}

// HasSetups reports whether some rows come from more than one Caddy
// instance or a pin store.
func HasSetups(rows []Row) bool {
	for _, r := range rows {
		if r.Setup() != "" {
			return true
		}
	}
	return false
}

// PrintSetups writes, per level and policy, one line per setup (one Caddy;
// N without a store; N sharing a store), then checks each multi-instance
// setup with a pin store against the single instance at the same level and
// policy (issue 14): prefix hits at most 1 point below, at least 99% of turns on
// their conversation's replica (turn-weighted), and a spread of new
// conversations over replicas at most the single instance's + 1.
//
// Stayed % is agentload's: per conversation, the share of its requests in
// the window served where its first one in the window was, averaged over
// conversations. Turns on replica % is turn-weighted and measured against
// the replica of the conversation's turn 0. Spread is max − min of the new
// conversations each replica received in the window.
func PrintSetups(w io.Writer, rows []Row) error {
	points, _ := aggregate(rows)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := []string{"Sessions", "Policy", "Setup", "Seeds"}
	for _, m := range setupMetrics {
		header = append(header, m.header)
	}
	writeLine(tw, header)
	var checks []string
	for i, p := range points {
		if p.mode == ModeSeed {
			continue
		}
		if i > 0 && points[i-1].sessions != p.sessions {
			writeLine(tw, make([]string, len(header)))
		}
		setup := p.setup
		if setup == "" {
			setup = "1 instance"
		}
		line := []string{strconv.Itoa(p.sessions), p.policy, setup, strconv.Itoa(len(p.rows))}
		for _, m := range setupMetrics {
			line = append(line, p.cell(m))
		}
		writeLine(tw, line)
		if strings.HasSuffix(p.setup, " none") || p.setup == "" {
			continue
		}
		single, ok := findPoint(points, series{mode: p.mode, policy: p.policy}, p.sessions)
		if !ok {
			continue
		}
		checks = append(checks, checkSetup(p, single)...)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(checks) > 0 {
		fmt.Fprintln(w, "\nAgainst one instance (issue 14: hits at most 1 point below, ≥ 99% of turns on their replica, spread ≤ one instance's + 1):")
		for _, c := range checks {
			fmt.Fprintln(w, "  "+c)
		}
	}
	return nil
}

func findPoint(points []point, s series, sessions int) (point, bool) {
	for _, p := range points {
		if p.series == s && p.sessions == sessions {
			return p, true
		}
	}
	return point{}, false
}

// checkSetup compares a multi-instance setup with a store to one instance,
// one line per target, each ending in ok or MISSED.
func checkSetup(p, single point) []string {
	verdict := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "MISSED"
	}
	hits, _ := p.stat(prefixHits)
	hits1, _ := single.stat(prefixHits)
	turns, _ := p.stat(turnsOnReplica)
	spread, _ := p.stat(newSpread)
	spread1, _ := single.stat(newSpread)
	prefix := fmt.Sprintf("%d sessions, %s %s:", p.sessions, p.policy, p.setup)
	return []string{
		fmt.Sprintf("%s hits %.1f%% vs %.1f%% (%+.1f points): %s", prefix, hits, hits1, hits-hits1, verdict(hits >= hits1-1)),
		fmt.Sprintf("%s turns on their conversation's replica %.2f%%: %s", prefix, turns, verdict(turns >= 99)),
		fmt.Sprintf("%s spread %.1f vs %.1f: %s", prefix, spread, spread1, verdict(spread <= spread1+1)),
	}
}
