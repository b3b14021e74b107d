package engine

import (
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// smallProfile is the A4000 profile with a KV cache and limits small enough to reason about.
func smallProfile(blockSize, numBlocks int) Profile {
	p := Profiles[DefaultProfile]
	p.BlockSize = blockSize
	p.NumGPUBlocks = numBlocks
	p.MaxModelLen = blockSize * numBlocks
	return p
}

func newEngine(t testing.TB, p Profile) *Engine {
	t.Helper()
	e, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// seq returns n distinct token ids starting at from.
func seq(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func concat(parts ...[]uint32) []uint32 { return slices.Concat(parts...) }

func request(prompt []uint32, output int) *Request {
	return &Request{Prompt: prompt, MaxTokens: output, Output: seq(900_000, output)}
}

// drain steps the engine from now until it is idle and returns the time it reached.
func drain(t testing.TB, e *Engine, now time.Duration) time.Duration {
	t.Helper()
	for range 1_000_000 {
		dur, _ := e.Step(now)
		if dur == 0 {
			return now
		}
		now += dur
	}
	t.Fatal("engine never became idle")
	return now
}

// serve adds one request at now, runs the engine until idle and returns the new time.
func serve(t testing.TB, e *Engine, r *Request, now time.Duration) time.Duration {
	t.Helper()
	if err := e.Add(r, now); err != nil {
		t.Fatal(err)
	}
	return drain(t, e, now)
}

func TestRepeatedPromptHitsAllItsFullBlocks(t *testing.T) {
	for _, promptLen := range []int{100, 96} {
		e := newEngine(t, smallProfile(16, 100))
		prompt := seq(1, promptLen)
		first, second := request(prompt, 4), request(prompt, 4)
		now := serve(t, e, first, 0)
		before := e.Stats()
		serve(t, e, second, now)
		after := e.Stats()

		// At least the last prompt token is computed again for its logits, so a prompt that
		// is a whole number of blocks recomputes its last block.
		wantHit := (promptLen - 1) / 16 * 16
		if first.CachedTokens != 0 || second.CachedTokens != wantHit {
			t.Errorf("prompt %d: cached tokens %d then %d, want 0 then %d", promptLen, first.CachedTokens, second.CachedTokens, wantHit)
		}
		if got := after.PrefixCacheHits - before.PrefixCacheHits; got != uint64(wantHit) {
			t.Errorf("prompt %d: prefix_cache_hits grew by %d, want %d", promptLen, got, wantHit)
		}
		if got := after.PrefixCacheQueries - before.PrefixCacheQueries; got != uint64(promptLen) {
			t.Errorf("prompt %d: prefix_cache_queries grew by %d, want %d", promptLen, got, promptLen)
		}
		if after.PromptTokens != uint64(2*promptLen) || after.PromptTokensCached != uint64(wantHit) {
			t.Errorf("prompt %d: prompt tokens %d cached %d", promptLen, after.PromptTokens, after.PromptTokensCached)
		}
	}
}

func TestSharedSystemPromptHitsExactlyItsBlocks(t *testing.T) {
	e := newEngine(t, smallProfile(16, 100))
	system := seq(1, 40) // two full blocks and half of a third
	now := serve(t, e, request(concat(system, seq(1000, 300)), 2), 0)
	other := request(concat(system, seq(5000, 300)), 2)
	serve(t, e, other, now)
	if other.CachedTokens != 32 {
		t.Fatalf("a prompt sharing 40 system tokens hit %d tokens, want the 32 of its 2 full blocks", other.CachedTokens)
	}
}

func TestGeneratedTokensAreCachedForTheNextTurn(t *testing.T) {
	e := newEngine(t, smallProfile(16, 100))
	turn1 := request(seq(1, 50), 20)
	now := serve(t, e, turn1, 0)
	// The next turn resends prompt and reply. The KV of the reply's last token was never
	// computed, so 69 tokens are cached: 4 full blocks.
	turn2 := request(concat(turn1.Prompt, turn1.Output, seq(7000, 30)), 2)
	serve(t, e, turn2, now)
	if turn2.CachedTokens != 64 {
		t.Fatalf("second turn hit %d tokens, want 64", turn2.CachedTokens)
	}
}

func TestEvictionIsLeastRecentlyUsedAndTailFirst(t *testing.T) {
	// 8 blocks of 4 tokens. A and B each fill 4 blocks and finish: the free queue is then
	// A's blocks (tail first) followed by B's.
	e := newEngine(t, smallProfile(4, 8))
	a, b := seq(100, 16), seq(200, 16)
	now := serve(t, e, request(a, 1), 0)
	now = serve(t, e, request(b, 1), now)
	// C needs 2 new blocks: it evicts A's last two blocks, not B's.
	now = serve(t, e, request(seq(300, 8), 1), now)

	againB := request(b, 1)
	now = serve(t, e, againB, now)
	if againB.CachedTokens != 12 {
		t.Fatalf("B, used after A, lost blocks to C: hit %d tokens, want 12", againB.CachedTokens)
	}
	// B's rerun needed one new block and took the next least recently used one: A's second.
	againA := request(a, 1)
	serve(t, e, againA, now)
	if againA.CachedTokens != 4 {
		t.Fatalf("A hit %d tokens, want only its first block (4)", againA.CachedTokens)
	}
}

func TestNewestRunningRequestIsPreemptedWhenBlocksRunOut(t *testing.T) {
	// 8 blocks of 4 tokens; two requests of 12 prompt + 12 output tokens need 6 blocks each.
	e := newEngine(t, smallProfile(4, 8))
	older, newer := request(seq(100, 12), 12), request(seq(200, 12), 12)
	for _, r := range []*Request{older, newer} {
		if err := e.Add(r, 0); err != nil {
			t.Fatal(err)
		}
	}
	drain(t, e, 0)
	stats := e.Stats()
	if older.Preemptions != 0 || newer.Preemptions == 0 || stats.Preemptions != uint64(newer.Preemptions) {
		t.Fatalf("preemptions: older %d, newer %d, counter %d; want only the newer one preempted",
			older.Preemptions, newer.Preemptions, stats.Preemptions)
	}
	for _, r := range []*Request{older, newer} {
		if r.Generated != 12 || r.FinishReason != FinishLength {
			t.Fatalf("request generated %d tokens, finish %v; want 12, length", r.Generated, r.FinishReason)
		}
	}
	if stats.KVUsage != 0 || stats.Running != 0 || stats.Waiting != 0 {
		t.Fatalf("idle engine still holds work: %+v", stats)
	}

	roomy := newEngine(t, smallProfile(4, 12))
	for _, r := range []*Request{request(seq(100, 12), 12), request(seq(200, 12), 12)} {
		if err := roomy.Add(r, 0); err != nil {
			t.Fatal(err)
		}
	}
	drain(t, roomy, 0)
	if got := roomy.Stats().Preemptions; got != 0 {
		t.Fatalf("%d preemptions with enough blocks for both requests", got)
	}
}

func TestChunkedPrefillRespectsTheTokenBudget(t *testing.T) {
	p := smallProfile(16, 100)
	p.MaxNumBatchedTokens = 64
	e := newEngine(t, p)
	r := request(seq(1, 200), 2)
	if err := e.Add(r, 0); err != nil {
		t.Fatal(err)
	}
	// Chunks of 64, 64, 64 and 8 tokens; each chunk reads the KV computed before it.
	want := []time.Duration{p.StepTime(64, 0), p.StepTime(64, 64), p.StepTime(64, 128), p.StepTime(8, 192)}
	now := time.Duration(0)
	for i, w := range want {
		dur, events := e.Step(now)
		now += dur
		if dur != w {
			t.Fatalf("step %d took %v, want %v", i, dur, w)
		}
		if gotFirst := len(events) == 1 && events[0].First; gotFirst != (i == len(want)-1) {
			t.Fatalf("step %d: events %v; the first token must come with the last chunk only", i, events)
		}
	}
	// A decode step computes one token and reads the whole context.
	if dur, _ := e.Step(now); dur != p.StepTime(0, 200) {
		t.Fatalf("decode step took %v, want %v", dur, p.StepTime(0, 200))
	}
	if ttft := e.Stats().TTFT; ttft.Count != 1 || ttft.Sum != (want[0]+want[1]+want[2]+want[3]).Seconds() {
		t.Fatalf("TTFT histogram %+v", ttft)
	}
}

func TestRunningRequestsGoFirstAndSlotsAreCapped(t *testing.T) {
	p := smallProfile(16, 100)
	p.MaxNumBatchedTokens = 64
	p.MaxNumSeqs = 2
	e := newEngine(t, p)
	decoding := request(seq(1, 10), 50)
	serveSteps(t, e, decoding, 2) // prefill, then one decode step: now it decodes one token per step
	late1, late2 := request(seq(100, 200), 1), request(seq(400, 20), 1)
	for _, r := range []*Request{late1, late2} {
		if err := e.Add(r, 0); err != nil {
			t.Fatal(err)
		}
	}
	// The decoding request takes 1 token of the budget; late1 gets the other 63; late2 finds
	// no free sequence slot.
	dur, _ := e.Step(0)
	if want := p.StepTime(63, 11); dur != want {
		t.Fatalf("step took %v, want %v (1 decode + 63 prefill tokens)", dur, want)
	}
	if s := e.Stats(); s.Running != 2 || s.Waiting != 1 {
		t.Fatalf("running %d waiting %d, want 2 and 1", s.Running, s.Waiting)
	}
}

func serveSteps(t *testing.T, e *Engine, r *Request, steps int) {
	t.Helper()
	if err := e.Add(r, 0); err != nil {
		t.Fatal(err)
	}
	for range steps {
		e.Step(0)
	}
}

func TestAbortFreesBlocks(t *testing.T) {
	e := newEngine(t, smallProfile(16, 100))
	r := request(seq(1, 100), 10)
	serveSteps(t, e, r, 2)
	if e.Stats().KVUsage == 0 {
		t.Fatal("a running request holds no blocks")
	}
	if !e.Abort(r) || e.Abort(r) {
		t.Fatal("Abort must succeed once, then report the request gone")
	}
	s := e.Stats()
	if s.KVUsage != 0 || s.Running != 0 || s.RequestSuccess[FinishAbort] != 1 {
		t.Fatalf("after abort: %+v", s)
	}
	if dur, events := e.Step(0); dur != 0 || events != nil {
		t.Fatal("an idle engine stepped")
	}
}

// A caller that gives a prompt's leading block hashes, as a conversation's next turn can,
// gets the hit and the cached blocks it would get without them.
func TestPromptHashesGivenAreThoseTheEngineWouldCompute(t *testing.T) {
	given, computed := newEngine(t, smallProfile(16, 100)), newEngine(t, smallProfile(16, 100))
	turn1 := request(seq(1, 50), 20)
	var now time.Duration
	for _, e := range []*Engine{given, computed} {
		now = serve(t, e, request(turn1.Prompt, 20), 0)
	}
	prompt := concat(turn1.Prompt, turn1.Output, seq(7000, 30))
	withHashes := request(prompt, 2)
	withHashes.PromptHashes = BlockHashes(turn1.Prompt, 16) // the 3 full blocks of turn 1
	without := request(prompt, 2)
	serve(t, given, withHashes, now)
	serve(t, computed, without, now)
	if withHashes.CachedTokens != 64 || without.CachedTokens != 64 {
		t.Fatalf("second turn hit %d tokens with its first hashes given, %d without; want 64", withHashes.CachedTokens, without.CachedTokens)
	}
	if !slices.Equal(withHashes.blockHashes, without.blockHashes) || given.pool.cached.len() != computed.pool.cached.len() {
		t.Fatal("the engines hashed or cached different blocks")
	}
}

func TestAddRejectsRequestsThatCannotRun(t *testing.T) {
	e := newEngine(t, smallProfile(16, 10))
	for name, r := range map[string]*Request{
		"empty prompt":  request(nil, 1),
		"no output":     {Prompt: seq(1, 4), MaxTokens: 1},
		"too long":      request(seq(1, 150), 20),
		"zero max":      {Prompt: seq(1, 4), MaxTokens: 0, Output: seq(1, 4)},
		"added already": func() *Request { r := request(seq(1, 4), 1); _ = e.Add(r, 0); return r }(),
		"hashes past the full blocks": {Prompt: seq(1, 20), MaxTokens: 1, Output: seq(1, 1),
			PromptHashes: BlockHashes(seq(1, 32), 16)},
	} {
		if err := e.Add(r, 0); err == nil {
			t.Errorf("%s: Add accepted it", name)
		}
	}
	short := &Request{Prompt: seq(1, 4), MaxTokens: 10, Output: seq(50, 3)}
	serve(t, e, short, 0)
	if short.Generated != 3 || short.FinishReason != FinishStop {
		t.Fatalf("a reply shorter than max_tokens: generated %d, finish %v; want 3, stop", short.Generated, short.FinishReason)
	}
}

// A reply whose last token is the model's own end (Stopped) finishes with stop even at
// max_tokens; cut before that end, it finishes with length.
func TestModelEndedReplyFinishesWithStop(t *testing.T) {
	e := newEngine(t, smallProfile(16, 10))
	ended := &Request{Prompt: seq(1, 4), MaxTokens: 3, Output: seq(60, 3), Stopped: true}
	serve(t, e, ended, 0)
	if ended.Generated != 3 || ended.FinishReason != FinishStop {
		t.Fatalf("a reply the model ended at max_tokens: generated %d, finish %v; want 3, stop", ended.Generated, ended.FinishReason)
	}
	cut := &Request{Prompt: seq(1, 4), MaxTokens: 3, Output: seq(70, 5), Stopped: true}
	serve(t, e, cut, 0)
	if cut.FinishReason != FinishLength {
		t.Fatalf("a reply cut before its end: finish %v, want length", cut.FinishReason)
	}
}

// traceProfile has a cache small enough for trace's workload to evict and preempt.
func traceProfile() Profile {
	p := smallProfile(16, 200)
	p.MaxNumBatchedTokens = 256
	p.MaxNumSeqs = 6
	return p
}

// trace runs a seeded workload of overlapping conversations on an engine of profile p and
// returns a digest of every step and the final stats.
func trace(t testing.TB, p Profile, seed uint64) (uint64, Stats) {
	e := newEngine(t, p)
	rng := rand.New(rand.NewPCG(seed, seed))
	system := seq(1, 300)
	digest := fnv.New64a()
	now := time.Duration(0)
	for i := range 40 {
		prompt := concat(system, seq(10_000*(1+rng.IntN(8)), 100+rng.IntN(1500)))
		r := &Request{Prompt: prompt, MaxTokens: 1 + rng.IntN(200), Output: seq(rng.IntN(1000), 150)}
		if err := e.Add(r, now); err != nil {
			t.Fatal(err)
		}
		for range rng.IntN(30) {
			dur, events := e.Step(now)
			now += dur
			digest.Write([]byte(dur.String()))
			for _, ev := range events {
				digest.Write([]byte{byte(ev.Token), byte(ev.Req.CachedTokens), byte(i)})
			}
		}
	}
	drain(t, e, now)
	return digest.Sum64(), e.Stats()
}

func TestSameCallsGiveSameResults(t *testing.T) {
	d1, s1 := trace(t, traceProfile(), 1)
	d2, s2 := trace(t, traceProfile(), 1)
	if d1 != d2 || s1 != s2 {
		t.Fatal("the same workload gave different results")
	}
	if s1.Preemptions == 0 || s1.PrefixCacheHits == 0 {
		t.Fatalf("the workload should exercise preemption and prefix hits: %+v", s1)
	}
	if d3, _ := trace(t, traceProfile(), 2); d3 == d1 {
		t.Fatal("a different workload gave the same trace")
	}
}

func TestAdmissionReservesTheWholePrompt(t *testing.T) {
	for _, reserve := range []bool{true, false} {
		p := smallProfile(4, 8)
		p.MaxNumBatchedTokens = 13
		p.ReserveFullPrompt = reserve
		e := newEngine(t, p)
		first := request(seq(100, 12), 3)
		serveSteps(t, e, first, 1) // prefilled: 3 of 8 blocks taken
		// The next step decodes first (a 4th block), leaving 4 free blocks and 12 tokens of
		// budget: enough for a 12-token first chunk of second, not for its 24-token prompt.
		second := request(seq(200, 24), 1)
		if err := e.Add(second, 0); err != nil {
			t.Fatal(err)
		}
		e.Step(0)
		if got, want := e.Stats().Running, map[bool]int{true: 1, false: 2}[reserve]; got != want {
			t.Fatalf("reserve full prompt %v: %d running, want %d", reserve, got, want)
		}
		drain(t, e, 0)
		// Lookups retried while second waited for blocks are not counted again.
		if s := e.Stats(); s.PrefixCacheQueries != 36 || second.Generated != 1 {
			t.Fatalf("reserve full prompt %v: prefix cache queries %d (want 36), second generated %d",
				reserve, s.PrefixCacheQueries, second.Generated)
		}
	}
}

func TestCachedTokensIsTheHitWithoutTouchingTheCache(t *testing.T) {
	// 8 blocks of 4 tokens, as in TestEvictionIsLeastRecentlyUsedAndTailFirst: A then B
	// fill them, so A's blocks are evicted first.
	e := newEngine(t, smallProfile(4, 8))
	a, b := seq(100, 16), seq(200, 16)
	now := serve(t, e, request(a, 1), 0)
	now = serve(t, e, request(b, 1), now)
	if got := e.CachedTokens(nil); got != 0 {
		t.Fatalf("an empty prompt has %d tokens cached", got)
	}
	for _, c := range []struct {
		prompt []uint32
		want   int
	}{
		{a, 12}, // the last block is left to compute
		{concat(a, seq(900, 5)), 16},
		{concat(a[:9], seq(900, 9)), 8}, // two full blocks shared
		{seq(300, 16), 0},
	} {
		if got := e.CachedTokens(c.prompt); got != c.want {
			t.Errorf("CachedTokens(%v) = %d, want %d", c.prompt, got, c.want)
		}
	}
	// Looking A up does not make it recently used: C still evicts A's last two blocks.
	before := e.Stats()
	e.CachedTokens(a)
	if after := e.Stats(); after != before {
		t.Fatalf("the lookup changed the counters: %+v, then %+v", before, after)
	}
	now = serve(t, e, request(seq(300, 8), 1), now)
	if got := e.CachedTokens(b); got != 12 {
		t.Fatalf("B lost blocks to C after A was looked up: %d tokens cached, want 12", got)
	}
	want := e.CachedTokens(a)
	againA := request(a, 1)
	serve(t, e, againA, now)
	if want != 8 || againA.CachedTokens != want {
		t.Fatalf("A: CachedTokens said %d, the request hit %d, want 8", want, againA.CachedTokens)
	}
}

func TestWaitingRequestLosesTheHitsEvictedWhileItWaits(t *testing.T) {
	// 8 blocks of 4 tokens. A's 4 blocks are cached and free, behind the 4 never used. X
	// (2 blocks) runs; W, A's prompt and 12 tokens more (7 blocks, 4 of them cached), does not
	// fit beside it and waits, looking its prefix up at every step. X's reply takes 3 blocks
	// more: the last 2 never used, then A's last block. W then finds 3 blocks cached, not 4.
	e := newEngine(t, smallProfile(4, 8))
	a := seq(100, 16)
	now := serve(t, e, request(a, 1), 0)
	x, w := request(seq(300, 8), 12), request(concat(a, seq(500, 12)), 1)
	for _, r := range []*Request{x, w} {
		if err := e.Add(r, now); err != nil {
			t.Fatal(err)
		}
	}
	drain(t, e, now)
	if x.Generated != 12 || w.CachedTokens != 12 {
		t.Fatalf("X generated %d tokens (want 12), W found %d tokens cached (want 12)", x.Generated, w.CachedTokens)
	}
}
