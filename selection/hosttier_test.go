package selection

import (
	"testing"
	"time"
)

// The share is what the tier served of the evicted tokens we sent back to
// their pin, over the scrapes; counters that went back, or a replica
// without a tier, teach nothing.
func TestHostShareIsWhatTheTierServedOfWhatWeBelievedEvicted(t *testing.T) {
	var h hostShare
	scrape := func(at, queries, hits float64) Load {
		return Load{Known: true, At: t0.Add(time.Duration(at * float64(time.Second))), ExternalQueries: queries, ExternalHits: hits}
	}
	h.observe(scrape(0, 0, 0), scrape(1, 0, 0))
	h.sent.Add(10000)
	h.observe(scrape(1, 0, 0), scrape(2, 0, 0))
	if got := h.value(); got != 0 {
		t.Fatalf("without a tier's counters: share %g, want 0", got)
	}
	h.sent.Add(10000)
	h.observe(scrape(2, 0, 0), scrape(3, 12000, 8000))
	if got := h.value(); got != 0.8 {
		t.Fatalf("8,000 served of 10,000 sent: share %g, want 0.8", got)
	}
	h.sent.Add(5000)
	h.observe(scrape(3, 12000, 8000), scrape(4, 100, 50)) // restarted
	if got := h.value(); got != 0.8 {
		t.Fatalf("after counters went back: share %g, want 0.8 kept", got)
	}
	h.observe(scrape(4, 100, 50), scrape(5, 90000, 80000))
	if got := h.value(); got != 1 {
		t.Fatalf("more served than sent: share %g, want 1 at most", got)
	}
}

// A conversation whose pin evicted its cache from the GPU moves off a pin
// with prefill queued (TestEvictedConversationMovesOnlyToAShorterQueue),
// unless the pin's host tier has been loading such prefixes back: then it
// stays, as its prefix costs little there and everything elsewhere, where
// another conversation is served.
func TestEvictedConversationStaysWhereItsHostTierHoldsIt(t *testing.T) {
	for _, tier := range []bool{false, true} {
		r := newTestRouter(2, Config{MaxNumSeqs: 32})
		teachRate(r, 5000, kvLoad(1000))
		teachTurns(r, 10*time.Second)
		home := id(turn(t, r, "a", 0))
		elsewhere := occupy(t, r, other(r, home), "b")
		scrape := func(at, written, served float64) {
			l := kvLoad(written)
			if tier {
				l.ExternalQueries, l.ExternalHits = 20000, served
			}
			r.SetLoad(home, withRate(l, 5000, at))
		}
		scrape(2, 1000+100000, 0) // evicted
		if d := turn(t, r, "a", 3*time.Second); d.Outcome != Sticky || id(d) != home {
			t.Fatalf("tier %v, nothing queued: %v on %s, want sticky on %s", tier, d.Outcome, id(d), home)
		}
		scrape(4, 1000+100000, 9000) // the tier served most of it
		scrape(5, 1000+200000, 9000) // evicted again
		busy := hold(t, r, home, 1, 20000, 6*time.Second)
		d := turn(t, r, "a", 6*time.Second)
		releaseAll(busy)
		releaseAll(elsewhere)
		switch {
		case tier && (d.Outcome != Sticky || id(d) != home):
			t.Errorf("with a host tier: %v on %s, want sticky on %s", d.Outcome, id(d), home)
		case !tier && (d.Outcome != Rehomed || id(d) == home):
			t.Errorf("without a tier: %v on %s, want rehomed off %s", d.Outcome, id(d), home)
		}
	}
}

// With a host tier a turn moves off its pin only to a replica with a free
// place to run it; where every place is taken there, it stays. Without a
// tier the same turn moves to the shorter queue.
func TestHostTierKeepsTurnsFromReplicasWithoutAFreePlace(t *testing.T) {
	for _, tier := range []bool{false, true} {
		r := newTestRouter(2, Config{MaxNumSeqs: 2})
		teachRate(r, 5000, kvLoad(1000))
		teachTurns(r, 10*time.Second)
		home := id(turn(t, r, "a", 0))
		away := other(r, home)
		l := kvLoad(1000)
		if tier {
			// the tier served everything we sent back evicted
			l.ExternalQueries, l.ExternalHits = 20000, 20000
		}
		r.SetLoad(home, withRate(kvLoad(1000), 5000, 2))
		entryOf(r, "a").pin.host.sent.Add(20000)
		r.SetLoad(home, withRate(l, 5000, 3))
		busy := hold(t, r, home, 2, 40000, 4*time.Second) // 16 s of prefill, every place taken
		busy = append(busy, hold(t, r, away, 2, 100, 4*time.Second)...)
		d := turn(t, r, "a", 4*time.Second)
		releaseAll(busy)
		switch {
		case tier && (d.Outcome != Sticky || id(d) != home):
			t.Errorf("with a host tier: %v on %s, want sticky on %s", d.Outcome, id(d), home)
		case !tier && id(d) != away:
			t.Errorf("without a tier: %v on %s, want moved to %s", d.Outcome, id(d), away)
		}
	}
}

// A tier's size in tokens is its GiB over the bytes it stored per token
// the engine computed (less what it loaded back), once enough were stored;
// without a size, nothing stored, or counters that went back, it stays
// unknown or as it was.
func TestHostTierSizeFromTheBytesItStored(t *testing.T) {
	const perToken = 147456 // Qwen3-4B's KV bytes per token
	var h hostShare
	scrape := func(gib, written, loaded, tokensStored float64) Load {
		return Load{Known: true, HostTierGiB: gib, Written: written, ExternalHits: loaded, HostStoredBytes: tokensStored * perToken}
	}
	h.size(scrape(0, 0, 0, 0), scrape(0, 90000, 0, 90000))
	if got := h.tokens.Load(); got != 0 {
		t.Fatalf("a tier of unknown size: %d tokens, want 0", got)
	}
	h.size(scrape(22, 0, 0, 0), scrape(22, 30000, 0, 30000))
	if got := h.tokens.Load(); got != 0 {
		t.Fatalf("30,000 tokens stored: %d tokens, want none before %d", got, minSizingTokens)
	}
	// 40,000 more written, 10,000 of them loaded back from the tier (not
	// stored again), the rest stored: 60,000 computed and stored in all.
	h.size(scrape(22, 30000, 0, 30000), scrape(22, 70000, 10000, 60000))
	if got, want := h.tokens.Load(), int64(22*(1<<30)/perToken); got != want {
		t.Fatalf("22 GiB of %d-byte tokens: %d tokens, want %d", perToken, got, want)
	}
	h.size(scrape(22, 70000, 10000, 60000), scrape(22, 100, 0, 100)) // restarted
	if got, want := h.tokens.Load(), int64(22*(1<<30)/perToken); got != want {
		t.Fatalf("after counters went back: %d tokens, want %d kept", got, want)
	}
}
