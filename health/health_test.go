package health

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)

const interval = time.Second

// changeLog records OnChange calls.
type changeLog struct {
	mu      sync.Mutex
	changes [][2]State
}

func (c *changeLog) onChange(old, new State) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.changes = append(c.changes, [2]State{old, new})
}

func (c *changeLog) reasons() []Reason {
	c.mu.Lock()
	defer c.mu.Unlock()
	var rs []Reason
	for _, ch := range c.changes {
		rs = append(rs, ch[1].Reason)
	}
	return rs
}

func newTracker() (*Tracker, *changeLog) {
	log := &changeLog{}
	return NewTracker(Config{Interval: interval, OnChange: log.onChange}), log
}

// healthyAt returns a tracker that saw a good scrape and health probe at at.
func healthyAt(at time.Time) (*Tracker, *changeLog) {
	tr, log := newTracker()
	tr.ObserveScrape(at, nil)
	tr.ObserveHealth(at, nil)
	return tr, log
}

func TestFreshnessBoundary(t *testing.T) {
	tr, _ := healthyAt(t0)
	if !tr.Healthy(t0.Add(3 * interval)) {
		t.Error("unhealthy exactly 3 intervals after the last scrape")
	}
	// Past 3 intervals the absence is seen, and counts once it lasts an interval.
	if !tr.Healthy(t0.Add(3*interval + time.Nanosecond)) {
		t.Error("unhealthy as soon as the scrapes were found missing")
	}
	if tr.Healthy(t0.Add(4*interval + time.Nanosecond)) {
		t.Error("healthy an interval after the scrapes were found missing")
	}
	st := tr.State(t0.Add(5 * interval))
	if st.Reason != ReasonStaleMetrics || !strings.Contains(st.Detail, "5s") {
		t.Errorf("state %v, want stale metrics, 5s ago", st)
	}
	// A fresh scrape makes it healthy again.
	tr.ObserveScrape(t0.Add(6*interval), nil)
	if !tr.Healthy(t0.Add(6 * interval)) {
		t.Errorf("still unhealthy after a fresh scrape: %v", tr.State(t0.Add(6*interval)))
	}
}

func TestReasons(t *testing.T) {
	dead := errors.New("GET http://127.0.0.1:8001/health: status 503")
	refused := errors.New("connect: connection refused")
	cases := []struct {
		name   string
		setup  func(tr *Tracker)
		at     time.Time
		reason Reason
		detail string
	}{
		{"nothing seen", func(tr *Tracker) {}, t0, ReasonNoMetrics, ""},
		{"metrics but no health yet", func(tr *Tracker) { tr.ObserveScrape(t0, nil) }, t0, ReasonNoHealthCheck, ""},
		{"all good", func(tr *Tracker) { tr.ObserveScrape(t0, nil); tr.ObserveHealth(t0, nil) }, t0, ReasonOK, ""},
		{"health 503", func(tr *Tracker) { tr.ObserveScrape(t0, nil); tr.ObserveHealth(t0, dead) }, t0, ReasonHealthFailed, dead.Error()},
		{"first scrape failed", func(tr *Tracker) { tr.ObserveScrape(t0, refused) }, t0, ReasonMetricsError, refused.Error()},
		{"scrapes failing until stale", func(tr *Tracker) {
			tr.ObserveScrape(t0, nil)
			tr.ObserveHealth(t0, nil)
			tr.ObserveScrape(t0.Add(4*interval), refused)
		}, t0.Add(4 * interval), ReasonMetricsError, refused.Error()},
		{"no scrape lately", func(tr *Tracker) {
			tr.ObserveScrape(t0, nil)
			tr.ObserveHealth(t0, nil)
			tr.State(t0.Add(time.Minute - interval))
		}, t0.Add(time.Minute), ReasonStaleMetrics, "last scrape 1m0s ago"},
		{"upstream unavailable", func(tr *Tracker) {
			tr.ObserveScrape(t0, nil)
			tr.ObserveHealth(t0, nil)
			tr.SetUpstreamAvailable(false)
		}, t0, ReasonUpstreamUnavailable, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr, _ := newTracker()
			tc.setup(tr)
			st := tr.State(tc.at)
			if st.Reason != tc.reason || st.Detail != tc.detail || st.Healthy != (tc.reason == ReasonOK) {
				t.Errorf("state %+v, want reason %q detail %q", st, tc.reason, tc.detail)
			}
		})
	}
}

