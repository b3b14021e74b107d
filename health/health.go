// Package health decides whether a vLLM replica can take work, from the
// freshness of its metrics, its /health probe and the proxy's own view of the
// upstream. It never reads the clock: callers pass the times of observations
// and queries, so tests and the virtual-time lab can use their own clock.
package health

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"
)

// Reason is a short, stable cause of a State, fit for admin JSON and logs.
type Reason string

// The reasons a replica is healthy or not, in the order they are checked.
const (
	ReasonUpstreamUnavailable Reason = "upstream unavailable" // the proxy's health checks marked it down
	ReasonNoMetrics           Reason = "no metrics yet"       // no scrape has succeeded
	ReasonMetricsError        Reason = "metrics error"        // metrics are stale and the last scrape failed
	ReasonStaleMetrics        Reason = "stale metrics"        // no scrape at all lately, for an interval more
	ReasonNoHealthCheck       Reason = "no health check yet"  // /health has not answered yet
	ReasonHealthFailed        Reason = "health failed"        // the last /health probe was not 200
	ReasonOK                  Reason = "ok"
)

// Pending reports a reason a replica has before its first check is
// complete: nothing said yet whether it can take work.
func (r Reason) Pending() bool { return r == ReasonNoMetrics || r == ReasonNoHealthCheck }

// State is whether a replica can take work, and why.
type State struct {
	Healthy bool      `json:"healthy"`
	Reason  Reason    `json:"reason"`
	Detail  string    `json:"detail,omitempty"` // e.g. the error text
	Since   time.Time `json:"since"`            // when Healthy and Reason last changed
}

// String renders the state as "reason" or "reason: detail".
func (s State) String() string {
	if s.Detail == "" {
		return string(s.Reason)
	}
	return string(s.Reason) + ": " + s.Detail
}

// sameAs reports whether two states are the same for change reporting: a new
// error text under the same reason is not a change.
func (s State) sameAs(other State) bool {
	return s.Healthy == other.Healthy && s.Reason == other.Reason
}

// DefaultStaleIntervals is how many poll intervals old the last successful
// scrape may be before the metrics count as stale.
const DefaultStaleIntervals = 3

// Config configures a Tracker.
type Config struct {
	// Interval is the metrics poll interval.
	Interval time.Duration
	// StaleAfter is how old the last successful scrape may be; default
	// DefaultStaleIntervals * Interval.
	StaleAfter time.Duration
	// OnChange, if set, is called once per change of Healthy or Reason. It
	// runs with the Tracker locked, in order of changes: it must be quick
	// and must not call the Tracker.
	OnChange func(old, new State)
}

// Tracker follows one replica. Observations may arrive in any order; each
// kind keeps its latest. Its methods are safe for concurrent use.
type Tracker struct {
	onChange func(old, new State)

	mu             sync.Mutex
	staleAfter     time.Duration // SetInterval changes it, and interval
	interval       time.Duration
	lastSuccessAt  time.Time // zero until a scrape succeeds
	firstAttemptAt time.Time
	lastAttemptAt  time.Time
	lastErr        error // of the latest scrape attempt
	healthAt       time.Time
	healthSeen     bool
	healthErr      error
	// answerErr is the latest answered /health probe's error (nil for
	// 200): a probe that timed out says nothing new, so a server that
	// answered 503 stays failed through it.
	answerErr error
	// slowSince is when the /health probes began timing out, zero while
	// they answer: a busy server may answer late, and gets the grace that
	// metrics get before it counts as failed.
	slowSince time.Time
	// absentSince is when an evaluation first found no scrape ended for
	// staleAfter, zero since one ended (see absenceConfirmed).
	absentSince  time.Time
	upstreamDown bool
	evaluatedAt  time.Time // latest time a state was computed for
	state        State
}

// NewTracker returns a Tracker that has seen nothing yet: unhealthy, with
// ReasonNoMetrics.
func NewTracker(cfg Config) *Tracker {
	staleAfter := cfg.StaleAfter
	if staleAfter <= 0 {
		staleAfter = DefaultStaleIntervals * cfg.Interval
	}
	return &Tracker{
		staleAfter: staleAfter,
		interval:   cfg.Interval,
		onChange:   cfg.OnChange,
		state:      State{Reason: ReasonNoMetrics},
	}
}

