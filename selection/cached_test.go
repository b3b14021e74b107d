package selection

import (
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// kvLoad is a replica with a 40,000-token cache, 10% in use, that has
// written written tokens to it.
func kvLoad(written float64) Load {
	return Load{Known: true, KVTokens: 40000, KVUsage: 0.1, Written: written}
}

// turn sends one request of conv with a prompt of 10,000 tokens, ended at
// once.
func turn(t *testing.T, r testRouter, conv string, at time.Duration) Decision {
	t.Helper()
	d := r.Pick(Request{Key: conv, PromptTokens: 10000, Now: t0.Add(at)})
	if d.Outcome == NoReplica {
		t.Fatalf("no replica for %s", conv)
	}
	d.Release()
	return d
}

// entryOf is conv's entry in the session table.
func entryOf(r testRouter, conv string) *session {
	key := HashKey(conv)
	sh := r.sessions.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.byKey[key]
}

// cachedNow is what the router estimates conv's pin still holds of its
// last prompt.
func cachedNow(r testRouter, conv string) int {
	e := entryOf(r, conv)
	sh := r.sessions.shard(e.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return e.cachedTokens()
}

// A conversation's pin holds its last prompt until the pin has written the
// free room it had when the turn ended (36,000 tokens); past that it loses
// one token of it per token written, and all of it once the prompt's worth
// more is written.
func TestCachedTokensFollowTheCounters(t *testing.T) {
	r := newTestRouter(2, Config{})
	for _, rep := range r.Replicas() {
		r.SetLoad(rep.ID, kvLoad(1000))
	}
	home := id(turn(t, r, "a", 0))
	for _, c := range []struct {
		written float64
		want    int
	}{
		{0, 10000},
		{36000, 10000},
		{36000 + 2500, 7500},
		{36000 + 9999, 1},
		{36000 + 20000, 0},
	} {
		r.SetLoad(home, kvLoad(1000+c.written))
		if got := cachedNow(r, "a"); got != c.want {
			t.Errorf("written %.0f: cached %d, want %d", c.written, got, c.want)
		}
	}
}

// Tokens sent to the pin count as written as soon as they are sent, before
// its counters show them: the requests queued there write them before the
// conversation's next turn runs.
func TestTokensSentCountAsWritten(t *testing.T) {
	r := newTestRouter(1, Config{})
	home := r.Replicas()[0].ID
	r.SetLoad(home, kvLoad(1000))
	turn(t, r, "a", 0)
	queued := hold(t, r, home, 4, 10000, time.Second) // 40,000 tokens to compute
	defer releaseAll(queued)
	if got := cachedNow(r, "a"); got != 6000 {
		t.Fatalf("cached %d, want 6,000: 4,000 past the 36,000 free", got)
	}
}

// A restarted engine (its counters back) has lost every cache, even once
// it has written past its old count when the conversation comes back.
func TestRestartedEngineHoldsNothing(t *testing.T) {
	for _, since := range []float64{100, 60000} {
		r := newTestRouter(2, Config{})
		for _, rep := range r.Replicas() {
			r.SetLoad(rep.ID, kvLoad(50000))
		}
		home := id(turn(t, r, "a", 0))
		r.SetLoad(home, kvLoad(100)) // restarted
		r.SetLoad(home, kvLoad(since))
		if got := cachedNow(r, "a"); got != 0 {
			t.Errorf("its pin restarted, %.0f tokens written since: cached %d, want 0", since, got)
		}
	}
}

// A conversation with a request still running on its pin holds its prompt
// there: its blocks are in use, not free to evict.
func TestRunningConversationKeepsItsCache(t *testing.T) {
	r := newTestRouter(2, Config{})
	for _, rep := range r.Replicas() {
		r.SetLoad(rep.ID, kvLoad(1000))
	}
	home := id(turn(t, r, "a", 0))
	running := r.Pick(Request{Key: "a", PromptTokens: 10000, Now: t0.Add(time.Second)})
	defer running.Release()
	r.SetLoad(home, kvLoad(1000+100000))
	if got := cachedNow(r, "a"); got != 10000 {
		t.Fatalf("with a request running: cached %d, want 10000", got)
	}
}

// A request still in flight when its conversation moved away and came back
// to the same replica ends without touching the new turn's count: the new
// turn is still running, so its cache is held.
func TestRequestSentBeforeAMoveDoesNotEndTheNewTurn(t *testing.T) {
	r := newTestRouter(2, Config{})
	for _, rep := range r.Replicas() {
		r.SetLoad(rep.ID, kvLoad(1000))
	}
	home := id(turn(t, r, "a", 0))
	other := r.Replicas()[0].ID
	if other == home {
		other = r.Replicas()[1].ID
	}
	stale := r.Pick(Request{Key: "a", PromptTokens: 10000, Now: t0.Add(time.Second)})
	r.SetHealthy(home, false)
	if d := turn(t, r, "a", 2*time.Second); id(d) != other {
		t.Fatalf("with its pin down: %v on %s, want %s", d.Outcome, id(d), other)
	}
	r.SetHealthy(home, true)
	r.SetHealthy(other, false)
	running := r.Pick(Request{Key: "a", PromptTokens: 10000, Now: t0.Add(3 * time.Second)})
	defer running.Release()
	if id(running) != home {
		t.Fatalf("back: %v on %s, want %s", running.Outcome, id(running), home)
	}
	stale.Release()
	r.SetLoad(home, kvLoad(1000+100000))
	if got := cachedNow(r, "a"); got != 10000 {
		t.Fatalf("with its new turn running: cached %d, want 10000", got)
	}
}

// Without the engines' counters a pin is taken to hold everything.
func TestNoCountersNoEviction(t *testing.T) {
	r := newTestRouter(2, Config{})
	home := id(turn(t, r, "a", 0))
	for i := range 5 {
		if d := turn(t, r, "a", time.Duration(i+1)*time.Second); d.Outcome != Sticky || id(d) != home {
			t.Fatalf("turn %d: %v on %s", i+2, d.Outcome, id(d))
		}
	}
	if got := cachedNow(r, "a"); got != 10000 {
		t.Fatalf("cached %d, want 10000", got)
	}
}

// With load control on, the gate keeps residents' caches and moves the
// others itself: a pick does not move a conversation whose pin lost it.
func TestLoadControlDoesNotMoveForTheCache(t *testing.T) {
	r := newTestRouter(2, Config{MaxNumSeqs: 32, Admission: loadcontrol.Config{Enabled: true}})
	teachRate(r, 5000, kvLoad(1000))
	home := id(turn(t, r, "a", 0))
	r.SetLoad(home, withRate(kvLoad(1000+100000), 5000, 2))
	busy := r.Pick(Request{Key: "b", PromptTokens: 30000, Now: t0.Add(time.Second)})
	defer busy.Release()
	if d := turn(t, r, "a", 2*time.Second); d.Outcome != Sticky || id(d) != home {
		t.Fatalf("with load control: %v on %s, want sticky on %s", d.Outcome, id(d), home)
	}
}
