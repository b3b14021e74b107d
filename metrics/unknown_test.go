package metrics

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/fleet"
	"github.com/lmwarden/caddy-warden/livemodel"
	"github.com/lmwarden/caddy-warden/metricsfeed"
	"github.com/lmwarden/caddy-warden/panel"
	"github.com/lmwarden/caddy-warden/selection"
)

// bareScrape is a server that publishes token counters but nothing about its
// prefix cache (no prefix-cache counters, no prompt_tokens_cached).
func bareScrape(prompt, generated float64) metricsfeed.Scrape {
	return metricsfeed.Scrape{Engines: []metricsfeed.EngineStats{{
		PromptTokens: prompt, GenerationTokens: generated,
		Present: metricsfeed.LoadFields | metricsfeed.FieldPromptTokens | metricsfeed.FieldGenerationTokens,
	}}}
}

// counterScrape is one engine's scrape with the token counters at the given
// totals.
func counterScrape(prompt, cached, generated float64) metricsfeed.Scrape {
	return metricsfeed.Scrape{Engines: []metricsfeed.EngineStats{{
		PromptTokens: prompt, PromptTokensCached: cached, GenerationTokens: generated,
		PrefixQueries: prompt, PrefixHits: cached,
		Present: metricsfeed.FieldPromptTokens | metricsfeed.FieldPromptTokensCached |
			metricsfeed.FieldGenerationTokens | metricsfeed.FieldPrefixQueries | metricsfeed.FieldPrefixHits,
	}}}
}

// feed scrapes target once a second for secs seconds from t0 at 100
// prompt tokens/s (cachedShare of them cached) and 10 generated tokens/s.
func feed(f *fleet.Model, target string, t0 time.Time, secs int, cachedShare float64) {
	for i := 0; i <= secs; i++ {
		f.ObserveScrape(target, t0.Add(time.Duration(i)*time.Second), counterScrape(100*float64(i), 100*cachedShare*float64(i), 10*float64(i)), nil)
	}
}

// feedBare scrapes target once a second for secs seconds from t0 at 100
// prompt and 10 generated tokens/s.
func feedBare(f *fleet.Model, target string, t0 time.Time, secs int) {
	for i := 0; i <= secs; i++ {
		f.ObserveScrape(target, t0.Add(time.Duration(i)*time.Second), bareScrape(100*float64(i), 10*float64(i)), nil)
	}
}

// liveUnitModel is a model of the given replicas, applied, for the length
// of the test.
func liveUnitModel(t *testing.T, name string, addrs ...string) *livemodel.Load {
	t.Helper()
	var replicas []selection.Replica
	for _, a := range addrs {
		replicas = append(replicas, selection.Replica{ID: a, Address: a})
	}
	m := livemodel.New(name, time.Second, zap.NewNop())
	l := m.Prepare(livemodel.Spec{Fleet: fleet.Spec{Routing: selection.Config{MaxNumSeqs: 32, Affinity: true}, Replicas: replicas}, Logger: zap.NewNop()})
	m.Activate(l, time.Now())
	t.Cleanup(m.Close)
	return l
}

// collected gathers the collector's samples of the model l is a version
// of, by series name and then by the value of label ("" for series without
// it).
func collected(t *testing.T, l *livemodel.Load, label string) map[string]map[string]float64 {
	t.Helper()
	model := l.Model().Name()
	reg := prometheus.NewRegistry()
	Register(reg, func() []*livemodel.Load { return []*livemodel.Load{l} }, zap.NewNop())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			if labelOf(m, "model") != model {
				continue
			}
			if out[mf.GetName()] == nil {
				out[mf.GetName()] = map[string]float64{}
			}
			out[mf.GetName()][labelOf(m, label)] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return out
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// A replica that publishes no prefix-cache counters has an unknown hit rate:
// null in the admin JSON and the panel's, and no gauge sample; the model's
// rate is its other replicas'.
func TestUnknownPrefixHitRateOfOneReplica(t *testing.T) {
	const counted, bare = "127.0.0.1:9", "127.0.0.1:11"
	l := liveUnitModel(t, "unknown-one", counted, bare)
	now := time.Now()
	feed(l.Model().Fleet(), counted, now.Add(-30*time.Second), 30, 0.5)
	feedBare(l.Model().Fleet(), bare, now.Add(-30*time.Second), 30)

	st := panel.Status(l, now)
	var raw struct {
		PrefixHitRate *float64 `json:"prefix_hit_rate"`
		Replicas      []map[string]any
	}
	body, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(body), `"prefix_hit_rate":null`) {
		t.Errorf("admin JSON has no null prefix_hit_rate: %s", body)
	}
	for _, r := range raw.Replicas {
		v, present := r["prefix_hit_rate"]
		switch r["address"] {
		case counted:
			if v != 0.5 {
				t.Errorf("%s: prefix_hit_rate %v, want 0.5", counted, v)
			}
		case bare:
			if !present || v != nil {
				t.Errorf("%s: prefix_hit_rate %v (present %v), want null", bare, v, present)
			}
		}
	}
	if raw.PrefixHitRate == nil || *raw.PrefixHitRate != 0.5 {
		t.Errorf("model prefix_hit_rate %v, want the counted replica's 0.5", fmtRate(raw.PrefixHitRate))
	}

	shown := panel.NewData(now, []*livemodel.Load{l}).Models[0]
	for _, r := range shown.Replicas {
		if r.Address == bare && r.PrefixHitRate != nil {
			t.Errorf("panel: %s prefix hit rate %v, want null", bare, *r.PrefixHitRate)
		}
	}
	// The cached share is the counted replica's: the bare one's prompt
	// tokens cannot be split.
	if shown.Stats.HitShare == nil || *shown.Stats.HitShare != 0.5 {
		t.Errorf("panel hit share %v, want 0.5", fmtRate(shown.Stats.HitShare))
	}

	got := collected(t, l, "replica")
	if _, ok := got["caddy_warden_replica_prefix_cache_hit_ratio"][bare]; ok {
		t.Errorf("hit-ratio gauge sampled for %s, which publishes no prefix-cache counters", bare)
	}
	if v, ok := got["caddy_warden_replica_prefix_cache_hit_ratio"][counted]; !ok || v != 0.5 {
		t.Errorf("hit-ratio gauge of %s: %v (present %v), want 0.5", counted, v, ok)
	}
	if _, ok := got["caddy_warden_replica_kv_cache_usage_ratio"][bare]; !ok {
		t.Errorf("the bare replica's other gauges are missing: %v", got)
	}
}

