package fleet

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/health"
	"github.com/lmwarden/caddy-warden/metricsfeed"
	"github.com/lmwarden/caddy-warden/selection"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func servers(addrs ...string) []selection.Replica {
	out := make([]selection.Replica, len(addrs))
	for i, a := range addrs {
		out[i] = selection.Replica{ID: a, Address: a}
	}
	return out
}

// scrape is one engine's /metrics with running requests and token counters.
func scrape(running int, prompt, cached float64) metricsfeed.Scrape {
	return metricsfeed.Scrape{Engines: []metricsfeed.EngineStats{{
		Running: running, KVUsage: 0.1, PromptTokens: prompt, PromptTokensCached: cached,
		PrefixQueries: prompt, PrefixHits: cached,
		Present: metricsfeed.LoadFields | metricsfeed.FieldPromptTokens | metricsfeed.FieldPromptTokensCached |
			metricsfeed.FieldPrefixQueries | metricsfeed.FieldPrefixHits,
	}}}
}

// observe feeds every server a healthy scrape and probe at at.
func observe(m *Model, at time.Time, addrs ...string) {
	for _, a := range addrs {
		m.ObserveScrape(a, at, scrape(0, 0, 0), nil)
		m.ObserveHealth(a, at, nil)
	}
}

func TestPreparedPlanChangesNothingUntilApplied(t *testing.T) {
	m := New("m", time.Second, t0, nil)
	first := m.Prepare(Spec{Replicas: servers("a:1", "b:1")})
	m.Apply(first)
	observe(m, t0, "a:1", "b:1")
	next := m.Prepare(Spec{Replicas: servers("a:1", "c:1"), Routing: selection.Config{SpillThreshold: 9}})
	if m.Applied() != first {
		t.Fatal("Prepare applied its plan")
	}
	m.ObserveScrape("c:1", t0, scrape(0, 0, 0), nil)
	if _, ok := m.Health("c:1", t0); ok {
		t.Fatal("a server only an unapplied plan lists is tracked")
	}
	if got := next.View().Status().Replicas[1].Load; got.Known {
		t.Fatal("a server only an unapplied plan lists took metrics")
	}
	m.Apply(next)
	observe(m, t0.Add(time.Second), "a:1", "c:1")
	if h, ok := m.Health("c:1", t0.Add(time.Second)); !ok || !h.Healthy {
		t.Fatalf("applied plan's new server: %+v tracked=%v", h, ok)
	}
	if h, ok := m.Health("b:1", t0.Add(time.Second)); !ok || !h.Healthy {
		t.Fatalf("a server that left lost its state before Retain: %+v tracked=%v", h, ok)
	}
	m.Retain(next.Addresses())
	if _, ok := m.Health("b:1", t0); ok {
		t.Fatal("a server that left is still tracked after Retain")
	}
}

// A config whose start fails hands back to the running one: applying the
// previous plan again finds its servers' health and history as they were.
func TestReapplyingThePreviousPlanKeepsItsServers(t *testing.T) {
	m := New("m", time.Second, t0, nil)
	running := m.Prepare(Spec{Replicas: servers("a:1", "b:1"), Routing: selection.Config{Affinity: true}})
	m.Apply(running)
	for s := range 3 {
		at := t0.Add(time.Duration(s) * time.Second)
		m.ObserveScrape("a:1", at, scrape(0, 100*float64(s), 50*float64(s)), nil)
		m.ObserveScrape("b:1", at, scrape(0, 100*float64(s), 50*float64(s)), nil)
		m.ObserveHealth("a:1", at, nil)
		m.ObserveHealth("b:1", at, nil)
	}
	m.Apply(m.Prepare(Spec{Replicas: servers("a:1")}))
	m.Apply(running)
	now := t0.Add(2 * time.Second)
	m.Tick(now)
	if h, _ := m.Health("b:1", now); !h.Healthy {
		t.Fatalf("b:1 after the failed start: %+v", h)
	}
	if _, ok := m.ReplicaRates(servers("b:1")[0], now, time.Minute); !ok {
		t.Fatal("b:1's history lost by a plan that never ran for good")
	}
	if st := running.View().Status(); !st.Replicas[1].Healthy {
		t.Fatal("b:1 unusable for routing after the failed start")
	}
}

func TestMetricsThatStopTurnAServerUnhealthy(t *testing.T) {
	var changes []string
	m := New("m", time.Second, t0, func(addr string, _, new health.State) {
		changes = append(changes, addr+" "+string(new.Reason))
	})
	p := m.Prepare(Spec{Replicas: servers("a:1", "b:1"), Routing: selection.Config{Affinity: true}})
	m.Apply(p)
	for s := range 3 {
		observe(m, t0.Add(time.Duration(s)*time.Second), "a:1", "b:1")
	}
	for s := 3; s < 8; s++ { // b:1 goes silent
		at := t0.Add(time.Duration(s) * time.Second)
		observe(m, at, "a:1")
		m.Tick(at)
	}
	now := t0.Add(8 * time.Second)
	if h, _ := m.Health("b:1", now); h.Healthy || h.Reason != health.ReasonStaleMetrics {
		t.Fatalf("silent server: %+v", h)
	}
	for c := range 4 {
		d := p.View().Pick(selection.Request{Key: string(rune('k' + c)), Now: now})
		if rep, _ := d.Replica(); rep.ID != "a:1" {
			t.Fatalf("session placed on %s, whose metrics stopped", rep.ID)
		}
	}
	if len(changes) == 0 || changes[len(changes)-1] != "b:1 "+string(health.ReasonStaleMetrics) {
		t.Fatalf("health changes heard: %v", changes)
	}
}

