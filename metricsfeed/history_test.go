package metricsfeed

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)

const allCounters = FieldPrefixQueries | FieldPrefixHits | FieldPromptTokens | FieldPromptTokensCached | FieldGenerationTokens

// counters builds the stats of one engine whose counters all grow with n:
// prompt = 100n, cached = cachedPerTurn*n, generation = 10n, queries = 100n.
func counters(engine int, n, cachedPerTurn float64) EngineStats {
	return EngineStats{
		Engine: engine, Present: allCounters,
		PromptTokens: 100 * n, PromptTokensCached: cachedPerTurn * n, PrefixQueries: 100 * n,
		PrefixHits: cachedPerTurn * n, GenerationTokens: 10 * n,
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestRatesSteadyState(t *testing.T) {
	h := NewHistory(time.Hour, time.Second)
	for i := range 11 {
		h.Add("a", t0.Add(time.Duration(i)*time.Second), Scrape{Engines: []EngineStats{counters(0, float64(i), 60)}})
	}
	r, ok := h.Rates(t0.Add(10*time.Second), 10*time.Second, WholeTarget("a"))
	if !ok {
		t.Fatal("no rates")
	}
	if !near(r.PromptPerSec, 100) || !near(r.CachedPerSec, 60) || !near(r.ComputedPerSec, 40) || !near(r.GenPerSec, 10) {
		t.Errorf("rates %+v, want prompt 100, cached 60, computed 40, gen 10", r)
	}
	if hr, known := r.HitRate(); !known || !near(hr, 0.6) || !near(r.PrefixQueries, 1000) {
		t.Errorf("hit rate %v (known %v) over %v queries, want 0.6 over 1000", hr, known, r.PrefixQueries)
	}
	if _, ok := h.Rates(t0.Add(time.Hour), time.Minute, WholeTarget("a")); ok {
		t.Error("rates reported for a window with no samples")
	}
}

// A host-memory KV tier's hits are a share of the prompt tokens queried
// beside the GPU's; without the tier's counter the share is unknown, not 0.
func TestHostHitRateBesideTheGPUs(t *testing.T) {
	h := NewHistory(time.Hour, time.Second)
	for i := range 11 {
		e := counters(0, float64(i), 60)
		e.ExternalHits, e.Present = 25*float64(i), e.Present|FieldExternalHits
		h.Add("tier", t0.Add(time.Duration(i)*time.Second), Scrape{Engines: []EngineStats{e}})
		h.Add("gpu", t0.Add(time.Duration(i)*time.Second), Scrape{Engines: []EngineStats{counters(0, float64(i), 60)}})
	}
	r, _ := h.Rates(t0.Add(10*time.Second), 10*time.Second, WholeTarget("tier"))
	gpu, _ := r.HitRate()
	if host, known := r.HostHitRate(); !known || !near(host, 0.25) || !near(gpu, 0.6) {
		t.Errorf("host share %v (known %v), GPU %v; want 0.25 beside 0.6", host, known, gpu)
	}
	r, _ = h.Rates(t0.Add(10*time.Second), 10*time.Second, WholeTarget("gpu"))
	if host, known := r.HostHitRate(); known {
		t.Errorf("no tier's counter: host share %v known", host)
	}
}

func TestRatesSurviveCounterReset(t *testing.T) {
	h := NewHistory(time.Hour, time.Second)
	for i, prompt := range []float64{1000, 1100, 1200, 50, 150} { // server restarted before the 4th scrape
		h.Add("a", t0.Add(time.Duration(i)*time.Second), Scrape{Engines: []EngineStats{{Present: FieldPromptTokens, PromptTokens: prompt}}})
	}
	r, ok := h.Rates(t0.Add(4*time.Second), time.Minute, WholeTarget("a"))
	if !ok {
		t.Fatal("no rates")
	}
	// increases 100 + 100 + 50 (value after reset) + 100 over 4 s
	if !near(r.PromptPerSec, 87.5) {
		t.Errorf("prompt rate %v, want 87.5", r.PromptPerSec)
	}
	for _, p := range h.Series(time.Second, WholeTarget("a")) {
		if p.PromptPerSec < 0 || p.ComputedPerSec < 0 {
			t.Errorf("negative rate at %v: %+v", p.At, p)
		}
	}
}

func TestHitRateFollowsTheWindow(t *testing.T) {
	h := NewHistory(time.Hour, time.Second)
	var queries, hits float64
	for i := range 21 {
		if i > 0 {
			queries += 100
			if i <= 10 {
				hits += 90 // first 10 s: 90% hits
			} else {
				hits += 10 // last 10 s: 10% hits
			}
		}
		h.Add("a", t0.Add(time.Duration(i)*time.Second), Scrape{Engines: []EngineStats{{
			Present: FieldPrefixQueries | FieldPrefixHits, PrefixQueries: queries, PrefixHits: hits,
		}}})
	}
	now := t0.Add(20 * time.Second)
	for _, tc := range []struct {
		window time.Duration
		want   float64
	}{{5 * time.Second, 0.1}, {10 * time.Second, 0.1}, {20 * time.Second, 0.5}} {
		r, ok := h.Rates(now, tc.window, WholeTarget("a"))
		if hr, known := r.HitRate(); !ok || !known || !near(hr, tc.want) {
			t.Errorf("window %v: hit rate %v (ok %v, known %v), want %v", tc.window, hr, ok, known, tc.want)
		}
		// Without prompt_tokens_cached, cached tokens are the prefix hits.
		if !near(r.CachedPerSec, r.PrefixHits/tc.window.Seconds()) {
			t.Errorf("window %v: cached %v/s, hits %v", tc.window, r.CachedPerSec, r.PrefixHits)
		}
	}
}

// TestUnknownCountersStayUnknown: an engine without prefix-cache counters
// has no hit rate (not 0), and one without any cached count has prompt
// tokens that are neither cached nor computed.
func TestUnknownCountersStayUnknown(t *testing.T) {
	h := NewHistory(time.Hour, time.Second)
	for i := range 11 {
		at := t0.Add(time.Duration(i) * time.Second)
		n := float64(i)
		h.Add("bare", at, Scrape{Engines: []EngineStats{{Present: FieldPromptTokens | FieldGenerationTokens, PromptTokens: 100 * n, GenerationTokens: 10 * n}}})
		h.Add("full", at, Scrape{Engines: []EngineStats{counters(0, n, 60)}})
	}
	now := t0.Add(10 * time.Second)
	r, ok := h.Rates(now, time.Minute, WholeTarget("bare"))
	if !ok || !near(r.PromptPerSec, 100) || !near(r.GenPerSec, 10) {
		t.Fatalf("bare rates %+v ok=%v, want 100 prompt/s, 10 gen/s", r, ok)
	}
	if hr, known := r.HitRate(); known || r.PrefixKnown {
		t.Errorf("bare: hit rate %v known, want unknown", hr)
	}
	if r.CachedKnown || r.CachedPerSec != 0 || r.ComputedPerSec != 0 {
		t.Errorf("bare: cached %v computed %v known %v; want both unknown", r.CachedPerSec, r.ComputedPerSec, r.CachedKnown)
	}
	for _, p := range h.Series(time.Second, WholeTarget("bare")) {
		if p.CachedKnown {
			t.Errorf("bare: step %v has a known cached count", p.At)
		}
	}

	// Together: the hit rate and the cached/computed split are the full
	// engine's; the bare engine's prompt tokens count in the prompt total only.
	r, _ = h.Rates(now, time.Minute, WholeTarget("bare"), WholeTarget("full"))
	if hr, known := r.HitRate(); !known || !near(hr, 0.6) {
		t.Errorf("mixed: hit rate %v known %v, want 0.6", hr, known)
	}
	if !r.CachedKnown || !near(r.PromptPerSec, 200) || !near(r.CachedPerSec, 60) || !near(r.ComputedPerSec, 40) {
		t.Errorf("mixed: %+v, want prompt 200, cached 60, computed 40", r)
	}

	// A server with counters but prefix caching off reports real zeros.
	h.Add("off", t0, Scrape{Engines: []EngineStats{counters(0, 0, 0)}})
	h.Add("off", t0.Add(time.Second), Scrape{Engines: []EngineStats{counters(0, 1, 0)}})
	r, _ = h.Rates(t0.Add(time.Second), time.Minute, WholeTarget("off"))
	if hr, known := r.HitRate(); !known || hr != 0 || !r.CachedKnown {
		t.Errorf("prefix caching off: hit rate %v known %v, cached known %v; want a known 0", hr, known, r.CachedKnown)
	}
}

func TestReportedHitRate(t *testing.T) {
	h := NewHistory(time.Hour, time.Second)
	v0 := func(rate float64) Scrape {
		return Scrape{Engines: []EngineStats{{Present: LoadFields | FieldReportedHitRate, ReportedHitRate: rate}}}
	}
	h.Add("a", t0, v0(0.2))
	h.Add("a", t0.Add(time.Second), v0(0.4))
	h.Add("b", t0.Add(time.Second), v0(0.8))
	h.Add("c", t0.Add(time.Second), Scrape{Engines: []EngineStats{{Present: LoadFields}}})
	now := t0.Add(2 * time.Second)
	if r, ok := h.ReportedHitRate(now, time.Minute, WholeTarget("a")); !ok || !near(r, 0.4) {
		t.Errorf("a: %v ok=%v, want its latest 0.4", r, ok)
	}
	if r, ok := h.ReportedHitRate(now, time.Minute, WholeTarget("a"), WholeTarget("b"), WholeTarget("c")); !ok || !near(r, 0.6) {
		t.Errorf("a, b, c: %v ok=%v, want the mean 0.6 of those reporting", r, ok)
	}
	if r, ok := h.ReportedHitRate(now, time.Minute, WholeTarget("c")); ok {
		t.Errorf("c reports no hit rate, got %v", r)
	}
	if r, ok := h.ReportedHitRate(now.Add(time.Hour), time.Minute, WholeTarget("a")); ok {
		t.Errorf("a stale sample counted: %v", r)
	}
}

func TestHistoryMemoryIsBounded(t *testing.T) {
	h := NewHistory(time.Hour, time.Second)
	if h.Capacity() != 3601 {
		t.Fatalf("capacity %d, want 3601 samples for one hour at 1 s", h.Capacity())
	}
	const added = 10000
	for i := range added {
		h.Add("a", t0.Add(time.Duration(i)*time.Second), Scrape{Engines: []EngineStats{counters(0, float64(i), 50)}})
	}
	ring := h.series[Source{Target: "a", Engine: 0}]
	if len(ring.samples) != h.Capacity() || cap(ring.samples) != h.Capacity() {
		t.Fatalf("ring holds %d samples in %d slots, want %d", len(ring.samples), cap(ring.samples), h.Capacity())
	}
	points := h.Series(time.Second, WholeTarget("a"))
	if len(points) != h.Capacity()-1 {
		t.Fatalf("%d points, want %d", len(points), h.Capacity()-1)
	}
	if first := t0.Add(time.Duration(added-h.Capacity()+1) * time.Second); !points[0].At.Equal(first) {
		t.Errorf("oldest point at %v, want %v", points[0].At, first)
	}
	if last := points[len(points)-1]; !last.At.Equal(t0.Add((added-1)*time.Second)) || !near(last.PromptPerSec, 100) {
		t.Errorf("newest point %+v", last)
	}
}

func TestSeriesAggregatesTargetsPerStep(t *testing.T) {
	h := NewHistory(time.Hour, time.Second)
	for i := range 11 {
		at := t0.Add(time.Duration(i) * time.Second)
		n := float64(i)
		h.Add("a", at, Scrape{Engines: []EngineStats{counters(0, n, 60), counters(1, 2*n, 60)}})
		h.Add("b", at, Scrape{Engines: []EngineStats{counters(0, n, 100)}})
	}
	fleet := []Source{WholeTarget("a"), WholeTarget("b"), {Target: "a", Engine: 1}} // overlap must not double count
	points := h.Series(5*time.Second, fleet...)
	// Intervals ending at 1..4 s, 5..9 s and 10 s fall in steps 0, 5 and 10.
	if len(points) != 3 {
		t.Fatalf("%d points, want 3: %+v", len(points), points)
	}
	for i, p := range points {
		if !p.At.Equal(t0.Add(time.Duration(5*i) * time.Second)) {
			t.Errorf("point %d at %v", i, p.At)
		}
		// a/0: 100 prompt, 60 cached; a/1: 200, 120; b/0: 100, 100.
		if !near(p.PromptPerSec, 400) || !near(p.CachedPerSec, 280) || !near(p.ComputedPerSec, 120) || !near(p.GenPerSec, 40) {
			t.Errorf("point %d: %+v", i, p)
		}
	}
	r, _ := h.Rates(t0.Add(10*time.Second), time.Minute, Source{Target: "a", Engine: 1})
	if !near(r.PromptPerSec, 200) {
		t.Errorf("engine a/1 prompt rate %v, want 200", r.PromptPerSec)
	}

	h.Forget("a")
	if r, _ := h.Rates(t0.Add(10*time.Second), time.Minute, fleet...); !near(r.PromptPerSec, 100) {
		t.Errorf("after Forget(a), fleet prompt rate %v, want b's 100", r.PromptPerSec)
	}
}

func TestHistoryIgnoresOutOfOrderSamples(t *testing.T) {
	h := NewHistory(time.Hour, time.Second)
	h.Add("a", t0, Scrape{Engines: []EngineStats{counters(0, 0, 0)}})
	h.Add("a", t0.Add(2*time.Second), Scrape{Engines: []EngineStats{counters(0, 2, 0)}})
	h.Add("a", t0.Add(time.Second), Scrape{Engines: []EngineStats{counters(0, 100, 0)}})   // late, ignored
	h.Add("a", t0.Add(2*time.Second), Scrape{Engines: []EngineStats{counters(0, 100, 0)}}) // same time, ignored
	r, _ := h.Rates(t0.Add(2*time.Second), time.Minute, WholeTarget("a"))
	if !near(r.PromptPerSec, 100) {
		t.Errorf("prompt rate %v, want 100", r.PromptPerSec)
	}
}

// A server listing every rank it may (a garbage /metrics can, under its
// size limit) costs its history a sample per rank, not an hour's ring each:
// rings grow with the samples they keep.
func TestHistoryGrowsWithSamplesNotAhead(t *testing.T) {
	var body strings.Builder
	for rank := range MaxEngines {
		fmt.Fprintf(&body, "vllm:num_requests_running{engine=\"%d\"} 0\n", rank)
	}
	s, err := Parse(strings.NewReader(body.String()))
	if err != nil || len(s.Engines) != MaxEngines {
		t.Fatalf("%d ranks: %d engines parsed, %v", MaxEngines, len(s.Engines), err)
	}
	h := NewHistory(time.Hour, time.Second)
	h.Add("127.0.0.1:8000", t0, s)
	h.Add("127.0.0.1:8000", t0.Add(time.Second), s)
	room := 0
	for _, ring := range h.series {
		room += cap(ring.samples)
	}
	if len(h.series) != MaxEngines || room > 4*MaxEngines {
		t.Errorf("two scrapes of %d ranks: %d rings with room for %d samples, want %d rings and room for a few samples each (an hour is %d)",
			MaxEngines, len(h.series), room, MaxEngines, h.Capacity())
	}
}

// prefixSample is one engine's prefix-cache counters; the counters named
// in created carry that creation time.
func prefixSample(queries, hits float64) EngineStats {
	return EngineStats{Present: LoadFields | PrefixFields, PrefixQueries: queries, PrefixHits: hits}
}

// withCreated gives e's prefix-cache counters a creation time.
func withCreated(e EngineStats, at float64) EngineStats {
	for _, f := range []Field{FieldPrefixQueries, FieldPrefixHits} {
		e.created[bits.TrailingZeros32(uint32(f))] = at
	}
	return e
}

// A counter that appears, or starts again, counts from zero; one present
// at the first scrape counts from there.
func TestCountersThatAppearCountFromZero(t *testing.T) {
	gauges := EngineStats{Present: LoadFields}
	cases := []struct {
		name    string
		scrapes []Scrape
		// the engine's own counts over the scrapes after the first
		queries, hits float64
	}{{
		name:    "series created at first use",
		scrapes: []Scrape{{Engines: []EngineStats{gauges}}, {Engines: []EngineStats{prefixSample(8000, 0)}}, {Engines: []EngineStats{prefixSample(16400, 8000)}}},
		queries: 16400, hits: 8000,
	}, {
		name: "restart, then series created at first use",
		scrapes: []Scrape{{Engines: []EngineStats{prefixSample(1000, 600)}}, {Engines: []EngineStats{prefixSample(2000, 1500)}},
			{Engines: []EngineStats{gauges}}, {Engines: []EngineStats{prefixSample(8000, 0)}}},
		queries: 1000 + 8000, hits: 900,
	}, {
		name: "restart between scrapes: counters went back",
		scrapes: []Scrape{{Engines: []EngineStats{prefixSample(10000, 6000)}}, {Engines: []EngineStats{prefixSample(8000, 0)}},
			{Engines: []EngineStats{prefixSample(16400, 8000)}}},
		queries: 16400, hits: 8000,
	}, {
		name:    "restart between scrapes: one counter went back, the other did not",
		scrapes: []Scrape{{Engines: []EngineStats{prefixSample(10000, 500)}}, {Engines: []EngineStats{prefixSample(8000, 600)}}},
		queries: 8000, hits: 600,
	}, {
		name: "restart between scrapes, counters past their old values: _created changed",
		scrapes: []Scrape{{Engines: []EngineStats{withCreated(prefixSample(1000, 0), 100)}},
			{Engines: []EngineStats{withCreated(prefixSample(16400, 8000), 200)}}},
		queries: 16400, hits: 8000,
	}, {
		name: "restart between scrapes, counters past their old values: process start changed",
		scrapes: []Scrape{{ProcessStart: 100, Engines: []EngineStats{prefixSample(1000, 0)}},
			{ProcessStart: 200, Engines: []EngineStats{prefixSample(16400, 8000)}}},
		queries: 16400, hits: 8000,
	}, {
		name: "same process and series: the difference",
		scrapes: []Scrape{{ProcessStart: 100, Engines: []EngineStats{withCreated(prefixSample(1000, 0), 100)}},
			{ProcessStart: 100, Engines: []EngineStats{withCreated(prefixSample(16400, 8000), 100)}}},
		queries: 15400, hits: 8000,
	}, {
		name:    "present at the first scrape: counted from that value",
		scrapes: []Scrape{{Engines: []EngineStats{prefixSample(8000, 0)}}, {Engines: []EngineStats{prefixSample(16400, 8000)}}},
		queries: 8400, hits: 8000,
	}, {
		name: "an engine the target's previous scrape did not list",
		scrapes: []Scrape{{Engines: []EngineStats{gauges}},
			{Engines: []EngineStats{gauges, {Engine: 1, Present: PrefixFields, PrefixQueries: 8000}}}},
		queries: 8000, hits: 0,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHistory(time.Hour, time.Second)
			for i, s := range tc.scrapes {
				h.Add("a", t0.Add(time.Duration(i)*time.Second), s)
			}
			r, ok := h.Rates(t0.Add(time.Hour), 2*time.Hour, WholeTarget("a"))
			if !ok || !r.PrefixKnown || r.PrefixQueries != tc.queries || r.PrefixHits != tc.hits {
				t.Errorf("queries %v, hits %v (ok %v, known %v); the engine counted %v, %v", r.PrefixQueries, r.PrefixHits, ok, r.PrefixKnown, tc.queries, tc.hits)
			}
		})
	}
}

// A replica with prefix-cache counters but no query in the window has an
// unknown hit rate, not 0.
func TestIdleHitRateIsUnknown(t *testing.T) {
	h := NewHistory(time.Hour, time.Second)
	h.Add("a", t0, Scrape{Engines: []EngineStats{prefixSample(8000, 6000)}})
	h.Add("a", t0.Add(time.Second), Scrape{Engines: []EngineStats{prefixSample(8000, 6000)}})
	r, ok := h.Rates(t0.Add(time.Second), time.Minute, WholeTarget("a"))
	if !ok || !r.PrefixKnown {
		t.Fatalf("rates ok %v, prefix counters known %v", ok, r.PrefixKnown)
	}
	if hr, known := r.HitRate(); known {
		t.Errorf("hit rate %v known without a query", hr)
	}
}
