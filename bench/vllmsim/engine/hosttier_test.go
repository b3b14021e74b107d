package engine

import (
	"flag"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// withHostTier gives p a host tier of times its GPU cache.
func withHostTier(p Profile, times float64) Profile {
	return withHostBlocks(p, int(times*float64(p.NumGPUBlocks)))
}

// withHostBlocks gives p a host tier of n blocks.
func withHostBlocks(p Profile, n int) Profile {
	p.KVOffloadingSize = (float64(n) + 0.5) * p.BlockBytes() / (1 << 30)
	return p
}

// hostBlocksOf counts the prompt's leading full blocks stored and ready in the host tier.
func hostBlocksOf(e *Engine, prompt []uint32) int {
	hashes := BlockHashes(prompt, e.profile.BlockSize)
	hints := slices.Repeat([]int32{-1}, len(hashes))
	return e.host.lookup(hashes, hints)
}

// hostRemovals returns the blocks the host tier's events among events removed, in order.
func hostRemovals(events []KVEvent) []uint64 {
	var removed []uint64
	for _, ev := range hostEvents(events) {
		if ev.Kind == BlockRemoved {
			removed = append(removed, ev.BlockHashes...)
		}
	}
	return removed
}

// hostEvents returns the host tier's events among events.
func hostEvents(events []KVEvent) []KVEvent {
	var out []KVEvent
	for _, ev := range events {
		if ev.Medium == MediumCPU {
			out = append(out, ev)
		}
	}
	return out
}

func TestHostTierSizeIsVLLMsSlotCount(t *testing.T) {
	p := Profiles[DefaultProfile]
	if p.HostTier() || p.NumHostBlocks() != 0 {
		t.Fatal("the default profile has a host tier")
	}
	p.KVOffloadingSize = 22
	// 22 GiB over blocks of 16 tokens x 147,456 B.
	if got := p.NumHostBlocks(); got != 10012 {
		t.Fatalf("22 GiB holds %d blocks, want 10012", got)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]func(*Profile){
		"negative size":     func(p *Profile) { p.KVOffloadingSize = -1 },
		"smaller than one":  func(p *Profile) { p.KVOffloadingSize = 0.001 },
		"lmcache backend":   func(p *Profile) { p.KVOffloadingBackend = "lmcache" },
		"no link bandwidth": func(p *Profile) { p.KVOffloadBandwidth = 0 },
		"no KV bytes":       func(p *Profile) { p.KVBytesPerToken = 0 },
	} {
		q := p
		bad(&q)
		if err := q.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestHostTierOfZeroChangesNothing runs the same workload on the default profile and on one
// given --kv-offloading-size=0 (and another link bandwidth, which only a tier uses): every
// step, token and counter must be the same. A real tier must change them, or the comparison
// proves nothing.
func TestHostTierOfZeroChangesNothing(t *testing.T) {
	base := traceProfile()
	zero := base
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	zero.RegisterFlags(fs)
	if err := fs.Parse([]string{"--kv-offloading-size=0", "--kv-offload-bandwidth=1e6"}); err != nil {
		t.Fatal(err)
	}
	if zero.HostTier() {
		t.Fatal("--kv-offloading-size=0 made a tier")
	}
	for seed := range uint64(3) {
		d1, s1 := trace(t, base, seed)
		d2, s2 := trace(t, zero, seed)
		if d1 != d2 || s1 != s2 {
			t.Fatalf("seed %d: a tier of 0 changed the results:\n%+v\n%+v", seed, s1, s2)
		}
		if s1.ExternalPrefixCacheQueries != 0 || s1.Offload != [numDirections]Transfers{} || s1.PromptTokensBySource[SourceExternalKVTransfer] != 0 {
			t.Fatalf("seed %d: tier counters moved without a tier: %+v", seed, s1)
		}
		if d3, s3 := trace(t, withHostTier(base, 4), seed); d3 == d1 || s3.ExternalPrefixCacheHits == 0 {
			t.Fatalf("seed %d: a host tier 4x the cache changed nothing: %+v", seed, s3)
		}
	}
}

func TestPromptBlocksAreStoredAsTheyFill(t *testing.T) {
	p := withHostBlocks(smallProfile(4, 64), 16)
	p.MaxNumBatchedTokens = 8
	e := newEngine(t, p)
	e.EnableKVEvents()
	prompt := seq(100, 20) // 5 blocks; the reply fills a 6th, which is not stored
	chain := BlockHashes(prompt, 4)
	if err := e.Add(request(prompt, 6), 0); err != nil {
		t.Fatal(err)
	}
	var now time.Duration
	var stored [][]uint64
	for step := 0; ; step++ {
		dur, _ := e.Step(now)
		if dur == 0 {
			break
		}
		now += dur
		var blocks []uint64
		for _, ev := range hostEvents(e.TakeKVEvents()) {
			if ev.Kind != BlockStored {
				t.Fatalf("step %d: %+v", step, ev)
			}
			blocks = append(blocks, ev.BlockHashes...)
		}
		stored = append(stored, blocks)
	}
	// Chunks of 8, 8 and 4 prompt tokens fill 2, 2 and 1 blocks; decode steps store none.
	want := [][]uint64{chain[0:2], chain[2:4], chain[4:5]}
	for i, w := range want {
		if !slices.Equal(stored[i], w) {
			t.Fatalf("step %d stored %x, want %x", i, stored[i], w)
		}
	}
	for i, s := range stored[len(want):] {
		if len(s) > 0 {
			t.Fatalf("decode step %d stored %x", len(want)+i, s)
		}
	}
	if got := hostBlocksOf(e, prompt); got != 5 || e.host.used() != 5 {
		t.Fatalf("host tier holds %d blocks (%d of the prompt's), want the prompt's 5", e.host.used(), got)
	}
	st := e.Stats().Offload[GPUToCPU]
	bb := p.BlockBytes()
	wantSeconds := (2*p.TransferTime(2*bb) + p.TransferTime(bb)).Seconds()
	if st.Sizes.Count != 3 || st.Bytes != 5*bb || st.Sizes.Sum != 5*bb || st.Seconds != wantSeconds {
		t.Fatalf("GPU_to_CPU transfers %+v, want 3 of 5 blocks (%g B) taking %gs", st, 5*bb, wantSeconds)
	}
}

func TestHostTierEvictsLeastRecentlyUsedAndLookupsRefreshIt(t *testing.T) {
	a, b, c := seq(100, 17), seq(200, 17), seq(300, 9) // 4, 4 and 2 full blocks
	for _, lookAgain := range []bool{false, true} {
		e := newEngine(t, withHostBlocks(smallProfile(4, 16), 8))
		e.EnableKVEvents()
		now := serve(t, e, request(a, 1), 0)
		now = serve(t, e, request(b, 1), now)
		if lookAgain {
			// A is all on the GPU: nothing to load, but the lookup touches its host blocks.
			now = serve(t, e, request(a, 1), now)
		}
		e.TakeKVEvents()
		serve(t, e, request(c, 1), now)
		older, newer := b, a
		if !lookAgain {
			older, newer = a, b
		}
		// C's 2 blocks evict the older prompt's last 2: its first blocks were touched last.
		chain := BlockHashes(older, 4)
		if removed := hostRemovals(e.TakeKVEvents()); !slices.Equal(removed, []uint64{chain[3], chain[2]}) {
			t.Errorf("looked again %v: evicted %x, want %x", lookAgain, removed, chain[2:])
		}
		if hostBlocksOf(e, older) != 2 || hostBlocksOf(e, newer) != 4 || hostBlocksOf(e, c) != 2 {
			t.Errorf("looked again %v: host holds %d of the older prompt, %d of the newer, %d of C; want 2, 4, 2",
				lookAgain, hostBlocksOf(e, older), hostBlocksOf(e, newer), hostBlocksOf(e, c))
		}
	}
}

// evictedFromGPU serves prompt, then a request that needs every GPU block for its reply (so
// that it stores nothing in the host tier), leaving prompt only in the host tier.
func evictedFromGPU(t *testing.T, p Profile, prompt []uint32) (*Engine, time.Duration) {
	t.Helper()
	e := newEngine(t, p)
	now := serve(t, e, request(prompt, 1), 0)
	now = serve(t, e, request(seq(5000, 3), p.KVCapacityTokens()-3), now)
	if e.CachedTokens(prompt) != 0 {
		t.Fatalf("the prompt is still on the GPU: %d tokens", e.CachedTokens(prompt))
	}
	return e, now
}

// tierTestProfile has a GPU cache of 8 blocks of 4 tokens, a host tier of 12.
func tierTestProfile(bandwidth float64) Profile {
	p := withHostBlocks(smallProfile(4, 8), 12)
	p.KVOffloadBandwidth = bandwidth
	return p
}

func TestHostHitParksTheRequestWhileItsBlocksLoad(t *testing.T) {
	prompt := seq(100, 17) // 4 full blocks
	for _, bandwidth := range []float64{1e8, 1e12} {
		p := tierTestProfile(bandwidth)
		e, now := evictedFromGPU(t, p, prompt)
		if got := e.HostCachedTokens(prompt); got != 16 {
			t.Fatalf("host tier would load %d tokens, want 16", got)
		}
		before := e.Stats()
		again := request(prompt, 1)
		if err := e.Add(again, now); err != nil {
			t.Fatal(err)
		}
		load := p.TransferTime(4 * p.BlockBytes())
		// The step that starts the load computes nothing, nor do those that follow until it
		// ends: each is an empty step polling the copy.
		waited := time.Duration(0)
		for waited < load {
			dur, events := e.Step(now + waited)
			if dur != p.StepOverhead || len(events) != 0 {
				t.Fatalf("bandwidth %g: a step while loading took %v with %d events, want %v and none", bandwidth, dur, len(events), p.StepOverhead)
			}
			if s := e.Stats(); s.Waiting != 1 || s.Running != 0 || s.KVUsage != 4.0/8 {
				t.Fatalf("bandwidth %g: while loading %+v, want 1 waiting holding 4 of 8 blocks", bandwidth, s)
			}
			waited += dur
		}
		if polls := (load + p.StepOverhead - 1) / p.StepOverhead; waited != polls*p.StepOverhead {
			t.Fatalf("bandwidth %g: waited %v for a load of %v", bandwidth, waited, load)
		}
		// Then only the last prompt token is computed, reading the 16 loaded.
		dur, events := e.Step(now + waited)
		if want := p.StepTime(1, 16); dur != want || len(events) != 1 || !events[0].First {
			t.Fatalf("bandwidth %g: the next step took %v with %v, want %v and the first token", bandwidth, dur, events, want)
		}
		after := e.Stats()
		if ttft := after.TTFT.Sum - before.TTFT.Sum; again.CachedTokens != 16 || math.Abs(ttft-(waited+dur).Seconds()) > 1e-9 {
			t.Fatalf("bandwidth %g: cached %d, TTFT %gs; want 16 and %gs", bandwidth, again.CachedTokens, ttft, (waited + dur).Seconds())
		}
		checkLookup(t, before, after, 17, 0, 16)
		loads := after.Offload[CPUToGPU]
		if loads.Sizes.Count != 1 || loads.Bytes != 4*p.BlockBytes() || loads.Seconds != load.Seconds() {
			t.Fatalf("bandwidth %g: CPU_to_GPU %+v, want one load of 4 blocks in %v", bandwidth, loads, load)
		}
	}
}

// Without a step overhead to poll with, the engine waits for the load in one step.
func TestHostHitWithoutStepOverheadWaitsInOneStep(t *testing.T) {
	p := tierTestProfile(1e8)
	p.StepOverhead = 0
	prompt := seq(100, 17)
	e, now := evictedFromGPU(t, p, prompt)
	if err := e.Add(request(prompt, 1), now); err != nil {
		t.Fatal(err)
	}
	load := p.TransferTime(4 * p.BlockBytes())
	if dur, _ := e.Step(now); dur != load {
		t.Fatalf("the loading step took %v, want the load's %v", dur, load)
	}
	if dur, events := e.Step(now + load); dur != p.StepTime(1, 16) || len(events) != 1 {
		t.Fatalf("the next step took %v with %d events, want %v and the first token", dur, len(events), p.StepTime(1, 16))
	}
}

// checkLookup checks the counters of one request's prefix lookup of queries tokens, local of
// them hit on the GPU and external loaded from the host tier, and of its prompt's sources.
// vLLM counts a prompt cached but for its last token as wholly cached with that token
// recomputed: a local cache hit and a computed token.
func checkLookup(t *testing.T, before, after Stats, queries, local, external uint64) {
	t.Helper()
	delta := func(f func(Stats) uint64) uint64 { return f(after) - f(before) }
	source := func(s PromptSource) uint64 {
		return delta(func(st Stats) uint64 { return st.PromptTokensBySource[s] })
	}
	got := []uint64{
		delta(func(s Stats) uint64 { return s.PrefixCacheQueries }),
		delta(func(s Stats) uint64 { return s.PrefixCacheHits }),
		delta(func(s Stats) uint64 { return s.ExternalPrefixCacheQueries }),
		delta(func(s Stats) uint64 { return s.ExternalPrefixCacheHits }),
		source(SourceLocalCompute), source(SourceLocalCacheHit), source(SourceExternalKVTransfer),
	}
	recomputed := uint64(0)
	if local+external+1 == queries {
		recomputed = 1
	}
	want := []uint64{queries, local, queries - local, external, queries - local - external, local + recomputed, external}
	if !slices.Equal(got, want) {
		t.Fatalf("queries, hits, external queries, external hits, then by source compute, cache, external: %v, want %v", got, want)
	}
}

func TestPrefixSplitBetweenGPUAndHost(t *testing.T) {
	p := tierTestProfile(1e8)
	system := seq(1, 8) // 2 blocks
	prompt := concat(system, seq(100, 9))
	e := newEngine(t, p)
	now := serve(t, e, request(prompt, 1), 0)
	// 6 new blocks take the 3 never used, then the prompt's freed blocks tail first: its last
	// 2 full blocks go, the system prompt's stay.
	now = serve(t, e, request(seq(300, 21), 1), now)
	if gpu, host := e.CachedTokens(prompt), e.HostCachedTokens(prompt); gpu != 8 || host != 8 {
		t.Fatalf("GPU holds %d tokens of the prompt and the host tier %d more, want 8 and 8", gpu, host)
	}
	before := e.Stats()
	again := request(prompt, 1)
	if err := e.Add(again, now); err != nil {
		t.Fatal(err)
	}
	drain(t, e, now)
	load := p.TransferTime(2 * p.BlockBytes())
	polls := (load + p.StepOverhead - 1) / p.StepOverhead
	if ttft := e.Stats().TTFT.Sum - before.TTFT.Sum; math.Abs(ttft-(polls*p.StepOverhead+p.StepTime(1, 16)).Seconds()) > 1e-9 {
		t.Fatalf("TTFT %gs, want the load of 2 blocks (%v, seen after %d polls) and one step", ttft, load, polls)
	}
	if again.CachedTokens != 16 {
		t.Fatalf("cached %d tokens, want 16", again.CachedTokens)
	}
	checkLookup(t, before, e.Stats(), 17, 8, 8)
}

// TestAPromptLoadedWholeRecomputesItsLastToken checks vLLM's rule when the host tier holds
// every block of a prompt that is a whole number of blocks: the GPU hit stops a block short,
// the tier supplies it, and the last token is computed again.
func TestAPromptLoadedWholeRecomputesItsLastToken(t *testing.T) {
	p := tierTestProfile(1e8)
	prompt := seq(100, 16)
	e, now := evictedFromGPU(t, p, prompt)
	before := e.Stats()
	again := request(prompt, 1)
	now = serve(t, e, again, now)
	after := e.Stats()
	if again.CachedTokens != 15 || after.ExternalPrefixCacheHits-before.ExternalPrefixCacheHits != 16 {
		t.Fatalf("cached %d, loaded %d; want 15 and 16", again.CachedTokens, after.ExternalPrefixCacheHits-before.ExternalPrefixCacheHits)
	}
	// vLLM counts the recomputed token as computed and as a cache hit.
	got := after.PromptTokensBySource
	for i := range got {
		got[i] -= before.PromptTokensBySource[i]
	}
	if got != [numPromptSources]uint64{1, 0, 16} {
		t.Fatalf("by source %v, want compute 1, cache hit 0, external 16", got)
	}
	// The GPU prefix cache then holds the loaded blocks.
	if got := e.CachedTokens(prompt); got != 12 {
		t.Fatalf("GPU holds %d tokens after the load, want 12 (the last block is left to compute)", got)
	}
}

func TestRequestsWaitForALoadOfTheirBlocks(t *testing.T) {
	p := withHostBlocks(smallProfile(4, 16), 12) // room for both requests to load at once
	p.KVOffloadBandwidth = 1e8
	prompt := seq(100, 17)
	e, now := evictedFromGPU(t, p, prompt)
	before := e.Stats()
	first, second := request(prompt, 1), request(prompt, 1)
	for _, r := range []*Request{first, second} {
		if err := e.Add(r, now); err != nil {
			t.Fatal(err)
		}
	}
	drain(t, e, now)
	after := e.Stats()
	// The second found the blocks loading, waited, then hit them on the GPU.
	if first.CachedTokens != 16 || second.CachedTokens != 16 {
		t.Fatalf("cached %d and %d, want 16 and 16", first.CachedTokens, second.CachedTokens)
	}
	if loads := after.Offload[CPUToGPU].Sizes.Count - before.Offload[CPUToGPU].Sizes.Count; loads != 1 {
		t.Fatalf("%d loads, want 1", loads)
	}
	if got := after.PrefixCacheHits - before.PrefixCacheHits; got != 16 {
		t.Fatalf("GPU hits grew by %d, want the second request's 16", got)
	}
	if got := after.ExternalPrefixCacheHits - before.ExternalPrefixCacheHits; got != 16 {
		t.Fatalf("host hits grew by %d, want the first request's 16", got)
	}
}

// TestLoadsProtectTheirBlocksAndStoresWait fills a 4-block host tier with one prompt, loads it
// back while another request computes 2 new blocks: that request's store is skipped while the
// load holds every block, then retried and done once the load ends, evicting 2 of the loaded
// blocks (the least recently used).
func TestLoadsProtectTheirBlocksAndStoresWait(t *testing.T) {
	p := withHostBlocks(smallProfile(4, 16), 4)
	p.KVOffloadBandwidth = 4e7 // 59 ms for 4 blocks: a few decode steps
	prompt := seq(100, 17)
	e, now := evictedFromGPU(t, p, prompt)
	e.EnableKVEvents()
	other := seq(500, 9)
	loading, computing := request(prompt, 1), request(other, 10)
	for _, r := range []*Request{loading, computing} {
		if err := e.Add(r, now); err != nil {
			t.Fatal(err)
		}
	}
	stores := e.Stats().Offload[GPUToCPU].Sizes.Count
	dur, _ := e.Step(now)
	now += dur
	if computing.Generated != 1 || loading.state != stateLoading {
		t.Fatal("one request should be loading while the other ran its prefill")
	}
	if hostBlocksOf(e, other) != 0 || e.Stats().Offload[GPUToCPU].Sizes.Count != stores || len(hostEvents(e.TakeKVEvents())) != 0 {
		t.Fatal("a store went through while a load held every host block")
	}
	drain(t, e, now)
	if computing.nextStoredBlock != 2 || hostBlocksOf(e, other) != 2 || hostBlocksOf(e, prompt) != 2 {
		t.Fatalf("after the load: %d of the new prompt's blocks stored, %d of the loaded one kept; want 2 and 2",
			hostBlocksOf(e, other), hostBlocksOf(e, prompt))
	}
	chain := BlockHashes(prompt, 4)
	if removed := hostRemovals(e.TakeKVEvents()); !slices.Equal(removed, []uint64{chain[3], chain[2]}) {
		t.Fatalf("evicted %x, want the loaded prompt's last 2 blocks %x", removed, chain[2:])
	}
}

func TestAbortingALoadingRequestReleasesItsBlocks(t *testing.T) {
	p := tierTestProfile(1e8)
	prompt := seq(100, 17)
	e, now := evictedFromGPU(t, p, prompt)
	r := request(prompt, 1)
	if err := e.Add(r, now); err != nil {
		t.Fatal(err)
	}
	e.Step(now)
	if r.state != stateLoading || e.reserved == 0 {
		t.Fatal("the request is not loading")
	}
	if !e.Abort(r) {
		t.Fatal("Abort found no request")
	}
	s := e.Stats()
	if s.KVUsage != 0 || s.Waiting != 0 || e.reserved != 0 || s.RequestSuccess[FinishAbort] != 1 {
		t.Fatalf("after abort: %+v, %d blocks reserved", s, e.reserved)
	}
	for slot, n := range e.host.loads {
		if n != 0 {
			t.Fatalf("host slot %d still protected by %d loads", slot, n)
		}
	}
	if dur, _ := e.Step(now); dur != 0 {
		t.Fatal("an engine with nothing left stepped")
	}
}

// TestKVEventsReplayToBothTiers applies every step's events to two sets, one per medium, over
// overlapping conversations on a GPU cache and host tier small enough to evict: each set must
// end as that tier's content, and the GPU's events must be those an engine without a tier
// would send for its own cache.
func TestKVEventsReplayToBothTiers(t *testing.T) {
	p := withHostTier(smallProfile(4, 64), 2)
	e := newEngine(t, p)
	e.EnableKVEvents()
	rng := rand.New(rand.NewPCG(5, 6))
	gpu, host := map[uint64]bool{}, map[uint64]bool{}
	var now time.Duration
	hostRemovals := 0
	for i := range 60 {
		prompt := concat(seq(1, 10), seq(1000*(i%9+1), 8+rng.IntN(60)))
		if err := e.Add(request(prompt, 1+rng.IntN(12)), now); err != nil {
			t.Fatal(err)
		}
		for range 3 + rng.IntN(4) {
			dur, _ := e.Step(now)
			now += dur
			for _, ev := range e.TakeKVEvents() {
				set := gpu
				if ev.Medium == MediumCPU {
					set = host
				}
				for _, h := range ev.BlockHashes {
					switch {
					case ev.Kind == BlockStored && set[h]:
						t.Fatalf("%v block %x stored twice", ev.Medium, h)
					case ev.Kind == BlockStored:
						set[h] = true
					case !set[h]:
						t.Fatalf("%v block %x removed but never stored", ev.Medium, h)
					default:
						delete(set, h)
					}
				}
				if ev.Kind == BlockRemoved && ev.Medium == MediumCPU {
					hostRemovals++
				}
			}
		}
	}
	drain(t, e, now)
	for _, ev := range e.TakeKVEvents() {
		if ev.Medium == MediumCPU && ev.Kind == BlockStored {
			for _, h := range ev.BlockHashes {
				host[h] = true
			}
		}
	}
	if hostRemovals == 0 || e.Stats().ExternalPrefixCacheHits == 0 {
		t.Fatal("the host tier never evicted or never served a hit: the test covers too little")
	}
	if len(gpu) != e.pool.cached.len() {
		t.Fatalf("GPU events say %d cached blocks, the engine has %d", len(gpu), e.pool.cached.len())
	}
	ready := 0
	for s, h := range e.host.hashes {
		if h != 0 && e.host.ready[s] {
			ready++
			if !host[h] {
				t.Fatalf("host block %x is stored but no event says so", h)
			}
		}
	}
	if ready != len(host) {
		t.Fatalf("CPU events say %d stored blocks, the tier has %d", len(host), ready)
	}
}

// TestPromptSourcesAddUp checks vLLM's invariants between the prompt token counters over a
// workload with evictions, preemptions and host hits.
func TestPromptSourcesAddUp(t *testing.T) {
	for _, p := range []Profile{traceProfile(), withHostTier(traceProfile(), 4)} {
		_, s := trace(t, p, 4)
		src := s.PromptTokensBySource
		recomputed := src[SourceLocalCacheHit] + src[SourceExternalKVTransfer] - s.PromptTokensCached
		if src[SourceLocalCompute] != s.PromptTokens-s.PromptTokensCached || recomputed > s.RequestSuccess[FinishStop]+s.RequestSuccess[FinishLength] {
			t.Fatalf("tier %v: by source %v, prompt tokens %d, cached %d", p.HostTier(), src, s.PromptTokens, s.PromptTokensCached)
		}
		if p.HostTier() && src[SourceExternalKVTransfer] != s.ExternalPrefixCacheHits {
			t.Fatalf("external_kv_transfer %d, external hits %d", src[SourceExternalKVTransfer], s.ExternalPrefixCacheHits)
		}
	}
}

// TestHostTierAddsHitsWhenConversationsOverflowTheGPU runs the Claude-Code-like lab of
// bench_test.go (8 sessions of 11k-15k tokens per engine, far over its 40k-token cache) with
// and without a host tier 4x each engine's GPU cache: the tier must serve prefixes the GPU
// lost, so that more of the prompts come from a cache, GPU or host.
func TestHostTierAddsHitsWhenConversationsOverflowTheGPU(t *testing.T) {
	hitRate := func(s Stats) float64 {
		return float64(s.PrefixCacheHits+s.ExternalPrefixCacheHits) / float64(s.PrefixCacheQueries)
	}
	_, without := simulateLab(t, Profiles[DefaultProfile], 1)
	_, with := simulateLab(t, withHostTier(Profiles[DefaultProfile], 4), 1)
	t.Logf("prefix hits: %.1f%% without a tier, %.1f%% with one 4x the GPU (%.1f%% from the host)",
		100*hitRate(without), 100*hitRate(with), 100*float64(with.ExternalPrefixCacheHits)/float64(with.PrefixCacheQueries))
	if without.ExternalPrefixCacheHits != 0 || with.ExternalPrefixCacheHits == 0 {
		t.Fatalf("host hits %d without a tier, %d with", without.ExternalPrefixCacheHits, with.ExternalPrefixCacheHits)
	}
	if hitRate(with) <= hitRate(without) {
		t.Fatalf("prefix hits %.3f with a tier, %.3f without", hitRate(with), hitRate(without))
	}
}

// TestCrowdedTiersNeverStall sends bursts of long, overlapping prompts to a GPU cache that
// holds one or two of them and a host tier that holds a few, with aborts: every request must
// end, and nothing may stay held.
func TestCrowdedTiersNeverStall(t *testing.T) {
	for _, reserve := range []bool{true, false} {
		p := withHostBlocks(smallProfile(4, 16), 24)
		p.ReserveFullPrompt = reserve
		p.MaxNumBatchedTokens = 16
		p.KVOffloadBandwidth = 2e8
		e := newEngine(t, p)
		rng := rand.New(rand.NewPCG(7, 8))
		var now time.Duration
		var all []*Request
		for burst := range 40 {
			for range 1 + rng.IntN(5) {
				prompt := concat(seq(1, 12), seq(1000*(1+rng.IntN(6)), 8+rng.IntN(36)))
				r := request(prompt, 1+rng.IntN(8))
				if err := e.Add(r, now); err != nil {
					t.Fatal(err)
				}
				all = append(all, r)
			}
			for range rng.IntN(12) {
				dur, _ := e.Step(now)
				now += dur
			}
			if burst%5 == 4 {
				e.Abort(all[rng.IntN(len(all))])
			}
		}
		drain(t, e, now)
		for i, r := range all {
			if r.state != stateFinished {
				t.Fatalf("reserve %v: request %d never finished", reserve, i)
			}
		}
		s := e.Stats()
		if s.KVUsage != 0 || e.reserved != 0 || s.ExternalPrefixCacheHits == 0 || s.Preemptions == 0 {
			t.Fatalf("reserve %v: at the end %+v, %d blocks reserved; the workload must preempt and hit the host tier", reserve, s, e.reserved)
		}
		for slot, n := range e.host.loads {
			if n != 0 {
				t.Fatalf("reserve %v: host slot %d still protected by %d loads", reserve, slot, n)
			}
		}
	}
}

// Every built-in profile describes an engine that starts, with and without
// the host tier the farm's box gives (64 GiB), and the farm's profile holds
// 16 conversations of 57k tokens on seven replicas but not 26 (its README
// section's sizing).
func TestBuiltInProfilesStart(t *testing.T) {
	for name, p := range Profiles {
		if p.Name != name {
			t.Errorf("profile %q names itself %q", name, p.Name)
		}
		p.KVOffloadingSize = 64
		for _, q := range []Profile{Profiles[name], p} {
			if err := q.Validate(); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
	farm := 7 * Profiles["rtx5090-gemma3-27b"].KVCapacityTokens()
	if 16*57000 > farm || 26*57000 <= farm {
		t.Errorf("the farm's seven replicas hold %d tokens: 16 conversations of 57k should fit, 26 not", farm)
	}
}
