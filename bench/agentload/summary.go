package agentload

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// ttfbCeiling is the largest TTFB the histogram tells apart; longer ones
// count as this much.
const ttfbCeiling = time.Hour

// Summary holds the benchmark table's client-side numbers (DESIGN §1) for
// the requests that ended within a time window.
type Summary struct {
	// Window is the length of the time window.
	Window time.Duration
	// Requests counts the results that ended in the window; Succeeded, Cut
	// and Errors split them.
	Requests  int
	Succeeded int
	Cut       int
	Errors    int
	// SessionsCompleted counts sessions whose last turn succeeded in the window.
	SessionsCompleted int
	// SessionsPerHour is SessionsCompleted scaled to an hour.
	SessionsPerHour float64
	// OutputTokens sums the output tokens of every request, cut ones included.
	OutputTokens int
	// OutputTokensPerMin is OutputTokens scaled to a minute.
	OutputTokensPerMin float64
	// TTFBCount is how many requests received a first token; TTFBP50 and
	// TTFBP95 are percentiles over them (microsecond resolution, three
	// significant digits), TTFBMean their mean: with throughput fixed, a
	// closed loop fixes the mean (Little's law), so a lower median that
	// leaves the mean alone was paid for in the tail.
	TTFBCount int
	TTFBP50   time.Duration
	TTFBP95   time.Duration
	TTFBMean  time.Duration
	// PromptTokens and CachedTokens sum what the server reported per request;
	// CachedPercent is their ratio (the client's view of prefix hits, 0 when
	// the server reports nothing). CacheReports counts requests that
	// reported cached tokens, so a caller can tell "no hits" from "no data".
	PromptTokens  int
	CachedTokens  int
	CachedPercent float64
	CacheReports  int
	// StayedPercent averages, over conversations (Result.Conversation:
	// sessions, their sub-agents, the prefixes of a compacted one) with at
	// least two served requests, the share of a conversation's requests
	// served by the engine that served its first one (its pinned replica).
	// StayedSessions counts them.
	StayedPercent  float64
	StayedSessions int
}

// Summarize computes the Summary of the results whose End lies in [from, to].
// It only reads the results, so a virtual-time lab can build them itself.
func Summarize(results []Result, from, to time.Time) Summary {
	s := Summary{Window: to.Sub(from)}
	ttfb := hdrhistogram.New(1, ttfbCeiling.Microseconds(), 3)
	bySession := map[string][]Result{}
	for _, r := range results {
		if r.End.Before(from) || r.End.After(to) {
			continue
		}
		s.Requests++
		switch {
		case r.Cut:
			s.Cut++
		case r.Err != nil:
			s.Errors++
		default:
			s.Succeeded++
		}
		if r.SessionDone() {
			s.SessionsCompleted++
		}
		s.OutputTokens += r.OutputTokens
		if d, ok := r.TTFB(); ok {
			// RecordValue fails only out of range, which the clamp rules out.
			_ = ttfb.RecordValue(min(max(d, 0), ttfbCeiling).Microseconds())
		}
		s.PromptTokens += r.PromptTokens
		s.CachedTokens += r.CachedTokens
		if r.CacheReported {
			s.CacheReports++
		}
		if r.Engine != "" {
			bySession[r.Conversation()] = append(bySession[r.Conversation()], r)
		}
	}
	if hours := s.Window.Hours(); hours > 0 {
		s.SessionsPerHour = float64(s.SessionsCompleted) / hours
		s.OutputTokensPerMin = float64(s.OutputTokens) / s.Window.Minutes()
	}
	if n := ttfb.TotalCount(); n > 0 {
		s.TTFBCount = int(n)
		s.TTFBP50 = time.Duration(ttfb.ValueAtQuantile(50)) * time.Microsecond
		s.TTFBP95 = time.Duration(ttfb.ValueAtQuantile(95)) * time.Microsecond
		s.TTFBMean = time.Duration(ttfb.Mean() * float64(time.Microsecond))
	}
	if s.PromptTokens > 0 {
		s.CachedPercent = 100 * float64(s.CachedTokens) / float64(s.PromptTokens)
	}
	s.StayedPercent, s.StayedSessions = stayed(bySession)
	return s
}

// stayed returns the mean share of each session's served requests that went
// to its pinned engine, in percent, and how many sessions it averages over.
// A session seen once says nothing about staying and is left out.
func stayed(bySession map[string][]Result) (float64, int) {
	var sum float64
	sessions := 0
	// Sum in a fixed order: floating-point addition is not associative, and
	// the same results must give the same summary to the last bit.
	for _, id := range slices.Sorted(maps.Keys(bySession)) {
		rs := bySession[id]
		if len(rs) < 2 {
			continue
		}
		first := slices.MinFunc(rs, func(a, b Result) int {
			return cmp.Or(cmp.Compare(a.Turn, b.Turn), a.Start.Compare(b.Start))
		})
		same := 0
		for _, r := range rs {
			if r.Engine == first.Engine {
				same++
			}
		}
		sum += float64(same) / float64(len(rs))
		sessions++
	}
	if sessions == 0 {
		return 0, 0
	}
	return 100 * sum / float64(sessions), sessions
}
