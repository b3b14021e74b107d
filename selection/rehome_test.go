package selection

import (
	"testing"
	"time"
)

// kvLoad is a replica with a 40,000-token cache, 10% in use, that has
// written written tokens to it.
func kvLoad(written float64) Load {
	return Load{Known: true, KVTokens: 40000, KVUsage: 0.1, Written: written}
}

// turn sends one request of conv, ended at once.
func turn(t *testing.T, r testRouter, conv string, at time.Duration) Decision {
	t.Helper()
	d := r.Pick(Request{Key: conv, PromptTokens: 10000, Now: t0.Add(at)})
	if d.Outcome == NoReplica {
		t.Fatalf("no replica for %s", conv)
	}
	d.Release()
	return d
}

// A conversation stays while its pin has written less than the free room
// it had when its last turn ended (36,000 tokens) plus a quarter of its
// prompt (2,500); past that it is rehomed, to the replica sent a request
// longest ago, and stays there.
func TestColdConversationIsRehomed(t *testing.T) {
	r := newTestRouter(3, Config{MaxNumSeqs: 32})
	for _, rep := range r.Replicas() {
		r.SetLoad(rep.ID, kvLoad(1000))
	}
	home := id(turn(t, r, "a", 0))
	turn(t, r, "b", time.Second) // b and c take the two others, c last
	turn(t, r, "c", 2*time.Second)
	r.SetLoad(home, kvLoad(1000+36000+2400))
	if d := turn(t, r, "a", 3*time.Second); d.Outcome != Sticky || id(d) != home {
		t.Fatalf("2,400 tokens past the free room: %v on %s, want sticky on %s", d.Outcome, id(d), home)
	}
	r.SetLoad(home, kvLoad(1000+36000+2400+36000+2600))
	d := turn(t, r, "a", 4*time.Second)
	if d.Outcome != Rehomed || id(d) == home {
		t.Fatalf("2,600 tokens past the free room: %v on %s, want rehomed off %s", d.Outcome, id(d), home)
	}
	if b := id(turn(t, r, "b", 5*time.Second)); id(d) != b {
		t.Errorf("rehomed to %s, want %s, the replica sent a request longest ago (b's)", id(d), b)
	}
	if again := turn(t, r, "a", 6*time.Second); again.Outcome != Sticky || id(again) != id(d) {
		t.Errorf("next turn: %v on %s, want sticky on %s", again.Outcome, id(again), id(d))
	}
	if rehomed := total(r.Status(), func(rs ReplicaStatus) uint64 { return rs.Rehomed }); rehomed != 1 {
		t.Errorf("rehomed counted %d times, want 1", rehomed)
	}
}

// A restarted engine (its counters back to 0) has lost every cache, even
// once it has written past its old count when the conversation comes back.
func TestRestartedEngineMakesItsConversationsCold(t *testing.T) {
	for _, since := range []float64{100, 60000} {
		r := newTestRouter(2, Config{MaxNumSeqs: 32})
		for _, rep := range r.Replicas() {
			r.SetLoad(rep.ID, kvLoad(50000))
		}
		home := id(turn(t, r, "a", 0))
		r.SetLoad(home, kvLoad(100)) // restarted
		r.SetLoad(home, kvLoad(since))
		if d := turn(t, r, "a", time.Second); d.Outcome != Rehomed {
			t.Errorf("its pin restarted, %.0f tokens written since: %v on %s, want rehomed", since, d.Outcome, id(d))
		}
	}
}

// A conversation with a request still running on its pin is never cold:
// its blocks are in use, not free to evict.
func TestRunningConversationIsNotCold(t *testing.T) {
	r := newTestRouter(2, Config{MaxNumSeqs: 32})
	for _, rep := range r.Replicas() {
		r.SetLoad(rep.ID, kvLoad(1000))
	}
	home := id(turn(t, r, "a", 0))
	running := r.Pick(Request{Key: "a", PromptTokens: 10000, Now: t0.Add(time.Second)})
	defer running.Release()
	r.SetLoad(home, kvLoad(1000+100000))
	if d := turn(t, r, "a", 2*time.Second); d.Outcome != Sticky || id(d) != home {
		t.Fatalf("with a request running: %v on %s, want sticky on %s", d.Outcome, id(d), home)
	}
}

// A request still in flight when its conversation moved away and came back
// to the same replica ends without touching the new turn's count: the new
// turn is still running, so the conversation is not cold.
func TestRequestSentBeforeAMoveDoesNotEndTheNewTurn(t *testing.T) {
	r := newTestRouter(2, Config{MaxNumSeqs: 32})
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
	if d := turn(t, r, "a", 4*time.Second); d.Outcome != Sticky || id(d) != home {
		t.Fatalf("with its new turn running: %v on %s, want sticky on %s", d.Outcome, id(d), home)
	}
}

// Without the engines' counters nothing is ever judged cold.
func TestNoCountersNoRehoming(t *testing.T) {
	r := newTestRouter(2, Config{MaxNumSeqs: 32})
	home := id(turn(t, r, "a", 0))
	for i := range 5 {
		if d := turn(t, r, "a", time.Duration(i+1)*time.Second); d.Outcome != Sticky || id(d) != home {
			t.Fatalf("turn %d: %v on %s", i+2, d.Outcome, id(d))
		}
	}
}

// A spilled request has nothing cached elsewhere: it goes to the replica
// with room that was sent a request longest ago, whatever its in-flight
// count says.
func TestSpillGoesToTheReplicaSentLongestAgo(t *testing.T) {
	r := newTestRouter(3, Config{SpillThreshold: 2})
	var held []Decision
	defer func() {
		for _, d := range held {
			d.Release()
		}
	}()
	pick := func(conv string, at time.Duration) Decision {
		d := r.Pick(Request{Key: conv, Now: t0.Add(at)})
		held = append(held, d)
		return d
	}
	home := id(pick("a", 0))
	older := id(pick("b", 2*time.Second)) // b's replica: 1 in flight
	c := r.Pick(Request{Key: "c", Now: t0.Add(3 * time.Second)})
	c.Release() // c's replica: none in flight, but sent a request later
	newer := id(c)
	if older == home || newer == home || older == newer {
		t.Fatalf("a on %s, b on %s, c on %s: want three replicas", home, older, newer)
	}
	pick("a", 4*time.Second)
	pick("a", 5*time.Second) // a's pin: 3 in flight, over 2
	d := pick("a", 6*time.Second)
	if d.Outcome != Spilled || id(d) != older {
		t.Fatalf("%v on %s, want spilled to %s (sent a request at 2 s; %s at 3 s)", d.Outcome, id(d), older, newer)
	}
}

// With load control on, the gate keeps residents' caches and moves the
// others itself: a pick does not rehome.
func TestLoadControlDoesNotRehome(t *testing.T) {
	r := newTestRouter(2, Config{MaxNumSeqs: 32, Admission: AdmissionConfig{Enabled: true}})
	for _, rep := range r.Replicas() {
		r.SetLoad(rep.ID, kvLoad(1000))
	}
	home := id(turn(t, r, "a", 0))
	r.SetLoad(home, kvLoad(1000+100000))
	if d := turn(t, r, "a", time.Second); d.Outcome != Sticky || id(d) != home {
		t.Fatalf("with load control: %v on %s, want sticky on %s", d.Outcome, id(d), home)
	}
}
