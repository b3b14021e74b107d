package faults

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lmwarden/caddy-warden/bench/e2e"
)

// Row is one fault's outcome.
type Row struct {
	// Fault names what was done.
	Fault string
	// Sent counts the requests that ended during the fault's phase; Failed
	// those that did not complete; CutStreaming, of the failed, those that
	// were already streaming from a replica when it died (no proxy can
	// retry them).
	Sent         int
	Failed       int
	CutStreaming int
	// Resent counts requests the client sent a second time because Caddy
	// closed the kept-alive connection they went out on (see keptAliveRetry);
	// a resent request that then succeeded is not a failure.
	Resent int
	// PinsChecked counts conversations followed through the phase; PinsLost
	// those served by another replica without cause; Moved those re-placed
	// once because their replica failed, which is the expected outcome.
	PinsChecked int
	PinsLost    int
	Moved       int
	// Recovery is how long after the fault ended (replica restarted, fault
	// cleared) the replica took a new conversation again; 0 when it does
	// not apply (reloads).
	Recovery time.Duration
	// Notes are the phase's other measurements.
	Notes []string
	// Violations are the expectations the phase missed; empty means it
	// behaved as a trusted proxy must.
	Violations []string
}

// Table is the outcome of a fault run.
type Table struct {
	// Options are the run's options, defaults filled in.
	Options Options
	// MetricsInterval is warden's metrics interval in wall time.
	MetricsInterval time.Duration
	Rows            []Row
}

// Violations lists every row's missed expectations, prefixed by its fault.
func (t Table) Violations() []string {
	var out []string
	for _, r := range t.Rows {
		for _, v := range r.Violations {
			out = append(out, r.Fault+": "+v)
		}
	}
	return out
}

// Print writes the table as Markdown, then each row's notes and the
// violations.
func (t Table) Print(w io.Writer) error {
	o := t.Options
	var b strings.Builder
	fmt.Fprintf(&b, "%d simulated replicas, time scale %g (metrics interval %v wall = 1 s simulated), %d agent sessions + %d probe conversations + 1 new conversation per interval, seed %d\n\n",
		o.Replicas, o.TimeScale, t.MetricsInterval, o.Sessions, o.Probes, o.Seed)
	if o.Instances > 1 || o.PinStore == e2e.PinStoreRedis {
		fmt.Fprintf(&b, "%d Caddy instance(s) behind a front that picks one at random per request, pin store %s\n\n", o.Instances, o.PinStore)
	}
	tw := tabwriter.NewWriter(&b, 0, 0, 1, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "| Fault\t Sent\t Failed\t of which cut mid-stream\t Client resends\t Pins lost\t Moved (expected)\t Recovery\t Result\t")
	fmt.Fprintln(tw, "|---\t---\t---\t---\t---\t---\t---\t---\t---\t")
	for _, r := range t.Rows {
		result := "ok"
		if len(r.Violations) > 0 {
			result = fmt.Sprintf("%d violation(s)", len(r.Violations))
		}
		fmt.Fprintf(tw, "| %s\t %d\t %d\t %d\t %d\t %d / %d\t %d\t %s\t %s\t\n",
			r.Fault, r.Sent, r.Failed, r.CutStreaming, r.Resent, r.PinsLost, r.PinsChecked, r.Moved, t.recovery(r.Recovery), result)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// tabwriter's Debug mode separates cells with '|'; the leading "| " and
	// the trailing "|" make each line a Markdown table row.
	b.WriteString("\n")
	for _, r := range t.Rows {
		if len(r.Notes) == 0 {
			continue
		}
		fmt.Fprintf(&b, "- %s: %s\n", r.Fault, strings.Join(r.Notes, "; "))
	}
	if v := t.Violations(); len(v) > 0 {
		b.WriteString("\nViolations:\n")
		for _, line := range v {
			fmt.Fprintf(&b, "- %s\n", line)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// recovery shows a duration in wall time and in metrics intervals, which
// is what it means at any time scale.
func (t Table) recovery(d time.Duration) string {
	if d == 0 {
		return "—"
	}
	return t.inIntervals(d)
}

func (t Table) inIntervals(d time.Duration) string {
	return fmt.Sprintf("%v (%.1f intervals)", d.Round(time.Millisecond), float64(d)/float64(t.MetricsInterval))
}