func TestOneFailedScrapeWithFreshDataStaysHealthy(t *testing.T) {
	tr, _ := healthyAt(t0)
	tr.ObserveScrape(t0.Add(interval), errors.New("timeout"))
	if !tr.Healthy(t0.Add(2 * interval)) {
		t.Errorf("one failed scrape made it unhealthy while the last good one is %v old", interval)
	}
	if tr.Healthy(t0.Add(3*interval + 1)) {
		t.Error("still healthy once the last good scrape is stale")
	}
}

func TestOnChangeFiresOncePerChange(t *testing.T) {
	tr, log := newTracker()
	for i := range 5 { // five good rounds: one change, to ok
		at := t0.Add(time.Duration(i) * interval)
		tr.ObserveScrape(at, nil)
		tr.ObserveHealth(at, nil)
		tr.State(at)
	}
	for i := 5; i < 10; i++ { // five 503s with different texts: one change
		at := t0.Add(time.Duration(i) * interval)
		tr.ObserveScrape(at, nil)
		tr.ObserveHealth(at, errors.New("status 503 #"+string(rune('0'+i))))
	}
	tr.ObserveHealth(t0.Add(10*interval), nil) // back to ok
	tr.SetUpstreamAvailable(false)             // reported at the next evaluation
	for range 3 {
		tr.State(t0.Add(10 * interval))
	}
	tr.SetUpstreamAvailable(true)
	tr.State(t0.Add(11 * interval))
	tr.State(t0.Add(20 * interval)) // no scrape lately
	tr.State(t0.Add(30 * interval)) // still none: stale

	want := []Reason{ReasonNoHealthCheck, ReasonOK, ReasonHealthFailed, ReasonOK, ReasonUpstreamUnavailable, ReasonOK, ReasonStaleMetrics}
	got := log.reasons()
	if strings.Join(reasonStrings(got), ",") != strings.Join(reasonStrings(want), ",") {
		t.Fatalf("changes %v, want %v", got, want)
	}
	for i, ch := range log.changes {
		if i > 0 && ch[0].Reason != log.changes[i-1][1].Reason {
			t.Errorf("change %d starts from %q, the previous ended at %q", i, ch[0].Reason, log.changes[i-1][1].Reason)
		}
	}
	if st := tr.State(t0.Add(31 * interval)); !st.Since.Equal(t0.Add(30 * interval)) {
		t.Errorf("stale since %v, want the evaluation that found it so", st.Since)
	}
}

func TestLateObservationDoesNotReviveStaleMetrics(t *testing.T) {
	tr, log := healthyAt(t0)
	tr.State(t0.Add(9 * interval))
	if tr.Healthy(t0.Add(10 * interval)) {
		t.Fatal("healthy with 10 s old metrics")
	}
	n := len(log.reasons())
	tr.ObserveHealth(t0.Add(interval), nil) // a probe result delivered late
	if tr.Healthy(t0.Add(10 * interval)) {
		t.Error("a late health result revived stale metrics")
	}
	if len(log.reasons()) != n {
		t.Errorf("late observation reported changes %v", log.reasons()[n:])
	}
}

func TestTrackerIsSafeForConcurrentUse(t *testing.T) {
	tr, log := newTracker()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				at := t0.Add(time.Duration(i) * time.Millisecond)
				switch g {
				case 0:
					tr.ObserveScrape(at, nil)
				case 1:
					tr.ObserveHealth(at, nil)
				case 2:
					tr.SetUpstreamAvailable(i%50 != 0)
				default:
					tr.State(at)
				}
			}
		})
	}
	wg.Wait()
	for i, ch := range log.changes {
		if ch[0].sameAs(ch[1]) {
			t.Errorf("change %d did not change anything: %v -> %v", i, ch[0], ch[1])
		}
		if i > 0 && !ch[0].sameAs(log.changes[i-1][1]) {
			t.Errorf("change %d starts from %v, the previous ended at %v", i, ch[0], log.changes[i-1][1])
		}
	}
}

func reasonStrings(rs []Reason) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r)
	}
	return out
}

