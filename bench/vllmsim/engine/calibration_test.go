package engine

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// DESIGN §5 estimates for 4 x A4000 / Qwen3-4B bf16, typed in from the design brief so that a
// profile drifting away from them fails this test.
const (
	designChunkOverhead  = 25 * time.Millisecond
	designPerPromptToken = 190 * time.Microsecond
	designWeightsBytes   = 8.05e9
	designKVBytes        = 147456
	designEffBandwidth   = 0.8 * 448e9
	designDecodeOverhead = 2 * time.Millisecond
	designKVTokens       = 40_000
)

func designColdTTFT(promptTokens int) time.Duration {
	chunks := (promptTokens + 2047) / 2048
	return time.Duration(chunks)*designChunkOverhead + time.Duration(promptTokens)*designPerPromptToken
}

func designDecodeTokensPerSecond(batch, context int) float64 {
	step := (designWeightsBytes+float64(batch*context)*designKVBytes)/designEffBandwidth + designDecodeOverhead.Seconds()
	return float64(batch) / step
}

// measureColdTTFT serves one prompt on an empty cache and returns its time to first token.
func measureColdTTFT(t *testing.T, p Profile, promptTokens int) time.Duration {
	e := newEngine(t, p)
	serve(t, e, request(seq(1, promptTokens), 1), 0)
	return time.Duration(e.Stats().TTFT.Sum * float64(time.Second))
}

// measureDecodeRate prefills batch requests of context tokens, then returns the generated
// tokens per second over 32 decode steps.
func measureDecodeRate(t *testing.T, p Profile, batch, context int) float64 {
	e := newEngine(t, p)
	for i := range batch {
		if err := e.Add(request(seq(i*100_000, context), 64), 0); err != nil {
			t.Fatal(err)
		}
	}
	for e.Stats().TTFT.Count < uint64(batch) {
		e.Step(0)
	}
	var elapsed time.Duration
	tokens := 0
	for range 32 {
		dur, events := e.Step(0)
		elapsed += dur
		tokens += len(events)
	}
	return float64(tokens) / elapsed.Seconds()
}

func within25Percent(measured, estimate float64) bool {
	return math.Abs(measured-estimate) <= 0.25*estimate
}

// TestCalibrationAgainstDesign measures the default profile and prints the README's
// calibration table (from bench/): go test -run TestCalibrationAgainstDesign -v ./vllmsim/engine
func TestCalibrationAgainstDesign(t *testing.T) {
	p := Profiles[DefaultProfile]
	var table strings.Builder
	table.WriteString("| Quantity | Simulator | DESIGN §5 estimate | Difference |\n|---|---|---|---|\n")
	row := func(name string, measured, estimate float64, unit string) {
		fmt.Fprintf(&table, "| %s | %.1f %s | %.1f %s | %+.1f%% |\n", name, measured, unit, estimate, unit, 100*(measured-estimate)/estimate)
		if !within25Percent(measured, estimate) {
			t.Errorf("%s: simulator %.1f %s, design %.1f %s: more than 25%% apart", name, measured, unit, estimate, unit)
		}
	}
	for _, n := range []int{1024, 4096, 8192, 16384} {
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		row(fmt.Sprintf("cold prefill TTFT, %d tokens", n), ms(measureColdTTFT(t, p, n)), ms(designColdTTFT(n)), "ms")
	}
	for _, batch := range []int{1, 8, 32} {
		row(fmt.Sprintf("decode, batch %d, 1k context", batch), measureDecodeRate(t, p, batch, 1024), designDecodeTokensPerSecond(batch, 1024), "tok/s")
	}
	row("KV capacity", float64(p.KVCapacityTokens()), designKVTokens, "tokens")
	t.Log("\n" + table.String())
}

// measureHostHitTTFT serves a prompt, evicts it from the GPU with two others that the host
// tier also keeps, then serves it again: its blocks load back from the host tier. It returns
// that request's time to first token and the tier's load bandwidth.
func measureHostHitTTFT(t *testing.T, p Profile, promptTokens int) (time.Duration, float64) {
	e := newEngine(t, p)
	prompt := seq(1, promptTokens)
	now := serve(t, e, request(prompt, 1), 0)
	for i := range 2 {
		now = serve(t, e, request(seq(1_000_000*(i+1), p.KVCapacityTokens()/2), 1), now)
	}
	if e.CachedTokens(prompt) != 0 || e.HostCachedTokens(prompt) != promptTokens/p.BlockSize*p.BlockSize {
		t.Fatalf("%d tokens: %d on the GPU, %d in the host tier; want all in the host tier only",
			promptTokens, e.CachedTokens(prompt), e.HostCachedTokens(prompt))
	}
	before := e.Stats()
	serve(t, e, request(prompt, 1), now)
	after := e.Stats()
	loads := after.Offload[CPUToGPU]
	return time.Duration((after.TTFT.Sum - before.TTFT.Sum) * float64(time.Second)), loads.Bytes / loads.Seconds
}

// TestHostTierCalibration measures what a host hit saves on the default profile with a host
// tier 4x its GPU cache, and prints the README's table (from bench/):
// go test -run TestHostTierCalibration -v ./vllmsim/engine
// It fails if the tier's link drifts from its bandwidth, if a hit costs more than 25% over
// the load plus one step, or if it saves less than the published lower bound (2x).
func TestHostTierCalibration(t *testing.T) {
	p := Profiles[DefaultProfile]
	p.KVOffloadingSize = 22 // GiB: 10,012 blocks, 4x the 2,500 on the GPU
	var table strings.Builder
	table.WriteString("| Prompt | Cold TTFT | TTFT with a host hit | Saved |\n|---|---|---|---|\n")
	for _, n := range []int{1024, 4096, 16384, 32000} {
		cold := measureColdTTFT(t, p, n)
		hit, bandwidth := measureHostHitTTFT(t, p, n)
		if math.Abs(bandwidth-p.KVOffloadBandwidth) > 0.01*p.KVOffloadBandwidth {
			t.Errorf("%d tokens: loads ran at %.3g B/s, the profile says %.3g", n, bandwidth, p.KVOffloadBandwidth)
		}
		loaded := n / p.BlockSize * p.BlockSize
		estimate := p.TransferTime(float64(loaded)*p.KVBytesPerToken) + p.StepTime(n-(loaded-1), loaded-1)
		if !within25Percent(float64(hit), float64(estimate)) {
			t.Errorf("%d tokens: a host hit took %v to the first token, the load and one step %v", n, hit, estimate)
		}
		if speedup := float64(cold) / float64(hit); speedup < 2 {
			t.Errorf("%d tokens: a host hit saved only %.1fx (cold %v, hit %v)", n, speedup, cold, hit)
		}
		fmt.Fprintf(&table, "| %d tokens | %.0f ms | %.1f ms | %.1fx |\n", n,
			float64(cold)/float64(time.Millisecond), float64(hit)/float64(time.Millisecond), float64(cold)/float64(hit))
	}
	t.Log("\n" + table.String())
}
