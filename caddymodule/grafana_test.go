package caddymodule_test

import (
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lmwarden/caddy-warden/internal/testrun"
)

var (
	// A selector written as name{...}: the dashboard writes every selector
	// with a label matcher (at least the model variable), so this finds the
	// metric names of its queries and nothing else.
	selectorName = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{`)
	// Any warden series name, to catch one written without braces.
	wardenName = regexp.MustCompile(`caddy_warden_[a-zA-Z0-9_]+`)
	// The metric of a Grafana variable query.
	labelValuesOf = regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)`)
	// A row of the table in docs/metrics.md: name, type, labels.
	docRow   = regexp.MustCompile("(?m)^\\|\\s*`(caddy_warden_[a-z0-9_]+)`\\s*\\|\\s*([a-z]+)\\s*\\|([^|]*)\\|")
	docLabel = regexp.MustCompile("`([a-z_]+)`")
)

// dashboardMetrics lists the metric names that the dashboard's panel queries
// and variables use, with the query each was first seen in.
func dashboardMetrics(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dashboard struct {
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dashboard); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	names := map[string]string{}
	var exprs []string
	for _, p := range dashboard.Panels {
		var panel struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		}
		if err := json.Unmarshal(p, &panel); err != nil {
			t.Fatal(err)
		}
		if panel.Type != "row" && len(panel.Targets) == 0 {
			t.Errorf("panel %q has no query", panel.Title)
		}
		for _, target := range panel.Targets {
			exprs = append(exprs, target.Expr)
		}
	}
	for _, expr := range exprs {
		var found []string
		for _, m := range selectorName.FindAllStringSubmatch(expr, -1) {
			found = append(found, m[1])
		}
		if len(found) == 0 {
			t.Errorf("query selects no metric: %q", expr)
		}
		for _, name := range wardenName.FindAllString(expr, -1) {
			if !slices.Contains(found, name) {
				t.Errorf("query uses %s without a {label matcher}, so this test cannot see it: %q", name, expr)
			}
		}
		for _, name := range found {
			if _, seen := names[name]; !seen {
				names[name] = expr
			}
		}
	}
	for _, v := range dashboard.Templating.List {
		if q, ok := v.Query.(string); ok && v.Type == "query" {
			m := labelValuesOf.FindStringSubmatch(q)
			if m == nil {
				t.Errorf("variable query %q: expected label_values(metric, label)", q)
				continue
			}
			names[m[1]] = q
		}
	}
	return names
}

// scrapeMetrics reads Caddy's /metrics on the admin address.
func scrapeMetrics(t *testing.T, f *fleet) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + f.caddy.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return families
}

func TestExportedMetrics(t *testing.T) {
	backends := []*fakeVLLM{startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1)}
	// Load control on, with room for every conversation: its series are
	// exported too, and no turn is held.
	f := startFleetWith(t, loadControlWith(map[string]any{"capacity_tokens": 1000000}), backends...)
	convs := testrun.Sessions("metrics", 6)
	for range 3 {
		testrun.Concurrently(len(convs), func(i int) { f.turn(t, convs[i], holdHeader, "50ms") })
	}
	f.turn(t, "") // one request without a session key
	families := scrapeMetrics(t, f)

	t.Run("the Grafana dashboard queries only exported series", func(t *testing.T) {
		names := dashboardMetrics(t, "../examples/grafana-dashboard.json")
		if len(names) == 0 {
			t.Fatal("no metric name found in the dashboard")
		}
		for name, query := range names {
			if families[strings.TrimSuffix(name, "_bucket")] == nil {
				t.Errorf("dashboard queries %s, which Caddy's /metrics does not export (in %q)", name, query)
			}
		}
		t.Logf("%d metric names checked", len(names))
	})

	t.Run("docs/metrics.md lists every warden series with its type and labels", func(t *testing.T) {
		// The pin store's series exist only with a store (sharedpins_test.go
		// checks them), the shared prefix's once a reply reported it
		// (sharedprefix_caddy_test.go).
		checkMetricsDocumented(t, families, func(name string) bool {
			return !strings.HasPrefix(name, pinStoreSeries) && name != sharedPrefixSeries
		})
	})
}

// pinStoreSeries starts the names of the shared pin store's series.
const pinStoreSeries = "caddy_warden_pin_store_"

