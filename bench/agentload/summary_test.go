package agentload

import (
	"errors"
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// at returns t0 plus d, the virtual clock of the crafted results.
func at(d time.Duration) time.Time { return t0.Add(d) }

func closeTo(t *testing.T, what string, got, want, tolerance float64) {
	t.Helper()
	if math.Abs(got-want) > tolerance {
		t.Errorf("%s = %v, want %v ± %v", what, got, want, tolerance)
	}
}

func TestSummarizePercentiles(t *testing.T) {
	var results []Result
	// TTFBs 100 ms, 200 ms, ..., 10 s, listed in reverse so order cannot help.
	for i := 100; i >= 1; i-- {
		start := at(time.Duration(i) * time.Second)
		results = append(results, Result{
			SessionID:  "s",
			Start:      start,
			FirstToken: start.Add(time.Duration(i) * 100 * time.Millisecond),
			End:        start.Add(11 * time.Second),
		})
	}
	results = append(results, Result{Start: at(0), End: at(time.Second), Err: errors.New("refused")})

	s := Summarize(results, t0, at(time.Hour))
	if s.TTFBCount != 100 {
		t.Fatalf("TTFB count %d, want 100 (the failed request had no token)", s.TTFBCount)
	}
	// Nearest rank: the 50th and 95th smallest; the histogram keeps 3 digits.
	closeTo(t, "p50 (s)", s.TTFBP50.Seconds(), 5.0, 0.005)
	closeTo(t, "p95 (s)", s.TTFBP95.Seconds(), 9.5, 0.0095)
	closeTo(t, "mean (s)", s.TTFBMean.Seconds(), 5.05, 0.005)
}

func TestSummarizeRatesAndCounts(t *testing.T) {
	results := []Result{
		// Session a: two turns, done.
		{SessionID: "a", Turn: 0, Start: at(1 * time.Minute), End: at(2 * time.Minute), OutputTokens: 100, PromptTokens: 1000, CachedTokens: 0, CacheReported: true},
		{SessionID: "a", Turn: 1, LastTurn: true, Start: at(2 * time.Minute), End: at(3 * time.Minute), OutputTokens: 100, PromptTokens: 1200, CachedTokens: 1100, CacheReported: true},
		// Session b: last turn failed, so not completed.
		{SessionID: "b", Turn: 1, LastTurn: true, Start: at(5 * time.Minute), End: at(6 * time.Minute), Status: 500, Err: errors.New("status 500")},
		// Session c: last turn cut at the end of the window; its tokens count.
		{SessionID: "c", Turn: 1, LastTurn: true, Start: at(25 * time.Minute), End: at(30 * time.Minute), OutputTokens: 40, Cut: true},
		// Session d: one turn each, done twice in the window.
		{SessionID: "d", Turn: 0, LastTurn: true, Start: at(10 * time.Minute), End: at(11 * time.Minute), OutputTokens: 60, PromptTokens: 800},
		{SessionID: "e", Turn: 0, LastTurn: true, Start: at(12 * time.Minute), End: at(13 * time.Minute), OutputTokens: 300},
		// Outside the window on both sides: ignored.
		{SessionID: "x", Turn: 0, LastTurn: true, Start: at(-2 * time.Minute), End: at(-time.Minute), OutputTokens: 9999},
		{SessionID: "y", Turn: 0, LastTurn: true, Start: at(29 * time.Minute), End: at(31 * time.Minute), OutputTokens: 9999},
	}
	s := Summarize(results, t0, at(30*time.Minute))
	if s.Window != 30*time.Minute || s.Requests != 6 || s.Succeeded != 4 || s.Errors != 1 || s.Cut != 1 {
		t.Fatalf("window %v requests %d ok %d errors %d cut %d", s.Window, s.Requests, s.Succeeded, s.Errors, s.Cut)
	}
	if s.SessionsCompleted != 3 {
		t.Errorf("sessions completed %d, want 3 (a, d, e)", s.SessionsCompleted)
	}
	closeTo(t, "sessions per hour", s.SessionsPerHour, 6, 1e-9)
	if s.OutputTokens != 600 {
		t.Errorf("output tokens %d, want 600", s.OutputTokens)
	}
	closeTo(t, "output tokens per minute", s.OutputTokensPerMin, 20, 1e-9)
	if s.PromptTokens != 3000 || s.CachedTokens != 1100 || s.CacheReports != 2 {
		t.Errorf("prompt %d cached %d reports %d", s.PromptTokens, s.CachedTokens, s.CacheReports)
	}
	closeTo(t, "cached percent", s.CachedPercent, 100*1100.0/3000, 1e-9)
}

func TestSummarizeStayed(t *testing.T) {
	engine := func(session string, turn int, e string) Result {
		start := at(time.Duration(turn) * time.Minute)
		return Result{SessionID: session, Turn: turn, Engine: e, Start: start, End: start.Add(time.Second)}
	}
	results := []Result{
		// Listed newest first: the pinned engine is the first turn's, not the first listed.
		engine("a", 3, "s/0"), engine("a", 2, "s/1"), engine("a", 1, "s/0"), engine("a", 0, "s/0"),
		engine("b", 1, "s/1"), engine("b", 0, "s/1"),
		// One request: says nothing about staying.
		engine("c", 0, "s/2"),
		// Served by nobody we know (no engine header): left out.
		{SessionID: "d", Turn: 0, Start: at(0), End: at(time.Second), Err: errors.New("refused")},
		{SessionID: "d", Turn: 1, Start: at(time.Minute), End: at(time.Minute + time.Second), Err: errors.New("refused")},
	}
	s := Summarize(results, t0, at(time.Hour))
	if s.StayedSessions != 2 {
		t.Fatalf("stayed over %d sessions, want 2", s.StayedSessions)
	}
	closeTo(t, "stayed percent", s.StayedPercent, (75.0+100.0)/2, 1e-9)

	// The pinned engine is the earliest turn present in the window.
	late := Summarize(results, at(90*time.Second), at(time.Hour))
	if late.StayedSessions != 1 {
		t.Fatalf("late window: %d sessions, want 1", late.StayedSessions)
	}
	closeTo(t, "late stayed percent", late.StayedPercent, 50, 1e-9)
}

func TestSummarizeEmpty(t *testing.T) {
	s := Summarize(nil, t0, t0)
	if s != (Summary{}) {
		t.Errorf("empty summary: %+v", s)
	}
}
