package report

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
)

func sampleRows() []Row {
	var rows []Row
	for _, seed := range []int64{1, 2} {
		for _, sessions := range []int{4, 16} {
			for i, policy := range []string{"warden", "vllm"} {
				f := float64(seed) + float64(i)
				rows = append(rows, Row{
					Mode: ModeLab, Policy: policy, Sessions: sessions, Seed: seed, DurationS: 180,
					SessionsPerHour: 200 + 10*f, OutputTokensPerMin: 7000 + 100*f,
					TTFBP50S: 0.1 * f * float64(sessions), TTFBP95S: 0.5 * f * float64(sessions),
					ReplicasBusy: 3.5, PrefixHitPercent: 80 + 10*float64(seed) - 30*float64(i),
					StayedPercent: 100, HitBoundPercent: 86, Requests: 100, Preemptions: uint64(seed), Replicas: 4,
					ConversationP50S: 30 * f, ConversationP95S: 60 * f, ConversationMeanS: 40 * f, ConversationsTimed: 10, ConversationsCut: 2,
				})
			}
		}
	}
	return rows
}

func TestJSONRoundTripKeepsDesignFields(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.json")
	rows := sampleRows()
	if err := WriteJSON(path, rows); err != nil {
		t.Fatal(err)
	}
	back, err := ReadJSON(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, rows) {
		t.Fatalf("round trip changed the rows:\n%+v\n%+v", back, rows)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string][]map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	runs := doc["runs"]
	if len(runs) != len(rows) {
		t.Fatalf("%d runs in the file, want %d", len(runs), len(rows))
	}
	// DESIGN §4's fields, with its types.
	for _, key := range []string{"mode", "policy"} {
		if _, ok := runs[0][key].(string); !ok {
			t.Errorf("field %q missing or not a string: %v", key, runs[0][key])
		}
	}
	for _, key := range []string{"sessions", "seed", "duration_s", "sessions_per_hour", "output_tokens_per_min",
		"ttfb_p50_s", "ttfb_p95_s", "replicas_busy", "prefix_hit_percent", "stayed_percent", "hit_bound_percent",
		"conversation_p50_s", "conversation_p95_s", "conversation_mean_s", "conversations_timed", "conversations_cut"} {
		if _, ok := runs[0][key].(float64); !ok {
			t.Errorf("field %q missing or not a number: %v", key, runs[0][key])
		}
	}
	if runs[0]["mode"] != "lab" || runs[0]["sessions"] != 4.0 || runs[0]["ttfb_p95_s"] != rows[0].TTFBP95S ||
		runs[0]["conversation_p50_s"] != 30.0 || runs[0]["conversations_timed"] != 10.0 {
		t.Errorf("first run reads %v", runs[0])
	}
}

func TestJSONLeavesOutConversationTimesWhenNoneWasTimed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.json")
	row := sampleRows()[0]
	row.ConversationP50S, row.ConversationP95S, row.ConversationMeanS, row.ConversationsTimed = 0, 0, 0, 0
	if err := WriteJSON(path, []Row{row}); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string][]map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	run := doc["runs"][0]
	for _, key := range []string{"conversation_p50_s", "conversation_p95_s", "conversation_mean_s"} {
		if _, ok := run[key]; ok {
			t.Errorf("%s written with no conversation timed: %v", key, run)
		}
	}
	if run["conversations_timed"] != 0.0 || run["conversations_cut"] != 2.0 {
		t.Errorf("conversations_timed reads %v, conversations_cut %v; want 0 and 2", run["conversations_timed"], run["conversations_cut"])
	}
}

func TestJSONRefusesWhatItCannotHold(t *testing.T) {
	dir := t.TempDir()
	if err := WriteJSON(filepath.Join(dir, "seed.json"), SeedRows); err == nil {
		t.Error("wrote the seed's rows, whose unmeasured columns are NaN")
	}
	drift := filepath.Join(dir, "drift.json")
	os.WriteFile(drift, []byte(`{"runs":[{"mode":"lab","policy":"warden","ttfb_p50":1}]}`), 0o644)
	if _, err := ReadJSON(drift); err == nil {
		t.Error("read a file with an unknown field")
	}
	empty := filepath.Join(dir, "empty.json")
	if err := WriteJSON(empty, nil); err != nil {
		t.Fatal(err)
	}
	if rows, err := ReadJSON(empty); err != nil || len(rows) != 0 {
		t.Errorf("empty file read as %v, %v", rows, err)
	}
}

