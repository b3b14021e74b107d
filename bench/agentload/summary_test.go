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

// TestSummarizeConversationTimes times each conversation sent in the window
// from its first request's send to its last turn's end, even after the
// window, and counts the ones still under way where the results stop.
func TestSummarizeConversationTimes(t *testing.T) {
	minute := func(m float64) time.Time { return at(time.Duration(m * float64(time.Minute))) }
	turn := func(session string, turn int, last bool, start, end float64) Result {
		return Result{SessionID: session, Turn: turn, LastTurn: last, Start: minute(start), FirstToken: minute(start).Add(time.Second), End: minute(end)}
	}
	failed := func(r Result) Result {
		r.Err, r.Status, r.FirstToken = errors.New("status 500"), 500, time.Time{}
		return r
	}
	cut := func(r Result) Result { r.Cut, r.FirstToken = true, time.Time{}; return r }
	subagent := func(r Result) Result { r.Agent = "helper"; return r }
	compacted := func(r Result) Result { r.Segment = 1; return r }
	windowEnd := 30.0
	results := []Result{
		// Timed: 3, 10, 1, 7, 4 and 6 minutes.
		turn("a", 0, false, 1, 2), turn("a", 1, true, 3, 4),
		turn("b", 0, false, 2, 3), turn("b", 1, false, 5, 8), turn("b", 2, true, 9, 12),
		turn("c", 0, true, 5, 6), // one turn, first and last
		// Listed backwards.
		turn("d", 2, true, 16, 17), turn("d", 1, false, 13, 15), turn("d", 0, false, 10, 12),
		// A failed sub-agent, whose parent goes on, and a compaction, whose
		// new prefix starts again at turn 0.
		turn("p", 0, false, 14, 15), failed(subagent(turn("p", 0, false, 15, 15.5))),
		turn("p", 1, false, 15.5, 16), compacted(turn("p", 0, true, 17, 18)),
		// Sent in the window, finished after it.
		turn("n", 0, false, 27, 28), turn("n", 1, true, 29, 33),

		// Sent before the window: its first turn ended before it, or in it.
		turn("f", 0, false, -3, -2), turn("f", 1, true, 1, 3),
		turn("g", 0, false, -1, 0.5), turn("g", 1, true, 1, 2),
		// Wholly before the window, or sent after it.
		turn("m", 0, false, -10, -8), turn("m", 1, true, -7, -5),
		turn("o", 0, false, 31, 32), turn("o", 1, true, 32, 33),
		// Abandoned after a failure: its last turn, or a middle one.
		turn("k", 0, false, 4, 5), failed(turn("k", 1, true, 6, 7)),
		turn("l", 0, false, 8, 9), failed(turn("l", 1, false, 10, 10.5)),
		// Under way where the results stop: a cut last turn, a pause before
		// the next turn, a cut first turn.
		turn("h", 0, false, 27, 28), cut(turn("h", 1, true, 29, 30)),
		turn("i", 0, false, 28, 29),
		cut(turn("j", 0, false, 29, 30)),
	}
	s := Summarize(results, t0, minute(windowEnd))
	if s.ConversationsTimed != 6 || s.ConversationsCut != 3 {
		t.Fatalf("%d conversations timed, %d cut; want 6 (a, b, c, d, p, n) and 3 (h, i, j)", s.ConversationsTimed, s.ConversationsCut)
	}
	// Sorted: 1, 3, 4, 6, 7, 10 minutes. Nearest rank: p50 is the
	// round(0.5×6) = 3rd, 4 min; p95 the round(0.95×6) = 6th, 10 min.
	closeTo(t, "conversation p50 (s)", s.ConversationP50.Seconds(), 240, 0.24)
	closeTo(t, "conversation p95 (s)", s.ConversationP95.Seconds(), 600, 0.6)
	closeTo(t, "conversation mean (s)", s.ConversationMean.Seconds(), 31*60/6.0, 0.31)

	// Results that stop at the window's end, as the Runner's do: n is cut
	// instead of timed, and every other figure stays the same.
	var inWindow []Result
	for _, r := range results {
		if !r.End.After(minute(windowEnd)) {
			inWindow = append(inWindow, r)
		}
	}
	stopped := Summarize(inWindow, t0, minute(windowEnd))
	if stopped.ConversationsTimed != 5 || stopped.ConversationsCut != 4 {
		t.Fatalf("results stopping at the window's end: %d timed, %d cut; want 5 and 4 (n)", stopped.ConversationsTimed, stopped.ConversationsCut)
	}
	closeTo(t, "stopped conversation p95 (s)", stopped.ConversationP95.Seconds(), 600, 0.6)
	closeTo(t, "stopped conversation mean (s)", stopped.ConversationMean.Seconds(), 25*60/5.0, 0.25)
	withoutConversations := func(s Summary) Summary {
		s.ConversationsTimed, s.ConversationsCut = 0, 0
		s.ConversationP50, s.ConversationP95, s.ConversationMean = 0, 0, 0
		return s
	}
	if withoutConversations(s) != withoutConversations(stopped) {
		t.Errorf("results after the window changed more than the conversation times:\n%+v\n%+v", s, stopped)
	}
}
