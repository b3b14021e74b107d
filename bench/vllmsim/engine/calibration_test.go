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
