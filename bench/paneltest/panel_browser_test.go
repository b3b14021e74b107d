package paneltest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/dustin/go-humanize"

	"github.com/lmwarden/caddy-warden/internal/testrun"
	"github.com/lmwarden/caddy-warden/panel"
)

// get fetches the panel with the given Accept header, authenticated or not.
func (p panelSite) get(t *testing.T, target, accept string, authenticated bool) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, target, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", accept)
	if authenticated {
		req.Header.Set("Authorization", p.authorization)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// data fetches the JSON twin (asked for with the Accept header) and its body.
func (p panelSite) data(t *testing.T) (panel.Data, []byte) {
	t.Helper()
	resp, body := p.get(t, p.url, "application/json", true)
	var data panel.Data
	if err := json.Unmarshal(body, &data); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("JSON twin: %s, %v: %.200s", resp.Status, err, body)
	}
	return data, body
}

// soakDuration reads WARDEN_PANEL_SOAK: that much steady traffic (at most
// 10m) before the checks gives the screenshot an interesting chart, as in
// docs/panel.png. Unset, the test adds none.
func soakDuration(t *testing.T) time.Duration {
	env := os.Getenv("WARDEN_PANEL_SOAK")
	if env == "" {
		return 0
	}
	d, err := time.ParseDuration(env)
	if err != nil || d < 0 || d > 10*time.Minute {
		t.Fatalf("WARDEN_PANEL_SOAK=%q: want a duration up to 10m", env)
	}
	return d
}

// soak sends traffic for d: a new conversation every second, each sending
// up to 15 turns of 4-24 generated tokens (about 100-600 ms) back to back.
func (f *fleet) soak(t *testing.T, d time.Duration) {
	rng := rand.New(rand.NewPCG(1, 2))
	var mu sync.Mutex
	tokens := func() int {
		mu.Lock()
		defer mu.Unlock()
		return 4 + rng.IntN(21)
	}
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := 0; time.Now().Before(end); i++ {
		wg.Go(func() {
			for turn := 0; turn < 15 && time.Now().Before(end); turn++ {
				f.turn(t, fmt.Sprintf("soak-%d", i), tokens())
			}
		})
		time.Sleep(time.Second)
	}
	wg.Wait()
}

// startChromium runs headless Chromium for the test. Without it the test
// fails on CI and is skipped elsewhere.
func startChromium(t *testing.T) context.Context {
	t.Helper()
	var path string
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		const msg = "headless Chromium not found on PATH; on Debian: apt-get install -y chromium"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("no-proxy-server", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 720),
	)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	return ctx
}

// pageState is what the panel shows for one model, read from the DOM.
type pageState struct {
	Badges   map[string]string            `json:"badges"`
	SpillTip string                       `json:"spill_tip"` // the spill badge's title
	Rows     map[string]map[string]string `json:"rows"`      // by replica ID, then column
	RowCount int                          `json:"row_count"` // of the replica table
	Flows    map[string]map[string]string `json:"flows"`     // by flow ID, then column
	Since    string                       `json:"since"`
	Chart    map[string]float64           `json:"chart"` // drawn height of each series
	Text     string                       `json:"text"`
	Status   string                       `json:"status"`  // the page's own status line
	Missing  bool                         `json:"missing"` // no section for the model
}

const readPage = `(() => {
	const status = document.getElementById('status').textContent;
	const s = document.querySelector('section[data-model="m"]');
	if (!s) return { missing: true, status };
	const badges = {};
	s.querySelectorAll('[data-badge]').forEach((b) => { badges[b.dataset.badge] = b.textContent; });
	const rows = {};
	s.querySelectorAll('tr[data-replica]').forEach((tr) => {
		const row = {};
		tr.querySelectorAll('td[data-col]').forEach((td) => { row[td.dataset.col] = td.textContent; });
		rows[tr.dataset.replica] = row;
	});
	const flows = {};
	s.querySelectorAll('tr[data-flow]').forEach((tr) => {
		const row = {};
		tr.querySelectorAll('td[data-col]').forEach((td) => { row[td.dataset.col] = td.textContent; });
		flows[tr.dataset.flow] = row;
	});
	const height = (cls) => { const p = s.querySelector('path.' + cls); return p ? p.getBBox().height : 0; };
	const spill = s.querySelector('[data-badge="spill"]');
	return {
		badges, rows, flows,
		spill_tip: spill ? spill.title : '',
		row_count: s.querySelectorAll('[data-table="replicas"] tbody tr').length,
		since: s.querySelector('.since').textContent,
		chart: { cached: height('series-cached'), computed: height('series-computed'), generation: height('series-generation') },
		text: document.body.innerText,
		status,
	};
})()`