// A busy server may answer its /health probe, or its first scrape, too
// late: timeouts get the grace stale metrics get (three intervals), while
// an answer that says the server is down (a 503, a refused connection)
// counts at once.
func TestTimeoutsGetTheGraceOfStaleMetrics(t *testing.T) {
	tr, _ := healthyAt(t0)
	for s := 1; s <= 3; s++ {
		at := t0.Add(time.Duration(s) * interval)
		tr.ObserveScrape(at, nil)
		tr.ObserveHealth(at, context.DeadlineExceeded)
		if !tr.Healthy(at) {
			t.Fatalf("/health timing out for %d s: %v, want healthy within three intervals", s-1, tr.State(at))
		}
	}
	at := t0.Add(5 * interval)
	tr.ObserveScrape(at, nil)
	tr.ObserveHealth(at, context.DeadlineExceeded)
	if st := tr.State(at); st.Reason != ReasonHealthFailed {
		t.Errorf("/health timing out for 4 s: %v, want health failed", st)
	}
	tr.ObserveHealth(at.Add(interval), nil)
	tr.ObserveHealth(at.Add(2*interval), errors.New("503 Service Unavailable"))
	if st := tr.State(at.Add(2 * interval)); st.Reason != ReasonHealthFailed {
		t.Errorf("a 503 after an answer: %v, want health failed at once", st)
	}

	first, _ := newTracker()
	first.ObserveScrape(t0, context.DeadlineExceeded)
	if st := first.State(t0.Add(2 * interval)); !st.Reason.Pending() {
		t.Errorf("a first scrape timed out 2 s ago: %v, want still pending", st)
	}
	if st := first.State(t0.Add(4 * interval)); st.Reason != ReasonMetricsError {
		t.Errorf("no scrape answered in 4 s: %v, want metrics error", st)
	}
	refused, _ := newTracker()
	refused.ObserveScrape(t0, errors.New("connection refused"))
	if st := refused.State(t0); st.Reason != ReasonMetricsError {
		t.Errorf("a first scrape refused: %v, want metrics error at once", st)
	}
}

// When this process was stalled (a starved machine), the first evaluation
// after it finds the scrapes late, though the server answered them: the
// poller's reports were only waiting to run. The server stays healthy, and
// no change is reported; scrapes that stay missing an interval longer (a
// poller stuck on this server) make it stale.
func TestAStalledPollerIsNoStaleServer(t *testing.T) {
	tr, log := healthyAt(t0)
	n := len(log.reasons())
	stalled := t0.Add(4 * interval)
	if st := tr.State(stalled); !st.Healthy {
		t.Fatalf("after a stall of 4 intervals: %v, want healthy", st)
	}
	tr.ObserveScrape(stalled.Add(5*time.Millisecond), nil) // the late report
	tr.ObserveHealth(stalled.Add(5*time.Millisecond), nil)
	if st := tr.State(stalled.Add(interval)); !st.Healthy || len(log.reasons()) != n {
		t.Errorf("after the late reports: %v, changes %v", st, log.reasons()[n:])
	}

	stuck, _ := healthyAt(t0)
	stuck.State(stalled)
	if st := stuck.State(stalled.Add(interval)); st.Reason != ReasonStaleMetrics {
		t.Errorf("no scrape for an interval after they were found missing: %v, want stale metrics", st)
	}
}

// A /health probe that times out while the server answers 503 (a loaded
// machine) keeps it failed: the grace of timeouts is for a server whose
// last answer was 200.
func TestATimeoutAfterA503KeepsItFailed(t *testing.T) {
	tr, log := healthyAt(t0)
	dead := errors.New("GET http://127.0.0.1:8001/health: status 503")
	tr.ObserveScrape(t0.Add(interval), nil)
	tr.ObserveHealth(t0.Add(interval), dead)
	n := len(log.reasons())
	tr.ObserveScrape(t0.Add(2*interval), nil)
	tr.ObserveHealth(t0.Add(2*interval), context.DeadlineExceeded)
	if st := tr.State(t0.Add(2 * interval)); st.Healthy || len(log.reasons()) != n {
		t.Errorf("a timeout after a 503: %v, changes %v; want still failed", st, log.reasons()[n:])
	}
	tr.ObserveHealth(t0.Add(3*interval), nil)
	tr.ObserveHealth(t0.Add(4*interval), context.DeadlineExceeded)
	if st := tr.State(t0.Add(4 * interval)); !st.Healthy {
		t.Errorf("a timeout after a 200: %v, want the grace of timeouts", st)
	}
}