// Right after a start, the first scrape of one server must not make the
// others unusable before their own first check: a restart's restored pins
// would all move.
func TestServersNotCheckedYetKeepTheirPins(t *testing.T) {
	m := New("m", time.Second, t0, nil)
	p := m.Prepare(Spec{Replicas: servers("a:1", "b:1"), Routing: selection.Config{Affinity: true}})
	m.Apply(p)
	p.View().Restore([]selection.Pin{{Key: selection.HashKey("conv"), Replica: "b:1", LastUse: t0.UnixNano()}}, t0)
	observe(m, t0, "a:1") // b:1 not answered yet
	m.ObserveScrape("b:1", t0, scrape(0, 0, 0), nil)
	m.Tick(t0) // b:1: metrics but no /health answer yet
	d := p.View().Pick(selection.Request{Key: "conv", Now: t0})
	d.Release()
	if rep, _ := d.Replica(); rep.ID != "b:1" || d.Outcome != selection.Sticky {
		t.Fatalf("restored conversation: %v on %s before b:1's first check", d.Outcome, rep.ID)
	}
	// A failed check does move it.
	m.ObserveHealth("b:1", t0.Add(time.Second), errors.New("503"))
	d = p.View().Pick(selection.Request{Key: "conv", Now: t0.Add(time.Second)})
	d.Release()
	if rep, _ := d.Replica(); rep.ID != "a:1" || d.Outcome != selection.Replaced {
		t.Fatalf("after b:1 failed its check: %v on %s", d.Outcome, rep.ID)
	}
}

func TestFailedScrapeMakesLoadUnknown(t *testing.T) {
	m := New("m", time.Second, t0, nil)
	p := m.Prepare(Spec{Replicas: servers("a:1", "b:1"), Routing: selection.Config{Affinity: true}})
	m.Apply(p)
	observe(m, t0, "a:1", "b:1")
	m.ObserveScrape("a:1", t0.Add(time.Second), metricsfeed.Scrape{}, errors.New("garbage"))
	if l := p.View().Status().Replicas[0].Load; l.Known {
		t.Fatalf("load after a failed scrape: %+v", l)
	}
	d := p.View().Pick(selection.Request{Key: "s", Now: t0.Add(time.Second)})
	if rep, _ := d.Replica(); rep.ID != "b:1" {
		t.Fatalf("placed on %s, whose load is unknown", rep.ID)
	}
}

// hitRate is r's prefix hit rate, -1 when unknown.
func hitRate(r metricsfeed.Rates) float64 {
	if v, ok := r.HitRate(); ok {
		return v
	}
	return -1
}

func TestRatesFollowTheAppliedServers(t *testing.T) {
	m := New("m", time.Second, t0, nil)
	m.Apply(m.Prepare(Spec{Replicas: servers("a:1", "b:1")}))
	for s := range 11 {
		at := t0.Add(time.Duration(s) * time.Second)
		m.ObserveScrape("a:1", at, scrape(0, 100*float64(s), 50*float64(s)), nil)
		m.ObserveScrape("b:1", at, scrape(0, 100*float64(s), 100*float64(s)), nil)
	}
	now := t0.Add(10 * time.Second)
	if r, ok := m.Rates(now, time.Minute); !ok || r.PromptPerSec != 200 || hitRate(r) != 0.75 {
		t.Fatalf("fleet rates %+v ok=%v, want 200 prompt/s at 75%%", r, ok)
	}
	only := m.Prepare(Spec{Replicas: servers("a:1")})
	m.Apply(only)
	m.Retain(only.Addresses())
	if r, ok := m.Rates(now, time.Minute); !ok || r.PromptPerSec != 100 || hitRate(r) != 0.5 {
		t.Fatalf("rates after b:1 left: %+v ok=%v", r, ok)
	}
	if _, ok := m.ReplicaRates(servers("b:1")[0], now, time.Minute); ok {
		t.Fatal("history of a server that left is kept")
	}
}