func TestTableShowsSeedBesideOursWithSpread(t *testing.T) {
	var out bytes.Buffer
	if err := PrintTable(&out, sampleRows()); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	lines := strings.Split(strings.TrimSpace(text), "\n")
	find := func(sessions, label string) []string { return tableCells(t, text, sessions, label) }

	seedOn := find("4", "seed on")
	if seedOn[column(prefixHits)] != "86.4" || seedOn[column(hitBound)] != "-" || seedOn[column(preemptions)] != "-" {
		t.Errorf("seed on at 4 sessions: %v", seedOn)
	}
	if find("16", "seed off")[column(stayedPercent)] != "-" {
		t.Error("the seed reported no stayed share for affinity off")
	}
	// Two seeds: 90 and 100 hits average 95 with a standard deviation of 7.1.
	if got := find("4", "warden")[column(prefixHits)]; got != "95.0±7.1" {
		t.Errorf("warden hits cell %q, want 95.0±7.1", got)
	}
	if got := find("16", "vllm")[column(outputPerMin)]; got != "7,250±71" {
		t.Errorf("vllm output cell %q, want 7,250±71", got)
	}
	for _, l := range lines {
		if f := strings.Fields(l); len(f) > 0 && f[0] != "4" && f[0] != "16" && f[0] != "Sessions" {
			t.Errorf("a level absent from the rows was printed: %q", l)
		}
	}
	// Seed rows come first at each level.
	var order []string
	for _, l := range lines {
		if f := strings.Fields(l); len(f) > 2 && f[0] == "4" {
			order = append(order, f[1])
		}
	}
	if !slices.Equal(order, []string{"seed", "seed", "warden", "vllm"}) {
		t.Errorf("order at 4 sessions %v", order)
	}
}

// tableCells returns the numeric cells of the table's line for a level and a label.
func tableCells(t *testing.T, text, sessions, label string) []string {
	t.Helper()
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[0] == sessions && strings.Join(f[1:len(f)-len(tableMetrics)-1], " ") == label {
			return f[len(f)-len(tableMetrics):]
		}
	}
	t.Fatalf("no line for %s sessions, %q in\n%s", sessions, label, text)
	return nil
}

// column is the index of a metric's cell among tableCells.
func column(m metric) int {
	return slices.IndexFunc(tableMetrics, func(c metric) bool { return c.header == m.header })
}

func TestTableShowsTimePerConversation(t *testing.T) {
	rows := sampleRows()
	// vllm at 16 sessions timed no conversation in its second seed.
	for i, r := range rows {
		if r.Policy == "vllm" && r.Sessions == 16 && r.Seed == 2 {
			rows[i].ConversationP50S, rows[i].ConversationP95S, rows[i].ConversationsTimed = 0, 0, 0
		}
	}
	var out bytes.Buffer
	if err := PrintTable(&out, rows); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	header := strings.Split(text, "\n")[0]
	if !strings.Contains(header, "Conv p50 (s)") || !strings.Contains(header, "Conv p95 (s)") {
		t.Errorf("header lacks the conversation columns: %q", header)
	}
	// warden's seeds 1 and 2 timed 30 and 60 s (p50), 60 and 120 s (p95):
	// means 45 and 90, standard deviations 15√2 and 30√2.
	for _, c := range []struct {
		sessions, label string
		p50, p95        string
	}{
		{"4", "warden", "45.0±21.2", "90.0±42.4"},
		{"16", "warden", "45.0±21.2", "90.0±42.4"},
		{"4", "vllm", "75.0±21.2", "150.0±42.4"},
		{"16", "vllm", "-", "-"},
		{"4", "seed on", "-", "-"},
		{"16", "seed off", "-", "-"},
	} {
		cells := tableCells(t, text, c.sessions, c.label)
		if got := cells[column(conversationP50)]; got != c.p50 {
			t.Errorf("%s at %s sessions: Conv p50 %q, want %q", c.label, c.sessions, got, c.p50)
		}
		if got := cells[column(conversationP95)]; got != c.p95 {
			t.Errorf("%s at %s sessions: Conv p95 %q, want %q", c.label, c.sessions, got, c.p95)
		}
	}

	// One seed: the plain figure.
	out.Reset()
	if err := PrintTable(&out, rows[:1]); err != nil {
		t.Fatal(err)
	}
	if got := tableCells(t, out.String(), "4", "warden")[column(conversationP95)]; got != "60.0" {
		t.Errorf("one seed: Conv p95 %q, want 60.0", got)
	}
}

func TestTablePrefixesModesWhenMixed(t *testing.T) {
	rows := sampleRows()[:2]
	run := rows[0]
	run.Mode = ModeRun
	var out bytes.Buffer
	if err := PrintTable(&out, append(rows, run)); err != nil {
		t.Fatal(err)
	}
	for _, label := range []string{"lab warden", "lab vllm", "run warden"} {
		if !strings.Contains(out.String(), label) {
			t.Errorf("no %q in\n%s", label, out.String())
		}
	}
}

func TestPlotsAreValidPNGs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "plots")
	rows := sampleRows()
	rows[0].TTFBP50S = 0 // a log scale cannot show it; it must be left out, not crash
	paths, err := WritePlots(dir, rows)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{TTFBPlot, PrefixHitsPlot, OutputTokensPlot}
	if len(paths) != len(want) {
		t.Fatalf("wrote %v, want %v", paths, want)
	}
	for i, p := range paths {
		if filepath.Base(p) != want[i] {
			t.Errorf("plot %d is %s, want %s", i, p, want[i])
		}
		b := decodePNG(t, p).Bounds()
		if b.Dx() < 300 || b.Dy() < 200 {
			t.Errorf("%s is %dx%d", p, b.Dx(), b.Dy())
		}
		if want[i] == TTFBPlot && b.Dx() < 2*b.Dy() {
			t.Errorf("%s should hold two panels side by side, is %dx%d", p, b.Dx(), b.Dy())
		}
	}
	if _, err := WritePlots(dir, nil); err == nil {
		t.Error("plotted no rows")
	}
}

