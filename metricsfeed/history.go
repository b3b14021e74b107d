package metricsfeed

import (
	"maps"
	"slices"
	"sync"
	"time"
)

// History keeps, per target and engine, the token counters of recent scrapes
// in a ring of bounded size, and derives rates from them. Its memory is
// bounded by the ring capacity times the number of (target, engine) pairs
// (at most MaxEngines a target), and grows with the samples kept, not ahead
// of them; Forget drops a target. It never reads the clock: callers pass sample and query times.
// Its methods are safe for concurrent use.
type History struct {
	capacity int

	mu     sync.Mutex
	series map[Source]*counterRing
	// lastAdd is when each target's latest scrape was taken: an engine
	// first seen after it did not exist then.
	lastAdd map[string]time.Time
}

// Source selects counters in a History: one engine of a target, or all of
// its engines when Engine is AllEngines.
type Source struct {
	Target string
	Engine int
}

// AllEngines in a Source selects every engine of the target.
const AllEngines = -1

// WholeTarget selects every engine of a target.
func WholeTarget(target string) Source { return Source{Target: target, Engine: AllEngines} }

// Rates are token rates and prefix-cache deltas over a window. A counter
// that appears or starts again (a restarted server) counts from zero (see
// pairIncrease), so rates are never negative.
//
// A counter an engine does not publish is unknown, not zero. An engine that
// publishes neither prompt_tokens_cached nor prefix-cache hits cannot split
// its prompt tokens: they count in PromptPerSec but in neither CachedPerSec
// nor ComputedPerSec, and CachedKnown is false when no selected engine could
// split them. PrefixKnown is false when no selected engine published both
// prefix-cache counters.
type Rates struct {
	PromptPerSec   float64 `json:"prompt_tokens_per_s"`
	CachedPerSec   float64 `json:"cached_tokens_per_s"`   // prompt_tokens_cached, else prefix-cache hits
	ComputedPerSec float64 `json:"computed_tokens_per_s"` // prompt minus cached
	GenPerSec      float64 `json:"generation_tokens_per_s"`
	PrefixQueries  float64 `json:"prefix_cache_queries"` // increase over the window, tokens
	PrefixHits     float64 `json:"prefix_cache_hits"`    // increase over the window, tokens
	// HostHits is the prompt tokens a host-memory KV tier served over the
	// window (vllm:external_prefix_cache_hits); HostKnown whether an engine
	// published that counter.
	HostHits    float64 `json:"host_cache_hits"`
	CachedKnown bool    `json:"cached_known"`
	PrefixKnown bool    `json:"prefix_known"`
	HostKnown   bool    `json:"host_known"`
}

// HitRate is the prefix-cache hit rate over the window (hits / queries).
// ok is false when it is unknown, which is not 0: no engine published the
// prefix-cache counters, or there was no query in the window.
func (r Rates) HitRate() (rate float64, ok bool) {
	if !r.PrefixKnown || r.PrefixQueries <= 0 {
		return 0, false
	}
	return r.PrefixHits / r.PrefixQueries, true
}

// HostHitRate is the share of the prompt tokens queried over the window
// that a host-memory KV tier served, beside HitRate's GPU share; ok is false
// without a tier's counter or without a query.
func (r Rates) HostHitRate() (rate float64, ok bool) {
	if !r.HostKnown || !r.PrefixKnown || r.PrefixQueries <= 0 {
		return 0, false
	}
	return r.HostHits / r.PrefixQueries, true
}

// RatePoint is one step of a rate time series; At is the start of the step.
type RatePoint struct {
	At             time.Time `json:"at"`
	PromptPerSec   float64   `json:"prompt_tokens_per_s"`
	CachedPerSec   float64   `json:"cached_tokens_per_s"`
	ComputedPerSec float64   `json:"computed_tokens_per_s"`
	GenPerSec      float64   `json:"generation_tokens_per_s"`
	// CachedKnown is false when no engine could split the step's prompt
	// tokens into cached and computed (see Rates).
	CachedKnown bool `json:"cached_known"`
}

