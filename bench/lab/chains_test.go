package lab

import (
	"testing"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
	"github.com/lmwarden/caddy-warden/kvevents"
)

// TestKVEventsFollowTheGPUCacheOnly plays prompts through an engine with a
// host tier, more than its GPU cache holds, then some that only the tier still holds (loads back from
// the tier), and checks that the chains its events build say of each prompt
// what the GPU cache holds: the host tier's stores and evictions, which carry
// the same hashes, must not count as GPU copies.
func TestKVEventsFollowTheGPUCacheOnly(t *testing.T) {
	p := engine.Profiles[engine.DefaultProfile]
	p.NumGPUBlocks, p.MaxModelLen = 64, 1024
	p.KVOffloadingSize = 4 * 64 * float64(p.BlockSize) * p.KVBytesPerToken / (1 << 30) // 4x the GPU's blocks
	e, err := engine.New(p)
	if err != nil {
		t.Fatal(err)
	}
	e.EnableKVEvents()
	chains := kvevents.NewChains(0)
	var prompts [][]uint32
	for i := range 20 {
		prompt := make([]uint32, 300)
		for j := range prompt {
			prompt[j] = uint32(1000*i + j)
		}
		prompts = append(prompts, prompt)
	}
	seen := map[engine.Medium]map[engine.KVEventKind]int{engine.MediumGPU: {}, engine.MediumCPU: {}}
	now := e.Profile().StepOverhead
	for _, prompt := range append(prompts, prompts[8:12]...) {
		if err := e.Add(&engine.Request{Prompt: prompt, MaxTokens: 1, Output: []uint32{7}}, now); err != nil {
			t.Fatal(err)
		}
		for {
			dur, _ := e.Step(now)
			events := e.TakeKVEvents()
			for _, ev := range events {
				seen[ev.Medium][ev.Kind]++
			}
			applyKVEvents(chains, events)
			if dur == 0 {
				break
			}
			now += dur
		}
	}
	for _, m := range []engine.Medium{engine.MediumGPU, engine.MediumCPU} {
		if seen[m][engine.BlockStored] == 0 || seen[m][engine.BlockRemoved] == 0 {
			t.Fatalf("%v events: %v; the test needs stores and removals of both tiers", m, seen[m])
		}
	}
	if e.Stats().ExternalPrefixCacheHits == 0 {
		t.Fatal("no prompt was loaded back from the host tier")
	}
	bs := p.BlockSize
	for i, prompt := range prompts {
		if got, want := chains.Leading(engine.BlockHashes(prompt, bs)), e.CachedTokens(prompt)/bs; got != want {
			t.Errorf("prompt %d: the events say %d leading blocks are cached, the GPU holds %d", i, got, want)
		}
	}
}
