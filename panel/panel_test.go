package panel

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/fleet"
	"github.com/lmwarden/caddy-warden/livemodel"
	"github.com/lmwarden/caddy-warden/metricsfeed"
	"github.com/lmwarden/caddy-warden/selection"
)

func TestWantsJSON(t *testing.T) {
	const browser = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"
	for _, tc := range []struct {
		target, accept string
		want           bool
	}{
		{"/warden/", "", false},
		{"/warden/", browser, false},
		{"/warden/", "*/*", false},
		{"/warden/", "application/json", true},
		{"/warden/", "application/json, text/plain, */*", true},
		{"/warden/", "text/html;q=0.5, application/json", true},
		{"/warden/?format=json", browser, true},
		{"/warden/?format=html", "application/json", false},
	} {
		r := httptest.NewRequest(http.MethodGet, tc.target, nil)
		if tc.accept != "" {
			r.Header.Set("Accept", tc.accept)
		}
		if got := WantsJSON(r); got != tc.want {
			t.Errorf("%s with Accept %q: JSON = %v, want %v", tc.target, tc.accept, got, tc.want)
		}
	}
}

// The page must run under its own CSP: the hashes must be those of the
// inline elements exactly as served, and nothing may load from elsewhere.
func TestPanelPageIsSelfContained(t *testing.T) {
	html := string(thePage.html)
	for _, tag := range []string{"script", "style"} {
		inline := regexp.MustCompile(`(?s)<`+tag+`>(.*?)</`+tag+`>`).FindAllStringSubmatch(html, -1)
		if len(inline) != 1 || strings.TrimSpace(inline[0][1]) == "" {
			t.Fatalf("want one non-empty inline <%s>, found %d", tag, len(inline))
		}
		if hash := sourceHash(inline[0][1]); !strings.Contains(thePage.policy, tag+"-src "+hash) {
			t.Errorf("policy %q lacks %s-src %s of the served <%s>", thePage.policy, tag, hash, tag)
		}
	}
	if m := regexp.MustCompile(`(?i)<(link|img|iframe)\b|\ssrc=|https?://[^"]*`).FindAllString(html, -1); len(m) > 0 {
		for _, ref := range m {
			if ref != "http://www.w3.org/2000/svg" { // the SVG namespace name, never fetched
				t.Errorf("page references something outside itself: %q", ref)
			}
		}
	}
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

// testFleet is a fleet runtime serving the given servers.
func testFleet(t0 time.Time, addrs ...string) *fleet.Model {
	f := fleet.New("m", time.Second, t0, nil)
	var reps []selection.Replica
	for _, a := range addrs {
		reps = append(reps, selection.Replica{ID: a, Address: a})
	}
	f.Apply(f.Prepare(fleet.Spec{Replicas: reps, MetricsInterval: time.Second}))
	return f
}

func TestHourStats(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	f := testFleet(t0, "127.0.0.1:1")
	feed(f, "127.0.0.1:1", t0, 60, 0.75)
	now := t0.Add(60 * time.Second)

	st := hourStats(f, now, statsStep)
	if len(st.At) == 0 || len(st.Cached) != len(st.At) || len(st.Computed) != len(st.At) || len(st.Generation) != len(st.At) {
		t.Fatalf("columns of unequal or zero length: %+v", st)
	}
	if st.StepSeconds != statsStep.Seconds() || st.WindowSeconds != fleet.HistoryRetention.Seconds() {
		t.Errorf("step %v s, window %v s", st.StepSeconds, st.WindowSeconds)
	}
	for i, at := range st.At {
		if at%int64(statsStep.Seconds()) != 0 || (i > 0 && at <= st.At[i-1]) {
			t.Errorf("step starts not aligned and increasing: %v", st.At)
			break
		}
		if st.Cached[i] != 75 || st.Computed[i] != 25 || st.Generation[i] != 10 {
			t.Errorf("step %d: cached %v computed %v generation %v, want 75 25 10", at, st.Cached[i], st.Computed[i], st.Generation[i])
		}
	}
	if st.HitShare == nil || math.Abs(*st.HitShare-0.75) > 1e-9 {
		t.Errorf("hit share %v, want 0.75", fmtRate(st.HitShare))
	}

	// Samples older than the hour are neither charted nor counted.
	late := hourStats(f, now.Add(2*fleet.HistoryRetention), statsStep)
	if len(late.At) != 0 || late.HitShare != nil {
		t.Errorf("two hours later: %d steps, hit share %v; want none", len(late.At), fmtRate(late.HitShare))
	}
}

// NewData covers every model given with its status, counters' start in
// words and the traffic of its replicas only.
func TestDataOfLiveModel(t *testing.T) {
	m := livemodel.New("panel-unit", time.Second, zap.NewNop())
	l := m.Prepare(livemodel.Spec{Fleet: fleet.Spec{
		Routing:  selection.Config{MaxNumSeqs: 32, Affinity: true},
		Replicas: []selection.Replica{{ID: "127.0.0.1:9", Address: "127.0.0.1:9"}},
	}, Logger: zap.NewNop()})
	m.Activate(l, time.Now())
	t.Cleanup(m.Close)
	now := time.Now()
	feed(m.Fleet(), "127.0.0.1:9", now.Add(-30*time.Second), 30, 0.5)
	feed(m.Fleet(), "127.0.0.1:10", now.Add(-30*time.Second), 30, 1) // not a replica of the model

	data := NewData(now.Add(3*time.Minute), []*livemodel.Load{l})
	if len(data.Models) != 1 || data.Models[0].Model != "panel-unit" {
		t.Fatalf("models %+v, want panel-unit's alone", data.Models)
	}
	got := data.Models[0]
	if len(got.Replicas) != 1 || got.Replicas[0].Address != "127.0.0.1:9" || got.SpillThreshold != 0 || !got.SpillThresholdAuto || !got.Affinity {
		t.Errorf("status not carried: %+v", got.ModelStatus)
	}
	if got.SinceHuman != "3 minutes ago" {
		t.Errorf("since %q, want 3 minutes ago", got.SinceHuman)
	}
	if len(got.Stats.At) == 0 || got.Stats.HitShare == nil || math.Abs(*got.Stats.HitShare-0.5) > 1e-9 {
		t.Errorf("stats: %d steps, hit share %v; want the replica's 0.5", len(got.Stats.At), fmtRate(got.Stats.HitShare))
	}
}

// A replica with a host-memory KV tier shows the tier's size, in GiB and in
// the tokens its stores tell (which load control counts as its capacity),
// and the share of prompt tokens it served beside the GPU's; one without
// shows none of them.
func TestHostTierShownWhereReported(t *testing.T) {
	m := livemodel.New("panel-tier", time.Second, zap.NewNop())
	l := m.Prepare(livemodel.Spec{Fleet: fleet.Spec{
		Routing: selection.Config{MaxNumSeqs: 32, Affinity: true},
		Replicas: []selection.Replica{
			{ID: "127.0.0.1:11", Address: "127.0.0.1:11"},
			{ID: "127.0.0.1:12", Address: "127.0.0.1:12"},
		},
	}, Logger: zap.NewNop()})
	m.Activate(l, time.Now())
	t.Cleanup(m.Close)
	now := time.Now()
	for i := 0; i <= 30; i++ {
		at := now.Add(time.Duration(i-30) * time.Second)
		for _, tier := range []bool{true, false} {
			s := counterScrape(10000*float64(i), 5000*float64(i), 1000*float64(i))
			e := &s.Engines[0]
			e.Present |= metricsfeed.LoadFields
			target := "127.0.0.1:12"
			if tier {
				target = "127.0.0.1:11"
				e.ExternalQueries, e.ExternalHits, e.HostTierGiB = 5000*float64(i), 2500*float64(i), 22
				// Every token computed (written, less what the tier loaded)
				// stored at 147,456 bytes.
				e.HostStoredBytes = (6000 - 2500) * float64(i) * 147456
				e.Present |= metricsfeed.FieldExternalQueries | metricsfeed.FieldExternalHits | metricsfeed.FieldHostStoredBytes
			}
			m.Fleet().ObserveScrape(target, at, s, nil)
		}
	}
	rows := Status(l, now).Replicas
	if len(rows) != 2 {
		t.Fatalf("%d rows", len(rows))
	}
	tier, plain := rows[0], rows[1]
	if tier.HostTierGiB == nil || *tier.HostTierGiB != 22 || tier.HostHitRate == nil || math.Abs(*tier.HostHitRate-0.25) > 1e-9 {
		t.Errorf("replica with a tier: %v GiB, host hits %v; want 22 GiB, 0.25", tier.HostTierGiB, fmtRate(tier.HostHitRate))
	}
	if want := 22 * (1 << 30) / 147456; tier.HostTierTokens == nil || *tier.HostTierTokens != want ||
		tier.KVCapacityTokens == nil || *tier.KVCapacityTokens != want {
		t.Errorf("replica with a tier: %s tokens, capacity %s; want %d both", fmtInt(tier.HostTierTokens), fmtInt(tier.KVCapacityTokens), want)
	}
	if plain.HostTierGiB != nil || plain.HostHitRate != nil || plain.HostTierTokens != nil {
		t.Errorf("replica without a tier: %v GiB, host hits %v, %s tokens; want all unknown", plain.HostTierGiB, fmtRate(plain.HostHitRate), fmtInt(plain.HostTierTokens))
	}
}

func fmtInt(n *int) string {
	if n == nil {
		return "null"
	}
	return fmt.Sprint(*n)
}

// The working set sums the replicas' residents against their KV capacity,
// unknown while one replica's is; it is shown only with load control on.
func TestWorkingSet(t *testing.T) {
	kv := func(n int) *int { return &n }
	on := LoadControlStatus{Enabled: true}
	const unknown = -1
	for _, c := range []struct {
		st                 ModelStatus
		resident, capacity int
	}{
		{ModelStatus{LoadControl: on, Replicas: []ReplicaStatus{{ResidentTokens: 5, KVCapacityTokens: kv(10)}, {ResidentTokens: 7, KVCapacityTokens: kv(20)}}}, 12, 30},
		{ModelStatus{LoadControl: on, Replicas: []ReplicaStatus{{ResidentTokens: 5}, {ResidentTokens: 7, KVCapacityTokens: kv(20)}}}, 12, unknown},
		{ModelStatus{LoadControl: on, Replicas: []ReplicaStatus{{ResidentTokens: 5, KVCapacityTokens: kv(20)}, {ResidentTokens: 7}}}, 12, unknown},
	} {
		ws := workingSet(c.st)
		capacity := unknown
		if ws != nil && ws.KVCapacityTokens != nil {
			capacity = *ws.KVCapacityTokens
		}
		if ws == nil || ws.ResidentTokens != c.resident || capacity != c.capacity {
			t.Errorf("%+v: working set %+v (capacity %d), want %d of %d", c.st.Replicas, ws, capacity, c.resident, c.capacity)
		}
	}
	if ws := workingSet(ModelStatus{Replicas: []ReplicaStatus{{ResidentTokens: 5}}}); ws != nil {
		t.Errorf("load control off: working set %+v, want none", ws)
	}
}

// An hour of history at one scrape a second, for four engines: the work
// of one panel refresh per model.
func BenchmarkHourStats(b *testing.B) {
	const engines = 4
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	var targets []string
	for e := range engines {
		targets = append(targets, fmt.Sprintf("127.0.0.1:%d", 8001+e))
	}
	f := testFleet(t0, targets...)
	for _, target := range targets {
		feed(f, target, t0, int(fleet.HistoryRetention/time.Second), 0.8)
	}
	now := t0.Add(fleet.HistoryRetention)
	var st Stats
	for b.Loop() {
		st = hourStats(f, now, statsStep)
	}
	data, err := json.Marshal(st)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(len(st.At)), "points")
	b.ReportMetric(float64(len(data)), "json-bytes")
}

// fmtRate shows a nullable rate in a test message.
func fmtRate(v *float64) string {
	if v == nil {
		return "null"
	}
	return fmt.Sprint(*v)
}