// NewHistory returns a History whose rings hold enough samples to cover
// retention at one sample per interval (e.g. one hour at one second).
func NewHistory(retention, interval time.Duration) *History {
	capacity := 2
	if interval > 0 {
		capacity = max(capacity, int((retention+interval-1)/interval)+1)
	}
	return &History{capacity: capacity, series: map[Source]*counterRing{}, lastAdd: map[string]time.Time{}}
}

// Capacity is the number of samples kept per target and engine.
func (h *History) Capacity() int { return h.capacity }

// Add records the counters of a successful scrape of target taken at at.
// A sample not later than the engine's previous one is ignored.
func (h *History) Add(target string, at time.Time, s Scrape) {
	h.mu.Lock()
	defer h.mu.Unlock()
	last, seen := h.lastAdd[target]
	if !at.After(last) {
		return
	}
	h.lastAdd[target] = at
	for _, e := range s.Engines {
		key := Source{Target: target, Engine: e.Engine}
		ring := h.series[key]
		if ring == nil {
			ring = &counterRing{limit: h.capacity}
			h.series[key] = ring
			if seen {
				// The target's previous scrape had no such engine: its
				// counters started since, from zero.
				ring.add(counterSample{at: last})
			}
		}
		sample := counterSample{at: at, present: e.Present, processStart: s.ProcessStart, reportedHitRate: e.ReportedHitRate, counters: [numCounters]float64{
			prefixQueries:      e.PrefixQueries,
			prefixHits:         e.PrefixHits,
			promptTokens:       e.PromptTokens,
			promptTokensCached: e.PromptTokensCached,
			generationTokens:   e.GenerationTokens,
			externalHits:       e.ExternalHits,
		}}
		for i, f := range counterFields {
			sample.created[i] = e.Created(f)
		}
		ring.add(sample)
	}
}

// Forget drops every sample of a target, e.g. when it leaves the config.
func (h *History) Forget(target string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	maps.DeleteFunc(h.series, func(k Source, _ *counterRing) bool { return k.Target == target })
	delete(h.lastAdd, target)
}

// Rates sums the rates of the selected engines over the samples taken in
// [now-window, now]. Each engine's rate is its counter increase divided by
// the time between its first and last sample in the window. It reports false
// when no selected engine has two samples in the window.
func (h *History) Rates(now time.Time, window time.Duration, sources ...Source) (Rates, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	from := now.Add(-window)
	var perSec, raw increase
	found := false
	for _, ring := range h.selectLocked(sources) {
		var sum increase
		var span time.Duration
		ring.eachPair(func(prev, cur counterSample) {
			if prev.at.Before(from) || cur.at.After(now) {
				return
			}
			sum.add(pairIncrease(prev, cur))
			span += cur.at.Sub(prev.at)
		})
		if span <= 0 {
			continue
		}
		found = true
		perSec.add(sum.perSecond(span))
		raw.add(sum)
	}
	return Rates{
		PromptPerSec: perSec.prompt, CachedPerSec: perSec.cached, ComputedPerSec: perSec.computed, GenPerSec: perSec.generation,
		PrefixQueries: raw.queries, PrefixHits: raw.hits, HostHits: raw.hostHits,
		CachedKnown: raw.cachedKnown, PrefixKnown: raw.prefixKnown, HostKnown: raw.hostKnown,
	}, found
}

// ReportedHitRate is the mean of the selected engines' own prefix-cache hit
// rates (EngineStats.ReportedHitRate), each engine's latest in [now-window,
// now]. ok is false when no selected engine reported one.
func (h *History) ReportedHitRate(now time.Time, window time.Duration, sources ...Source) (rate float64, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	from := now.Add(-window)
	var sum float64
	n := 0
	for _, ring := range h.selectLocked(sources) {
		for i := len(ring.samples) - 1; i >= 0; i-- {
			s := ring.nth(i)
			if s.at.After(now) {
				continue
			}
			if s.at.Before(from) {
				break
			}
			if s.present&FieldReportedHitRate != 0 {
				sum += s.reportedHitRate
				n++
			}
			break
		}
	}
	if n == 0 {
		return 0, false
	}
	return sum / float64(n), true
}