func TestRanksReadTheirOwnEngine(t *testing.T) {
	s := metricsfeed.Scrape{Engines: []metricsfeed.EngineStats{
		{Engine: 0, Running: 1, KVUsage: 0.2, Present: metricsfeed.LoadFields},
		{Engine: 1, Running: 7, KVUsage: 0.6, Present: metricsfeed.LoadFields},
	}}
	rank1 := selection.Replica{ID: "x:1#1", Address: "x:1", Rank: 1, SetsRank: true}
	if l := replicaLoad(rank1, s); !l.Known || l.Running != 7 || l.KVUsage != 0.6 {
		t.Fatalf("rank 1: %+v", l)
	}
	whole := selection.Replica{ID: "x:1", Address: "x:1"}
	if l := replicaLoad(whole, s); !l.Known || l.Running != 8 || l.KVUsage != 0.4 {
		t.Fatalf("whole server: %+v", l)
	}
	s.Engines[1].Present = metricsfeed.FieldRunning
	if l := replicaLoad(whole, s); l.Known {
		t.Fatalf("an engine without its load gauges: %+v", l)
	}
}

// Written, what rehoming reads, is the KV tokens the engines wrote: prompt
// tokens not served from cache plus generated ones; 0 without those series.
func TestLoadCountsKVWrites(t *testing.T) {
	s := metricsfeed.Scrape{Engines: []metricsfeed.EngineStats{
		{Engine: 0, PrefixQueries: 1000, PrefixHits: 600, GenerationTokens: 50, Present: metricsfeed.LoadFields |
			metricsfeed.FieldPrefixQueries | metricsfeed.FieldPrefixHits | metricsfeed.FieldGenerationTokens},
		{Engine: 1, PrefixQueries: 500, PrefixHits: 100, GenerationTokens: 20, Present: metricsfeed.LoadFields |
			metricsfeed.FieldPrefixQueries | metricsfeed.FieldPrefixHits | metricsfeed.FieldGenerationTokens},
	}}
	whole := selection.Replica{ID: "x:1", Address: "x:1"}
	if l := replicaLoad(whole, s); l.Written != 450+420 {
		t.Fatalf("written %v, want 870", l.Written)
	}
	rank1 := selection.Replica{ID: "x:1#1", Address: "x:1", Rank: 1, SetsRank: true}
	if l := replicaLoad(rank1, s); l.Written != 420 {
		t.Fatalf("rank 1 written %v, want 420", l.Written)
	}
	s.Engines[1].Present = metricsfeed.LoadFields
	s.Engines[0].Present = metricsfeed.LoadFields
	if l := replicaLoad(whole, s); l.Written != 0 {
		t.Fatalf("no counters: written %v, want 0", l.Written)
	}
}

// A reload that shortens metrics_interval judges the servers already
// tracked by it: their metrics are stale after three new intervals.
func TestANewIntervalJudgesTheMetricsAge(t *testing.T) {
	m := New("m", 5*time.Second, t0, nil)
	m.Apply(m.Prepare(Spec{Replicas: servers("a:1"), MetricsInterval: 5 * time.Second}))
	observe(m, t0, "a:1")
	m.Apply(m.Prepare(Spec{Replicas: servers("a:1"), MetricsInterval: time.Second}))
	m.Tick(t0.Add(4 * time.Second))
	m.Tick(t0.Add(5 * time.Second))
	if h, _ := m.Health("a:1", t0.Add(5*time.Second)); h.Healthy || h.Reason != health.ReasonStaleMetrics {
		t.Errorf("no scrape for 5 s at a 1 s interval: %+v, want stale metrics", h)
	}
}

// After this process was stalled (a starved machine), the scrapes that
// waited to be reported come in one after the other: the first one, of a
// server, re-evaluates every server, and must not find the others stale
// and move their conversations a few milliseconds before their own
// reports.
func TestAStallMovesNoConversation(t *testing.T) {
	var changes []string
	m := New("m", time.Second, t0, func(addr string, _, new health.State) {
		changes = append(changes, addr+" "+string(new.Reason))
	})
	p := m.Prepare(Spec{Replicas: servers("a:1", "b:1"), Routing: selection.Config{Affinity: true}})
	m.Apply(p)
	observe(m, t0, "a:1", "b:1")
	homes := map[string]string{}
	for c := range 8 {
		key := fmt.Sprint("conv-", c)
		rep, _ := p.View().Pick(selection.Request{Key: key, Now: t0}).Replica()
		homes[key] = rep.ID
	}
	if !slices.Contains(slices.Collect(maps.Values(homes)), "b:1") {
		t.Fatalf("no conversation placed on b:1: %v", homes)
	}
	heard := len(changes)

	resumed := t0.Add(5 * time.Second)
	observe(m, resumed, "a:1") // b:1's report is a few milliseconds behind
	m.Tick(resumed)
	for key, home := range homes {
		if d := p.View().Pick(selection.Request{Key: key, Now: resumed}); d.Outcome != selection.Sticky {
			rep, _ := d.Replica()
			t.Errorf("%s went from %s to %s (%v) after the stall", key, home, rep.ID, d.Outcome)
		}
	}
	observe(m, resumed.Add(5*time.Millisecond), "b:1")
	if len(changes) != heard {
		t.Errorf("health changes after the stall: %v", changes[heard:])
	}
}
