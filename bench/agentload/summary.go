package agentload

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// ttfbCeiling and conversationCeiling are the largest TTFB and time per
// conversation the histograms tell apart; longer ones count as this much.
const (
	ttfbCeiling         = time.Hour
	conversationCeiling = 24 * time.Hour
)

// durations is the histogram behind every percentile of a Summary:
// microsecond resolution, three significant digits, nearest rank (the value
// at rank round(q×n), reported as the top of its bucket). Values are clamped
// to [0, ceiling].
type durations struct {
	h       *hdrhistogram.Histogram
	ceiling time.Duration
}

func newDurations(ceiling time.Duration) durations {
	return durations{hdrhistogram.New(1, ceiling.Microseconds(), 3), ceiling}
}

func (d durations) record(v time.Duration) {
	// RecordValue fails only out of range, which the clamp rules out.
	_ = d.h.RecordValue(min(max(v, 0), d.ceiling).Microseconds())
}

func (d durations) count() int { return int(d.h.TotalCount()) }

// quantile returns the q-th percentile (q in [0, 100]).
func (d durations) quantile(q float64) time.Duration {
	return time.Duration(d.h.ValueAtQuantile(q)) * time.Microsecond
}

func (d durations) mean() time.Duration { return time.Duration(d.h.Mean() * float64(time.Microsecond)) }

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
	// ConversationsTimed counts the conversations (sessions, their
	// sub-agents and compactions included) whose first request was sent in
	// the window and whose last turn succeeded, whenever that was: each is
	// timed from that send to the last token of its last turn, pauses
	// between turns included. ConversationP50, ConversationP95 and
	// ConversationMean are over those times, by the TTFB's method.
	// ConversationsCut counts the others sent in the window that were still
	// under way where the results stop, having neither finished nor been
	// abandoned after a failed request.
	//
	// Results that stop at the window's end, as the Runner's do, time only
	// the conversations that fit in the window: a bias toward short ones,
	// which ConversationsCut shows. Results that run on past the window
	// until the conversations sent in it have ended, as the lab's do,
	// avoid it.
	ConversationsTimed int
	ConversationsCut   int
	ConversationP50    time.Duration
	ConversationP95    time.Duration
	ConversationMean   time.Duration
}

// Summarize computes the Summary of the results whose End lies in [from, to].
// Results ending after to count only toward the time of the conversations
// sent in the window (see Summary.ConversationsTimed). It only reads the
// results, so a virtual-time lab can build them itself.
func Summarize(results []Result, from, to time.Time) Summary {
	s := Summary{Window: to.Sub(from)}
	ttfb := newDurations(ttfbCeiling)
	bySession := map[string][]Result{}
	spans := map[string]*sessionSpan{}
	for _, r := range results {
		span := spans[r.SessionID]
		if span == nil {
			span = &sessionSpan{}
			spans[r.SessionID] = span
		}
		span.add(r)
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
			ttfb.record(d)
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
	if n := ttfb.count(); n > 0 {
		s.TTFBCount = n
		s.TTFBP50 = ttfb.quantile(50)
		s.TTFBP95 = ttfb.quantile(95)
		s.TTFBMean = ttfb.mean()
	}
	conversations := newDurations(conversationCeiling)
	for _, span := range spans {
		switch {
		case span.sent.IsZero() || span.sent.Before(from) || span.sent.After(to):
			// Not sent in the window.
		case !span.finished.IsZero():
			conversations.record(span.finished.Sub(span.sent))
		case !span.abandoned:
			s.ConversationsCut++
		}
	}
	if n := conversations.count(); n > 0 {
		s.ConversationsTimed = n
		s.ConversationP50 = conversations.quantile(50)
		s.ConversationP95 = conversations.quantile(95)
		s.ConversationMean = conversations.mean()
	}
	if s.PromptTokens > 0 {
		s.CachedPercent = 100 * float64(s.CachedTokens) / float64(s.PromptTokens)
	}
	s.StayedPercent, s.StayedSessions = stayed(bySession)
	return s
}

// sessionSpan is what timing a session's conversation takes from its results.
type sessionSpan struct {
	sent      time.Time // its first request's send; zero until seen
	finished  time.Time // its last turn's end; zero until that turn succeeded
	abandoned bool      // a request of its main agent failed: clients give up the session
}

func (sp *sessionSpan) add(r Result) {
	if r.Side {
		return // a side call neither opens nor ends the conversation it serves
	}
	opens := r.Agent == "" && r.Segment == 0 && r.Turn == 0
	if opens && (sp.sent.IsZero() || r.Start.Before(sp.sent)) {
		sp.sent = r.Start // the earliest send, should a first request be resent
	}
	if r.SessionDone() {
		sp.finished = r.End
	}
	if r.Agent == "" && r.Err != nil {
		sp.abandoned = true
	}
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