// When no replica reports anything about its prefix cache, the model's hit
// rate, its cached share and its cached/computed token rates are unknown;
// its generation rate is still known.
func TestUnknownPrefixCacheOfWholeModel(t *testing.T) {
	const bare = "127.0.0.1:11"
	l := liveUnitModel(t, "unknown-all", bare)
	now := time.Now()
	feedBare(l.Model().Fleet(), bare, now.Add(-30*time.Second), 30)

	body, err := json.Marshal(panel.NewData(now, []*livemodel.Load{l}).Models[0])
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		PrefixHitRate any `json:"prefix_hit_rate"`
		Stats         struct {
			HitShare any `json:"hit_share"`
		} `json:"stats"`
		Replicas []map[string]any `json:"replicas"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	if raw.PrefixHitRate != nil || raw.Stats.HitShare != nil || len(raw.Replicas) != 1 || raw.Replicas[0]["prefix_hit_rate"] != nil {
		t.Errorf("want null model and replica hit rates and hit share: %s", body)
	}
	for _, key := range []string{`"prefix_hit_rate":null`, `"hit_share":null`} {
		if !strings.Contains(string(body), key) {
			t.Errorf("panel JSON lacks %s", key)
		}
	}

	got := collected(t, l, "kind")
	if kinds := got["caddy_warden_prompt_tokens_per_second"]; len(kinds) != 0 {
		t.Errorf("prompt token rates %v exported though no replica reports cached tokens", kinds)
	}
	if _, ok := got["caddy_warden_replica_prefix_cache_hit_ratio"]; ok {
		t.Error("hit-ratio gauge sampled for a replica without prefix-cache counters")
	}
	if v, ok := got["caddy_warden_generation_tokens_per_second"][""]; !ok || v <= 0 {
		t.Errorf("generation rate %v (present %v), want it known", v, ok)
	}
}

// fmtRate shows a nullable rate in a test message.
func fmtRate(v *float64) string {
	if v == nil {
		return "null"
	}
	return fmt.Sprint(*v)
}

// A V0 server publishes its own hit-rate gauge instead of counters: warden
// shows that.
func TestReportedHitRateOfV0Replica(t *testing.T) {
	const v0 = "127.0.0.1:12"
	l := liveUnitModel(t, "unknown-v0", v0)
	now := time.Now()
	for i := 0; i <= 5; i++ {
		s := bareScrape(100*float64(i), 10*float64(i))
		s.Engines[0].ReportedHitRate = 0.25
		s.Engines[0].Present |= metricsfeed.FieldReportedHitRate
		l.Model().Fleet().ObserveScrape(v0, now.Add(time.Duration(i-5)*time.Second), s, nil)
	}
	st := panel.Status(l, now)
	if len(st.Replicas) != 1 || st.Replicas[0].PrefixHitRate == nil || *st.Replicas[0].PrefixHitRate != 0.25 {
		t.Errorf("replica hit rate %+v, want the server's own 0.25", st.Replicas)
	}
	if st.PrefixHitRate == nil || *st.PrefixHitRate != 0.25 {
		t.Errorf("model hit rate %v, want 0.25", fmtRate(st.PrefixHitRate))
	}
}