// SetInterval changes the poll interval the metrics' age is judged by, as
// a config reload may: StaleAfter becomes DefaultStaleIntervals of it.
func (t *Tracker) SetInterval(interval time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.staleAfter, t.interval = DefaultStaleIntervals*interval, interval
}

// ObserveScrape records a /metrics attempt that finished at at; err is nil
// for a successful, valid scrape.
func (t *Tracker) ObserveScrape(at time.Time, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err == nil && at.After(t.lastSuccessAt) {
		t.lastSuccessAt = at
	}
	if t.firstAttemptAt.IsZero() {
		t.firstAttemptAt = at
	}
	if !at.Before(t.lastAttemptAt) {
		t.lastAttemptAt, t.lastErr = at, err
	}
	t.absentSince = time.Time{}
	t.evaluateLocked(at)
}

// ObserveHealth records a /health probe that finished at at; err is nil for
// status 200.
func (t *Tracker) ObserveHealth(at time.Time, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.healthSeen || !at.Before(t.healthAt) {
		t.healthAt, t.healthErr, t.healthSeen = at, err, true
		if !timedOut(err) {
			t.answerErr = err
		}
		switch {
		case !timedOut(err):
			t.slowSince = time.Time{}
		case t.slowSince.IsZero():
			t.slowSince = at
		}
	}
	t.evaluateLocked(at)
}

// SetUpstreamAvailable records the proxy's own (passive or active) health of
// the upstream. A Tracker starts available. The change shows, and is
// reported, at the next observation or State call, which bring the time.
func (t *Tracker) SetUpstreamAvailable(available bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.upstreamDown = !available
}

// Healthy reports whether the replica can take work at now.
func (t *Tracker) Healthy(now time.Time) bool { return t.State(now).Healthy }

// State returns the replica's state at now.
func (t *Tracker) State(now time.Time) State {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.evaluateLocked(now)
}

// evaluateLocked computes the state at now, or at the latest time already
// evaluated if now is earlier (a late observation must not revive stale
// metrics), and reports a change.
func (t *Tracker) evaluateLocked(now time.Time) State {
	if now.Before(t.evaluatedAt) {
		now = t.evaluatedAt
	}
	t.evaluatedAt = now
	next := t.computeLocked(now)
	if next.sameAs(t.state) {
		t.state.Detail = next.Detail
		return t.state
	}
	next.Since = now
	old := t.state
	t.state = next
	if t.onChange != nil {
		t.onChange(old, next)
	}
	return next
}

func (t *Tracker) computeLocked(now time.Time) State {
	old := t.lastSuccessAt.IsZero() || now.Sub(t.lastSuccessAt) > t.staleAfter
	switch {
	case t.upstreamDown:
		return State{Reason: ReasonUpstreamUnavailable}
	case t.lastSuccessAt.IsZero() && (t.lastErr == nil || timedOut(t.lastErr) && now.Sub(t.firstAttemptAt) <= t.staleAfter):
		return State{Reason: ReasonNoMetrics} // a first scrape that timed out gets the grace of later ones
	case old && t.lastErr != nil:
		return State{Reason: ReasonMetricsError, Detail: t.lastErr.Error()}
	case old && t.absenceConfirmed(now):
		return State{Reason: ReasonStaleMetrics, Detail: "last scrape " + now.Sub(t.lastSuccessAt).String() + " ago"}
	case !t.healthSeen:
		return State{Reason: ReasonNoHealthCheck}
	case t.healthErr != nil && (!timedOut(t.healthErr) || t.answerErr != nil || now.Sub(t.slowSince) > t.staleAfter):
		return State{Reason: ReasonHealthFailed, Detail: t.healthErr.Error()}
	}
	return State{Healthy: true, Reason: ReasonOK}
}

// absenceConfirmed reports, when no scrape has ended for staleAfter (none
// failed: the poller has reported nothing), whether that was already so an
// interval ago. The poller is then late or stuck, not the server: after
// this process was stalled (a starved machine), the first evaluation finds
// every scrape late, and the poller's reports, which were only waiting to
// run, come within the interval.
func (t *Tracker) absenceConfirmed(now time.Time) bool {
	if t.absentSince.IsZero() {
		t.absentSince = now
	}
	return now.Sub(t.absentSince) >= t.interval
}

// timedOut reports whether err is a request that ran out of time, which a
// busy server may cause, rather than one refused or answered with an error.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}
