package selection

import (
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/kvevents"
	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// With its pin's KV cache events followed, a conversation is judged by
// what they say of its chain: it stays while the pin holds most of it,
// whatever the counters say, and is rehomed once the pin evicted more than
// half of its last prompt. A turn whose reply gave no usage leaves the
// judgement to the counters.
func TestKVCacheEventsJudgeResidency(t *testing.T) {
	r := newTestRouter(2, Config{MaxNumSeqs: 32})
	load := Load{Known: true, KVTokens: 40000, KVUsage: 0.1, Written: 1000, BlockSize: 16}
	chains := map[string]*kvevents.Chains{}
	for _, rep := range r.Replicas() {
		r.SetLoad(rep.ID, load)
		chains[rep.ID] = kvevents.NewChains(0)
		if !r.View.FollowChains(rep.ID, chains[rep.ID]) {
			t.Fatalf("FollowChains(%s): unknown replica", rep.ID)
		}
	}
	if r.View.FollowChains("nowhere:1", kvevents.NewChains(0)) {
		t.Fatal("FollowChains took an unknown replica")
	}
	// The system prompt's 219 blocks are cached everywhere. a's first turn:
	// 10,000 prompt tokens, 3,504 cached, 97 output tokens: 631 blocks
	// computed, 412 stored.
	for _, c := range chains {
		c.Stored(0, blocks(1, 219))
	}
	d := r.Pick(Request{Key: "a", PromptTokens: 10000, Now: t0})
	home := id(d)
	c := chains[home]
	c.Stored(219, blocks(220, 631))
	d.End(time.Time{}, loadcontrol.Reply{PromptTokens: 10000, CachedTokens: 3504, CacheReported: true, OutputTokens: 97})

	// The counters say everything was evicted; the events say not.
	evicted := load
	evicted.Written = 1000 + 100000
	r.SetLoad(home, evicted)
	d = r.Pick(Request{Key: "a", PromptTokens: 10500, Now: t0.Add(time.Second)})
	if d.Outcome != Sticky || id(d) != home {
		t.Fatalf("the pin holds a's chain: %v on %s, want sticky on %s", d.Outcome, id(d), home)
	}
	c.Stored(631, blocks(632, 656))
	d.End(time.Time{}, loadcontrol.Reply{PromptTokens: 10500, CachedTokens: 10096, CacheReported: true, OutputTokens: 1})

	// The pin evicts 300 blocks from the tail: 4,800 tokens, under half of
	// the last prompt.
	c.Removed(blocks(357, 656))
	if d = r.Pick(Request{Key: "a", PromptTokens: 11000, Now: t0.Add(2 * time.Second)}); d.Outcome != Sticky {
		t.Fatalf("4,800 of 10,500 tokens evicted: %v, want sticky", d.Outcome)
	}
	d.End(time.Time{}, loadcontrol.Reply{}) // no usage: the events cannot follow this turn
	// 100 blocks more are evicted, which the counters do not see.
	c.Removed(blocks(257, 356))
	if d = r.Pick(Request{Key: "a", PromptTokens: 11000, Now: t0.Add(3 * time.Second)}); d.Outcome != Sticky {
		t.Fatalf("after a turn without usage, the counters saying all cached: %v, want sticky", d.Outcome)
	}
	// That turn finds 256 blocks cached and stores 433.
	c.Stored(256, blocks(257, 689))
	d.End(time.Time{}, loadcontrol.Reply{PromptTokens: 11000, CachedTokens: 4096, CacheReported: true, OutputTokens: 40})
	c.Removed(blocks(257, 689))
	if got := cachedNow(testRouter{View: r.View, Router: r.Router}, "a"); got != 11000-6928 {
		t.Fatalf("6,928 of 11,000 tokens evicted: %d cached, want %d", got, 11000-6928)
	}
}

// blocks returns the hashes from through to, in order.
func blocks(from, to uint64) []uint64 {
	var hs []uint64
	for h := from; h <= to; h++ {
		hs = append(hs, h)
	}
	return hs
}
