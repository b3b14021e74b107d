package selection

import (
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// A replica's fill is Fill until a reply reports its cached part, then
// FillMax; it falls a step for each window of resident turns that missed,
// down to FillMin, and rises for each that found their prompts cached.
func TestFillFollowsTheResidentTurnsHits(t *testing.T) {
	r := newTestRouter(1, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 1000, Fill: 0.95, FillMin: 0.92, FillMax: 0.98, Linger: time.Minute, Quantum: -1,
	}})
	fill := func() float64 { return r.Status().Replicas[0].Fill }
	at := t0
	turn := func(reply loadcontrol.Reply) {
		at = at.Add(time.Second)
		tk := r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, at, nil)
		mustState(t, tk, loadcontrol.Admitted)
		tk.End(at, reply)
	}
	window := func(cached int) {
		for range fillWindow {
			turn(loadcontrol.Reply{PromptTokens: 100, CachedTokens: cached, CacheReported: true})
		}
	}
	near := func(got, want float64) bool { return got > want-1e-9 && got < want+1e-9 }
	turn(loadcontrol.Reply{PromptTokens: 100})
	if got := fill(); !near(got, 0.95) {
		t.Fatalf("fill %v before any cached part was reported, want Fill 0.95", got)
	}
	turn(loadcontrol.Reply{PromptTokens: 100, CachedTokens: 100, CacheReported: true}) // resident: the window's first
	if got := fill(); !near(got, 0.98) {
		t.Fatalf("fill %v once the cached part was reported, want FillMax 0.98", got)
	}
	for range fillWindow - 1 {
		turn(loadcontrol.Reply{PromptTokens: 100, CachedTokens: 0, CacheReported: true})
	}
	for i, want := range []float64{0.96, 0.94, 0.92, 0.92} {
		if i > 0 {
			window(50)
		}
		if got := fill(); !near(got, want) {
			t.Fatalf("after %d windows of misses, fill %v, want %v", i+1, got, want)
		}
	}
	window(95)
	if got := fill(); !near(got, 0.94) {
		t.Fatalf("after a window of hits, fill %v, want 0.94", got)
	}
}

// A reload that changes the range starts each replica's fill anew at the
// range's upper end, within it.
func TestFillRangeChangedByAReload(t *testing.T) {
	cfg := Config{Admission: loadcontrol.Config{Enabled: true, CapacityTokens: 1000, Fill: 0.95, FillMin: 0.5, FillMax: 1,
		Linger: time.Minute, Quantum: -1}}
	r := newTestRouter(1, cfg)
	at := t0
	for range 40 * fillWindow { // misses: the fill falls to 0.5
		at = at.Add(time.Second)
		r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, at, nil).End(at, loadcontrol.Reply{PromptTokens: 100, CacheReported: true})
	}
	if got := r.Status().Replicas[0].Fill; got != 0.5 {
		t.Fatalf("fill %v after misses, want 0.5", got)
	}
	cfg.Affinity = true
	cfg.Admission.FillMin, cfg.Admission.FillMax = 0.92, 0.98
	r.reload(cfg, servers(1))
	if got := r.Status().Replicas[0].Fill; got != 0.98 {
		t.Fatalf("fill %v after a reload to fill_range 0.92 0.98, want 0.98", got)
	}
}

// fillWindow is loadcontrol's: the resident turns a fill step is judged on.
const fillWindow = 4