// Series returns the summed rates of the selected engines per step (aligned
// to multiples of step), oldest first, over everything the History holds.
// Each interval between two samples counts in the step where it ends.
func (h *History) Series(step time.Duration, sources ...Source) []RatePoint {
	if step <= 0 {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	points := map[time.Time]*RatePoint{}
	for _, ring := range h.selectLocked(sources) {
		type bucket struct {
			sum  increase
			span time.Duration
		}
		buckets := map[time.Time]*bucket{}
		ring.eachPair(func(prev, cur counterSample) {
			start := cur.at.Truncate(step)
			b := buckets[start]
			if b == nil {
				b = &bucket{}
				buckets[start] = b
			}
			b.sum.add(pairIncrease(prev, cur))
			b.span += cur.at.Sub(prev.at)
		})
		for start, b := range buckets {
			p := points[start]
			if p == nil {
				p = &RatePoint{At: start}
				points[start] = p
			}
			perSec := b.sum.perSecond(b.span)
			p.PromptPerSec += perSec.prompt
			p.CachedPerSec += perSec.cached
			p.ComputedPerSec += perSec.computed
			p.GenPerSec += perSec.generation
			p.CachedKnown = p.CachedKnown || b.sum.cachedKnown
		}
	}
	series := make([]RatePoint, 0, len(points))
	for _, p := range points {
		series = append(series, *p)
	}
	slices.SortFunc(series, func(a, b RatePoint) int { return a.At.Compare(b.At) })
	return series
}

// selectLocked resolves sources to distinct rings, so that overlapping
// sources do not count an engine twice.
func (h *History) selectLocked(sources []Source) []*counterRing {
	selected := map[Source]*counterRing{}
	for _, src := range sources {
		if src.Engine != AllEngines {
			if ring := h.series[src]; ring != nil {
				selected[src] = ring
			}
			continue
		}
		for key, ring := range h.series {
			if key.Target == src.Target {
				selected[key] = ring
			}
		}
	}
	return slices.Collect(maps.Values(selected))
}

// The counters History keeps, as indexes into counterSample.counters.
const (
	prefixQueries = iota
	prefixHits
	promptTokens
	promptTokensCached
	generationTokens
	externalHits
	numCounters
)

var counterFields = [numCounters]Field{
	prefixQueries:      FieldPrefixQueries,
	prefixHits:         FieldPrefixHits,
	promptTokens:       FieldPromptTokens,
	promptTokensCached: FieldPromptTokensCached,
	generationTokens:   FieldGenerationTokens,
	externalHits:       FieldExternalHits,
}

type counterSample struct {
	at              time.Time
	present         Field
	counters        [numCounters]float64
	created         [numCounters]float64 // EngineStats.Created, 0 when unknown
	processStart    float64              // Scrape.ProcessStart, 0 when unknown
	reportedHitRate float64              // the V0 engine's own gauge, when present has it
}

// counterRing holds the latest samples of one engine, oldest overwritten.
type counterRing struct {
	samples []counterSample // grows to limit, then wraps
	limit   int
	next    int // index of the oldest sample once full
}

func (r *counterRing) add(s counterSample) {
	if n := len(r.samples); n > 0 && !s.at.After(r.nth(n-1).at) {
		return
	}
	if len(r.samples) < r.limit {
		r.samples = append(r.samples, s)
		if len(r.samples) == r.limit && cap(r.samples) > r.limit {
			r.samples = append(make([]counterSample, 0, r.limit), r.samples...) // full: no room past it
		}
		return
	}
	r.samples[r.next] = s
	r.next = (r.next + 1) % len(r.samples)
}

// nth returns the i-th sample in time order.
func (r *counterRing) nth(i int) counterSample {
	return r.samples[(r.next+i)%len(r.samples)]
}

// eachPair calls fn for every two consecutive samples, oldest first.
func (r *counterRing) eachPair(fn func(prev, cur counterSample)) {
	for i := 1; i < len(r.samples); i++ {
		fn(r.nth(i-1), r.nth(i))
	}
}

// increase is the token counts gained between samples. cachedKnown,
// prefixKnown and hostKnown say whether the engine published what
// cached/computed, queries/hits and hostHits are made of.
type increase struct {
	prompt, cached, computed, generation, queries, hits, hostHits float64
	cachedKnown, prefixKnown, hostKnown                           bool
}

func (a *increase) add(b increase) {
	a.prompt += b.prompt
	a.cached += b.cached
	a.computed += b.computed
	a.generation += b.generation
	a.queries += b.queries
	a.hits += b.hits
	a.hostHits += b.hostHits
	a.cachedKnown = a.cachedKnown || b.cachedKnown
	a.prefixKnown = a.prefixKnown || b.prefixKnown
	a.hostKnown = a.hostKnown || b.hostKnown
}

func (a increase) perSecond(span time.Duration) increase {
	secs := span.Seconds()
	return increase{
		prompt:      a.prompt / secs,
		cached:      a.cached / secs,
		computed:    a.computed / secs,
		generation:  a.generation / secs,
		queries:     a.queries / secs,
		hits:        a.hits / secs,
		hostHits:    a.hostHits / secs,
		cachedKnown: a.cachedKnown,
		prefixKnown: a.prefixKnown,
		hostKnown:   a.hostKnown,
	}
}

// pairIncrease is what an engine's counters gained from prev to cur.
//
// A counter counts from zero, its whole value at cur being the gain, when
// the exposition says it is new: it was absent at prev (a server lists
// every series it has, so one created at first use, or after a restart,
// appeared since), or the engine restarted in between (a counter went
// back, a counter's _created time or the process start time changed).
// Otherwise the gain is the difference. This is Prometheus' increase() with
// created timestamps; a series present at warden's first scrape counts from
// that first value, as nothing says how much of it is recent. A counter
// missing from cur gained nothing. Without a cached count
// (prompt_tokens_cached, else prefix-cache hits) the prompt tokens cannot
// be split, and count as neither cached nor computed.
func pairIncrease(prev, cur counterSample) increase {
	restarted := prev.processStart != 0 && cur.processStart != 0 && prev.processStart != cur.processStart
	for i, f := range counterFields {
		if prev.present&cur.present&f == 0 {
			continue
		}
		recreated := prev.created[i] != 0 && cur.created[i] != 0 && prev.created[i] != cur.created[i]
		restarted = restarted || recreated || cur.counters[i] < prev.counters[i]
	}
	gained := func(i int) float64 {
		f := counterFields[i]
		switch {
		case cur.present&f == 0:
			return 0
		case prev.present&f == 0 || restarted:
			return cur.counters[i]
		}
		return cur.counters[i] - prev.counters[i]
	}
	inc := increase{
		prompt:      gained(promptTokens),
		generation:  gained(generationTokens),
		queries:     gained(prefixQueries),
		hits:        gained(prefixHits),
		hostHits:    gained(externalHits),
		prefixKnown: cur.present&PrefixFields == PrefixFields,
		hostKnown:   cur.present&FieldExternalHits != 0,
	}
	switch {
	case cur.present&FieldPromptTokensCached != 0:
		inc.cached, inc.cachedKnown = gained(promptTokensCached), true
	case cur.present&FieldPrefixHits != 0:
		inc.cached, inc.cachedKnown = inc.hits, true
	default:
		return inc
	}
	inc.computed = max(inc.prompt-inc.cached, 0)
	return inc
}
