package server

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/dplb"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
)

func TestParseFlagsOverridesProfileNumbers(t *testing.T) {
	cfg, err := ParseFlags(strings.Fields(
		"--port 8001 --data-parallel-size 4 --num-gpu-blocks 3000 --step-overhead 3ms --mem-efficiency 0.7 "+
			"--dp-lb v027 --served-model-name a,b --output-len uniform:32:max --time-scale 10 --fault-health-status 503"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := engine.Profiles[engine.DefaultProfile]
	want.NumGPUBlocks, want.StepOverhead, want.MemEfficiency = 3000, 3*time.Millisecond, 0.7
	if cfg.Profile != want {
		t.Errorf("profile %+v\nwant    %+v", cfg.Profile, want)
	}
	if cfg.Port != 8001 || cfg.DataParallelSize != 4 || cfg.LB != dplb.V027 || cfg.TimeScale != 10 ||
		strings.Join(cfg.ServedModelNames, ",") != "a,b" || cfg.OutputLen.String() != "uniform:32:max" ||
		cfg.Faults.HealthStatus != 503 || cfg.Host != "127.0.0.1" || !cfg.CountTokens {
		t.Errorf("config %+v", cfg)
	}
	if cfg, err := ParseFlags([]string{"--count-tokens=false"}, io.Discard); err != nil || cfg.CountTokens {
		t.Errorf("--count-tokens=false: serves count_tokens %v (%v)", cfg.CountTokens, err)
	}
}

// TestProfileArgsCarryTheHostTier checks that a profile's Args, which wardenbench gives each
// vllmsim it launches, give the process the same host tier.
func TestProfileArgsCarryTheHostTier(t *testing.T) {
	p := engine.Profiles[engine.DefaultProfile]
	p.KVOffloadingSize, p.KVOffloadBandwidth = 22, 12.5e9
	cfg, err := ParseFlags(p.Args(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Profile != p || cfg.Profile.NumHostBlocks() != 10012 {
		t.Fatalf("profile %+v\nwant    %+v", cfg.Profile, p)
	}
}

func TestParseFlagsFitsMaxModelLenToTheCache(t *testing.T) {
	cfg, err := ParseFlags([]string{"--num-gpu-blocks", "1000"}, io.Discard)
	if err != nil || cfg.Profile.MaxModelLen != 16000 {
		t.Fatalf("max_model_len %d, err %v; want it shrunk to the 16000-token cache", cfg.Profile.MaxModelLen, err)
	}
	if _, err := ParseFlags([]string{"--num-gpu-blocks", "1000", "--max-model-len", "20000"}, io.Discard); err == nil {
		t.Fatal("an explicit max_model_len above the cache capacity was accepted")
	}
}

func TestParseFlagsRejectsNonsense(t *testing.T) {
	for _, args := range []string{
		"--profile h100", "--dp-lb random", "--output-len normal:3", "--time-scale 0",
		"--fault-metrics weird", "--fault-refuse", "--max-num-seqs 0", "--no-such-flag", "stray",
		"--kv-offloading-size -1", "--kv-offloading-size 0.001", "--kv-offloading-size 8 --kv-offloading-backend lmcache",
	} {
		if _, err := ParseFlags(strings.Fields(args), io.Discard); err == nil {
			t.Errorf("%q was accepted", args)
		}
	}
	if _, err := ParseFlags(strings.Fields("--fault-refuse --fault-refuse-for 2s"), io.Discard); err != nil {
		t.Errorf("a timed refusal was rejected: %v", err)
	}
}

func TestOutputLenDraws(t *testing.T) {
	fixed, _ := ParseOutputLen("max")
	if fixed.Draw(1, 256) != 256 {
		t.Fatal("max must give max_tokens")
	}
	spread, err := ParseOutputLen("uniform:32:max")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for seed := range uint64(2000) {
		n := spread.Draw(seed, 256)
		if n < 32 || n > 256 {
			t.Fatalf("drew %d outside [32, 256]", n)
		}
		seen[n] = true
	}
	if len(seen) < 200 || spread.Draw(7, 256) != spread.Draw(7, 256) {
		t.Fatalf("draws are not spread (%d distinct) or not deterministic", len(seen))
	}
	capped, _ := ParseOutputLen("uniform:50:100")
	if n := capped.Draw(3, 10); n != 10 {
		t.Fatalf("max_tokens 10 below the range gave %d", n)
	}
	for _, bad := range []string{"uniform:0:5", "uniform:9:5", "uniform:5", "lognormal:1:2"} {
		if _, err := ParseOutputLen(bad); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}