func readPanel(ctx context.Context) (*pageState, error) {
	return chromedp.Run(ctx, chromedp.Evaluate[*pageState](readPage))
}

// waitPanel polls the page until check finds nothing wrong, for at most
// within; it returns how long that took, or fails with the last problems.
func waitPanel(t *testing.T, ctx context.Context, within time.Duration, what string, check func(*pageState) []string) time.Duration {
	t.Helper()
	start := time.Now()
	var problems []string
	for time.Since(start) < within {
		page, err := readPanel(ctx)
		switch {
		case err != nil:
			problems = []string{err.Error()}
		case page.Missing:
			problems = []string{"no section for model m; page status: " + page.Status}
		default:
			if problems = check(page); len(problems) == 0 {
				return time.Since(start)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v:\n%s", what, within, strings.Join(problems, "\n"))
	return 0
}

// matchesStatus lists where the page differs from the admin JSON.
func matchesStatus(page *pageState, st panel.ModelStatus) []string {
	var problems []string
	differ := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	number := func(text string) float64 {
		v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(text), "%"), 64)
		if err != nil {
			return math.NaN()
		}
		return v
	}
	// Shown with one decimal: equal within rounding.
	near := func(shown string, want float64) bool { return math.Abs(number(shown)-want) <= 0.05+1e-9 }

	if page.RowCount != len(st.Replicas) || len(page.Rows) != len(st.Replicas) {
		differ("%d rows (%d distinct), admin has %d replicas", page.RowCount, len(page.Rows), len(st.Replicas))
	}
	for _, r := range st.Replicas {
		row := page.Rows[r.ID]
		if row == nil {
			differ("no row for replica %s", r.ID)
			continue
		}
		for col, want := range map[string]float64{
			"in_flight": float64(r.InFlight), "sticky": float64(r.Sticky), "spilled_in": float64(r.SpilledIn),
			"client_pinned": float64(r.ClientPinned), "sessions": float64(r.Sessions), "active_sessions": float64(r.ActiveSessions),
			"running": r.Running, "waiting": r.Waiting, "residents": float64(r.Residents),
			"kv_used": 100 * r.KVUsed,
		} {
			if !near(row[col], want) {
				differ("replica %s %s: page %q, admin %v", r.ID, col, row[col], want)
			}
		}
		switch shown := row["prefix_hit_rate"]; {
		case r.PrefixHitRate == nil && shown != "—":
			differ("replica %s prefix_hit_rate: page %q, admin null", r.ID, shown)
		case r.PrefixHitRate != nil && !near(shown, 100**r.PrefixHitRate):
			differ("replica %s prefix_hit_rate: page %q, admin %v", r.ID, shown, *r.PrefixHitRate)
		}
		if want := map[bool]string{true: "yes", false: "no"}[r.Healthy]; row["healthy"] != want {
			differ("replica %s healthy: page %q, admin %v", r.ID, row["healthy"], r.Healthy)
		}
		if !strings.Contains(row["replica"], r.Address) {
			differ("replica %s labelled %q", r.ID, row["replica"])
		}
	}
	onOff := map[bool]string{true: "on", false: "off"}
	spill := fmt.Sprintf("Spill threshold %d manual", st.SpillThreshold)
	if st.SpillThresholdAuto {
		spill = "Moves by expected cost"
	}
	for key, want := range map[string]string{
		"affinity":  "Affinity " + onOff[st.Affinity],
		"spill":     spill,
		"in_flight": fmt.Sprintf("In flight %d", st.InFlight),
		"max_num_seqs": fmt.Sprintf("max_num_seqs %d (%s)", st.MaxNumSeqs,
			map[string]string{"config": "set", "process": "from --max-num-seqs", "vllm_default": "vLLM's default"}[st.MaxNumSeqsSource]),
		"pin_store": "Shared pins " + map[bool]string{true: "up", false: "down"}[st.PinStore != nil && st.PinStore.Up],
		"queue":     fmt.Sprintf("Queue %d", st.LoadControl.Waiting) + map[bool]string{true: " · stepped aside"}[st.LoadControl.SteppedAside],
	} {
		if page.Badges[key] != want {
			differ("badge %s: page %q, admin %q", key, page.Badges[key], want)
		}
	}
	switch {
	case !st.SpillThresholdAuto && page.SpillTip != "":
		differ("manual spill threshold explained as %q", page.SpillTip)
	case st.SpillThresholdAuto && st.PrefillTokensPerSecond != nil &&
		!strings.Contains(page.SpillTip, "prefill "+humanize.Comma(int64(*st.PrefillTokensPerSecond))+" tokens/s"):
		differ("spill badge title %q, admin prefill_tokens_per_second %v", page.SpillTip, *st.PrefillTokensPerSecond)
	}
	if sticky, ok := strings.CutPrefix(page.Badges["sticky"], "Sticky "); !ok || !near(sticky, st.StickyPercent) {
		differ("badge sticky: page %q, admin %.2f%%", page.Badges["sticky"], st.StickyPercent)
	}
	if len(page.Flows) != len(st.LoadControl.Flows) {
		differ("%d flows on the page, admin has %d", len(page.Flows), len(st.LoadControl.Flows))
	}
	for _, f := range st.LoadControl.Flows {
		row := page.Flows[f.Flow]
		for col, want := range map[string]float64{"waiting": float64(f.Waiting), "admitted": float64(f.Admitted),
			"queued": float64(f.Queued), "refused": float64(f.Refused), "waited_s": f.WaitedSeconds} {
			if !near(row[col], want) {
				differ("flow %s %s: page %q, admin %v", f.Flow, col, row[col], want)
			}
		}
	}
	return problems
}

// replyUsageLine is the panel's line on the replies' usage, as the admin
// JSON's numbers give it.
func replyUsageLine(r panel.ReplyUsageStatus) string {
	percent := func(p *float64) string {
		if p == nil {
			return "—"
		}
		return fmt.Sprintf("%.1f%%", *p)
	}
	return fmt.Sprintf("Turns of resident conversations found %s of their prompt cached, other turns %s; %.2f bytes per token, from %s replies",
		percent(r.Resident.CachedPercent), percent(r.NonResident.CachedPercent), r.BytesPerToken, humanize.Comma(int64(r.Read)))
}

func TestPanelInBrowser(t *testing.T) {
	browser := startChromium(t)
	f := startFleet(t)
	panel := f.panel

	if soak := soakDuration(t); soak > 0 {
		f.soak(t, soak)
	}
	// Load: nine conversations of four turns (8 tokens, about 200 ms of
	// decoding each), then four requests held open.
	convs := testrun.Sessions("panel-conv", 9)
	for range 4 {
		testrun.Concurrently(len(convs), func(i int) { f.turn(t, convs[i], 8) })
	}
	f.holdRequests(t, convs[:4])
	testrun.Eventually(t, 10*time.Second, "4 requests in flight, seen by the engines' metrics", func() bool {
		st := f.status(t)
		running := 0.0
		for _, r := range st.Replicas {
			running += r.Running
		}
		return st.InFlight == 4 && running == 4
	})

	t.Run("basic_auth guards the page and its JSON", func(t *testing.T) {
		for _, target := range []string{panel.url, panel.url + "?format=json"} {
			if resp, _ := panel.get(t, target, "", false); resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s without credentials: %s, want 401", target, resp.Status)
			}
		}
		data, body := panel.data(t)
		if len(data.Models) != 1 || len(data.Models[0].Replicas) != replicas {
			t.Fatalf("JSON twin: %+v", data.Models)
		}
		var cached, computed float64
		for i := range data.Models[0].Stats.At {
			cached += data.Models[0].Stats.Cached[i]
			computed += data.Models[0].Stats.Computed[i]
		}
		if cached <= 0 || computed <= 0 {
			t.Errorf("JSON twin's hour of stats: cached %v, computed %v tokens/s summed; want both > 0", cached, computed)
		}
		for _, c := range convs {
			if strings.Contains(string(body), c) {
				t.Errorf("JSON twin shows session ID %q", c)
			}
		}
		if flows := data.Models[0].LoadControl.Flows; len(flows) != 2 || strings.Contains(string(body), apiKeyPrefix) {
			t.Errorf("JSON twin's flows %+v, want the two people's, by their keys' hashes only", flows)
		}
	})

	if err := chromedp.Do(browser,
		chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
			_, err := cdp.Call(ctx, tgt, network.Enable, network.EnableParams{})
			return err
		}),
		chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
			_, err := cdp.Call(ctx, tgt, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
				Headers: network.Headers{"Authorization": panel.authorization},
			})
			return err
		}),
		chromedp.Navigate(panel.url),
	); err != nil {
		t.Fatal(err)
	}
	data, _ := panel.data(t)
	refresh := time.Duration(data.RefreshMS) * time.Millisecond

	t.Run("one row per replica, numbers and badges as the admin JSON", func(t *testing.T) {
		waitPanel(t, browser, 3*refresh, "page equal to the admin JSON", func(page *pageState) []string {
			problems := matchesStatus(page, f.status(t))
			if !strings.HasPrefix(page.Since, "Counters since ") {
				problems = append(problems, fmt.Sprintf("since line %q", page.Since))
			}
			if !strings.Contains(page.Text, "Working set: ") || strings.Contains(page.Text, "not known yet") {
				problems = append(problems, "no working set against the replicas' KV capacity")
			}
			want := "every prompt counted whole"
			if lc := f.status(t).LoadControl; lc.SharedPrefixTokens != nil {
				want = "counted once per replica (read from the " + lc.SharedPrefixSource + ")"
			}
			if !strings.Contains(page.Text, want) {
				problems = append(problems, fmt.Sprintf("working set without %q", want))
			}
			if want := replyUsageLine(f.status(t).LoadControl.Replies); !strings.Contains(page.Text, want) {
				problems = append(problems, fmt.Sprintf("no line %q on the page", want))
			}
			for _, c := range convs {
				if strings.Contains(page.Text, c) {
					problems = append(problems, "page shows session ID "+c)
				}
			}
			if strings.Contains(page.Text, apiKeyPrefix) {
				problems = append(problems, "page shows an API key")
			}
			return problems
		})
	})

	t.Run("the chart draws cached and computed prompt tokens", func(t *testing.T) {
		waitPanel(t, browser, 3*refresh, "chart series drawn", func(page *pageState) []string {
			var problems []string
			for _, series := range []string{"cached", "computed", "generation"} {
				if page.Chart[series] <= 0 {
					problems = append(problems, fmt.Sprintf("%s series drawn %v px high", series, page.Chart[series]))
				}
			}
			return problems
		})
		shot, err := chromedp.Run(browser, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.ArtifactDir(), "panel.png")
		if err := os.WriteFile(path, shot, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	})

	t.Run("admin toggles show within one refresh", func(t *testing.T) {
		for _, change := range []struct {
			path  string
			body  any
			badge string
			want  string
		}{
			{"/warden/models/m/affinity", map[string]bool{"enabled": false}, "affinity", "Affinity off"},
			{"/warden/models/m/spill_threshold", map[string]int{"value": 5}, "spill", "Spill threshold 5 manual"},
			{"/warden/models/m/affinity", map[string]bool{"enabled": true}, "affinity", "Affinity on"},
			{"/warden/models/m/spill_threshold", map[string]bool{"auto": true}, "spill", "Moves by expected cost"},
		} {
			if err := f.caddy.Do(http.MethodPost, change.path, change.body, nil); err != nil {
				t.Fatal(err)
			}
			// One refresh, plus time for the fetch and a render.
			took := waitPanel(t, browser, refresh+time.Second, change.want, func(page *pageState) []string {
				if got := page.Badges[change.badge]; got != change.want {
					return []string{fmt.Sprintf("badge %s shows %q", change.badge, got)}
				}
				return nil
			})
			t.Logf("%s shown after %v", change.want, took.Round(10*time.Millisecond))
		}
	})
}