func TestSeedRowsMatchTheDesignTable(t *testing.T) {
	if len(SeedRows) != 10 {
		t.Fatalf("%d seed rows, want 10", len(SeedRows))
	}
	for _, r := range SeedRows {
		if r.Mode != ModeSeed || (r.Policy == "off") != math.IsNaN(r.StayedPercent) {
			t.Errorf("seed row %+v", r)
		}
	}
	if r := SeedRows[9]; r.Sessions != 32 || r.TTFBP50S != 27.66 || r.StayedPercent != 67.3 {
		t.Errorf("seed on at 32 sessions: %+v", r)
	}
	if got := SeedFor([]Row{{Sessions: 8}, {Sessions: 24}}); len(got) != 4 || got[0].Sessions != 8 || got[3].Sessions != 24 {
		t.Errorf("SeedFor(8, 24) = %+v", got)
	}
}

func TestSetClientSideScalesTimesAndRates(t *testing.T) {
	sum := agentload.Summary{
		SessionsPerHour: 600, OutputTokensPerMin: 50_000,
		TTFBP50: 20 * time.Millisecond, TTFBP95: 300 * time.Millisecond, TTFBMean: 100 * time.Millisecond,
		ConversationsTimed: 7, ConversationsCut: 1,
		ConversationP50: 4 * time.Second, ConversationP95: 9 * time.Second, ConversationMean: 5 * time.Second,
		StayedPercent: 93.5, Requests: 120, Errors: 2, Cut: 3, SessionsCompleted: 8,
	}
	// A run whose simulator ran 10 times faster than the client's clock.
	var r Row
	r.SetClientSide(sum, 10)
	want := Row{
		SessionsPerHour: 60, OutputTokensPerMin: 5000,
		TTFBP50S: 0.2, TTFBP95S: 3, TTFBMeanS: 1,
		ConversationsTimed: 7, ConversationsCut: 1, ConversationP50S: 40, ConversationP95S: 90, ConversationMeanS: 50,
		StayedPercent: 93.5, Requests: 120, Errors: 2, Cut: 3, SessionsCompleted: 8,
	}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("time scale 10:\n got %+v\nwant %+v", r, want)
	}
	// The lab's clock is the reported one.
	var lab Row
	lab.SetClientSide(sum, 1)
	if lab.ConversationP50S != 4 || lab.ConversationP95S != 9 || lab.ConversationMeanS != 5 || lab.TTFBP95S != 0.3 || lab.OutputTokensPerMin != 50_000 {
		t.Errorf("time scale 1: %+v", lab)
	}
}

// A host tier adds its hits beside the GPU's, measured by the lab only;
// without one, neither the table nor the JSON changes.
func TestHostTierHitsShowOnlyWithATier(t *testing.T) {
	cells := func(rows []Row) map[string][]string {
		var out bytes.Buffer
		if err := PrintTable(&out, rows); err != nil {
			t.Fatal(err)
		}
		lines := map[string][]string{}
		for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			f := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(l), -1)
			if len(f) > 1 {
				lines[f[0]+" "+f[1]] = f
			}
		}
		return lines
	}
	plain := cells(sampleRows())
	if header := plain["Sessions Policy"]; slices.Contains(header, hostHits.header) || len(header) != 3+len(tableMetrics) {
		t.Errorf("header without a tier: %q", header)
	}

	rows := sampleRows()[:4] // seeds 1: warden and vllm at 4 and 16 sessions
	for i := range rows {
		rows[i].HostTierGiB, rows[i].HostHitPercent = 22, float64(5+i)
	}
	run := rows[0]
	run.Mode = ModeRun
	tiered := cells(append(rows, run))
	header := tiered["Sessions Policy"]
	i := slices.Index(header, hostHits.header)
	if i < 0 || header[i-1] != prefixHits.header {
		t.Fatalf("header with a tier: %q", header)
	}
	for line, want := range map[string]string{"4 lab warden": "5.0", "4 lab vllm": "6.0", "16 lab warden": "7.0", "4 run warden": "-", "4 seed on": "-"} {
		if got := tiered[line]; len(got) <= i || got[i] != want {
			t.Errorf("%s: %q, want %s under %q", line, got, want, hostHits.header)
		}
	}

	path := filepath.Join(t.TempDir(), "results.json")
	for _, c := range []struct {
		rows []Row
		want bool
	}{{sampleRows(), false}, {rows, true}} {
		if err := WriteJSON(path, c.rows); err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{`"host_hit_percent"`, `"kv_offloading_size_gib"`} {
			if got := bytes.Contains(raw, []byte(key)); got != c.want {
				t.Errorf("%s in the JSON: %v, want %v", key, got, c.want)
			}
		}
	}
}
