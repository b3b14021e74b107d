package main

import (
	"bytes"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmwarden/caddy-warden/bench/lab"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/server"
)

// gpuKVGiB is the GPU KV cache of one replica of the default profile with
// blocks KV blocks.
func gpuKVGiB(blocks int) float64 {
	p := engine.Profiles[engine.DefaultProfile]
	p.NumGPUBlocks = blocks
	return p.KVCacheGiB()
}

func TestHostTierSizeFlag(t *testing.T) {
	var gib, times float64
	size := hostTierSize{&gib, &times}
	for _, c := range []struct {
		in        string
		gib, x    float64
		formatted string
	}{
		{"22", 22, 0, "22"}, {"4x", 0, 4, "4x"}, {" 1.5x", 0, 1.5, "1.5x"}, {"0", 0, 0, "0"}, {"64", 64, 0, "64"},
	} {
		if err := size.Set(c.in); err != nil || gib != c.gib || times != c.x || size.String() != c.formatted {
			t.Errorf("%q: %g GiB, %gx, %q, %v", c.in, gib, times, size.String(), err)
		}
	}
	for _, bad := range []string{"", "x", "0x", "-1", "-2x", "4GiB", "NaN", "Inf", "4xx"} {
		if err := size.Set(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// With --kv-offloading-size 4x every replica of a lab run has a host tier of
// four times its GPU KV cache, whatever the order of the flags, and the
// table shows its hits; without it, nothing of the tier shows.
func TestLabTakesTheHostTier(t *testing.T) {
	dir := t.TempDir()
	args := []string{"lab", "--sessions", "8", "--duration", "20s", "--seeds", "1", "--policies", "warden,round_robin", "--turns", "3", "--max-model-len", "16384"}
	out, rows := runForRows(t, filepath.Join(dir, "tier.json"), append(args, "--kv-offloading-size", "4x", "--num-gpu-blocks", "1100")...)
	want := 4 * gpuKVGiB(1100)
	hostHits := 0.0
	for _, r := range rows {
		if r.HostTierGiB != want {
			t.Errorf("%s: a tier of %g GiB, want %g", r.Policy, r.HostTierGiB, want)
		}
		hostHits += r.HostHitPercent
	}
	if hostHits == 0 {
		t.Error("no row loaded a prompt from the host tier")
	}
	for _, s := range []string{"Host hits %", "with a host KV tier of 9.668 GiB each (4x the GPU KV cache)"} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
	out, rows = runForRows(t, filepath.Join(dir, "none.json"), append(args, "--num-gpu-blocks", "1100")...)
	for _, r := range rows {
		if r.HostTierGiB != 0 || r.HostHitPercent != 0 {
			t.Errorf("%s without a tier: %+v", r.Policy, r)
		}
	}
	if strings.Contains(out, "Host hits") || strings.Contains(out, "host KV tier") {
		t.Errorf("output without a tier mentions one:\n%s", out)
	}
}

func TestGridTakesTheHostTier(t *testing.T) {
	_, rows := runForRows(t, filepath.Join(t.TempDir(), "grid.json"), "grid",
		"--think", "3s", "--sessions", "2", "--replicas", "2", "--variants", "none", "--warmup", "5s", "--duration", "10s",
		"--seeds", "1", "--policies", "warden,least_conn", "--kv-offloading-size", "10")
	if len(rows) != 2 {
		t.Fatalf("%d rows", len(rows))
	}
	for _, r := range rows {
		if r.HostTierGiB != 10 {
			t.Errorf("%s: a tier of %g GiB, want 10", r.Policy, r.HostTierGiB)
		}
	}
}

// shapes sizes each shape's tier by its own GPU KV cache.
func TestShapesTakeTheHostTier(t *testing.T) {
	out, rows := runForRows(t, filepath.Join(t.TempDir(), "shapes.json"), "shapes",
		"--count", "1", "--seeds", "1", "--subjects", "warden", "--baselines", "least_conn", "--kv-offloading-size", "2x")
	s := lab.DrawShapes(1, 1, lab.DefaultConfig().Profile.BlockSize)[0]
	for _, r := range rows {
		if want := 2 * gpuKVGiB(s.NumGPUBlocks); r.HostTierGiB != want {
			t.Errorf("%s: a tier of %g GiB, want %g", r.Policy, r.HostTierGiB, want)
		}
	}
	if !strings.Contains(out, "replicas with a host KV tier (--kv-offloading-size=2x)") {
		t.Errorf("output does not name the tier:\n%s", out)
	}
}

// Every simulator `wardenbench run` starts reads the tier from its flags.
func TestRunPassesTheHostTierToEverySimulator(t *testing.T) {
	for flagValue, want := range map[string]int{"4x": 4 * 3000, "0": 0} {
		opts, err := parseRunOptions([]string{"--kv-offloading-size", flagValue, "--num-gpu-blocks", "3000"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		o := opts.e2eOptions(1, setup{1, "none"}, nil)
		cfg, err := server.ParseFlags(o.SimArgs, new(bytes.Buffer))
		if err != nil {
			t.Fatalf("vllmsim refuses %v: %v", o.SimArgs, err)
		}
		if got := cfg.Profile.NumHostBlocks(); got != want || cfg.Profile.NumGPUBlocks != 3000 {
			t.Errorf("--kv-offloading-size %s: vllmsim gets %d host blocks and %d GPU blocks, want %d and 3000",
				flagValue, got, cfg.Profile.NumGPUBlocks, want)
		}
	}
}