// sharedPrefixSeries is exported once a reply reported the prefix new
// conversations share.
const sharedPrefixSeries = "caddy_warden_load_control_shared_prefix_tokens"

// loadControlSeries reports whether a series is exported with load control
// on, the shared prefix's aside.
func loadControlSeries(name string) bool {
	return strings.HasPrefix(name, "caddy_warden_load_control_") && name != sharedPrefixSeries ||
		name == "caddy_warden_residents" || name == "caddy_warden_resident_tokens"
}

// checkMetricsDocumented checks docs/metrics.md against what a Caddy exports,
// for the series covers selects: each documented one exported with its type
// and labels, each exported one documented.
func checkMetricsDocumented(t *testing.T, families map[string]*dto.MetricFamily, covers func(name string) bool) {
	t.Helper()
	doc, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, row := range docRow.FindAllStringSubmatch(string(doc), -1) {
		name, kind := row[1], row[2]
		if !covers(name) {
			continue
		}
		documented[name] = true
		family := families[name]
		if family == nil {
			t.Errorf("documented %s is not exported", name)
			continue
		}
		if want := strings.ToLower(family.GetType().String()); kind != want {
			t.Errorf("%s documented as %s, exported as %s", name, kind, want)
		}
		var labels []string
		for _, m := range docLabel.FindAllStringSubmatch(row[3], -1) {
			labels = append(labels, m[1])
		}
		if exported := labelNames(family); !slices.Equal(sorted(labels), exported) {
			t.Errorf("%s documented with labels %v, exported with %v", name, labels, exported)
		}
	}
	for name := range families {
		if strings.HasPrefix(name, "caddy_warden_") && covers(name) && !documented[name] {
			t.Errorf("exported %s is not documented", name)
		}
	}
	if len(documented) == 0 {
		t.Error("no series documented")
	}
}

// labelNames is the sorted union of the label names of a family's metrics.
func labelNames(family *dto.MetricFamily) []string {
	var names []string
	for _, m := range family.GetMetric() {
		for _, l := range m.GetLabel() {
			if !slices.Contains(names, l.GetName()) {
				names = append(names, l.GetName())
			}
		}
	}
	return sorted(names)
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// Servers that name their counters without _total have a prefix hit rate;
// one without prefix-cache counters has none: null in the admin API and no
// sample of the hit-ratio gauge.
func TestPrefixHitRateAcrossServerKinds(t *testing.T) {
	current, noTotal, noPrefix := startFakeVLLM(t, "current", 1), startFakeVLLM(t, "no-total", 1), startFakeVLLM(t, "no-prefix", 1)
	noTotal.noTotal = true
	noPrefix.noPrefix = true
	f := startFleet(t, "replicas {replicas}", current, noTotal, noPrefix)
	for _, conv := range testrun.Sessions("kinds", 6) {
		f.turn(t, conv)
		f.turn(t, conv)
	}
	testrun.Eventually(t, 10*time.Second, "a hit rate for the servers with counters", func() bool {
		for _, r := range f.status(t).Replicas {
			if r.Address != noPrefix.addr && r.PrefixHitRate == nil {
				return false
			}
		}
		return true
	})
	var raw struct {
		Replicas []map[string]any `json:"replicas"`
	}
	if err := f.caddy.Do(http.MethodGet, "/warden/models/m", nil, &raw); err != nil {
		t.Fatal(err)
	}
	for _, r := range raw.Replicas {
		v, present := r["prefix_hit_rate"]
		if r["address"] == noPrefix.addr && (!present || v != nil) {
			t.Errorf("%s: prefix_hit_rate %v (present %v), want null", noPrefix.addr, v, present)
		}
		if r["address"] == noTotal.addr && v == nil {
			t.Errorf("%s (counters without _total): prefix_hit_rate null", noTotal.addr)
		}
	}

	sampled := map[string]bool{}
	for _, m := range scrapeMetrics(t, f)["caddy_warden_replica_prefix_cache_hit_ratio"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "replica" {
				sampled[l.GetValue()] = true
			}
		}
	}
	if !sampled[current.addr] || !sampled[noTotal.addr] || sampled[noPrefix.addr] {
		t.Errorf("hit-ratio gauge sampled for %v; want %s and %s, not %s", sampled, current.addr, noTotal.addr, noPrefix.addr)
	}
}
