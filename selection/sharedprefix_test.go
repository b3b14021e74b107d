package selection

import (
	"testing"
	"time"
)

// A replica holds the prefix its residents share once: load control learns
// it from what a new conversation's first turn, admitted beside residents,
// found cached, and then admits a conversation that fits only so counted.
// Turns that say nothing of the sharing teach nothing: a first turn on an
// empty replica, a resident's later turn (which finds its own history
// cached).
func TestSharedPrefixIsCountedOnceOnceLearned(t *testing.T) {
	r := newTestRouter(1, Config{Admission: AdmissionConfig{
		Enabled: true, CapacityTokens: 150, Fill: 1, MinResidents: 1, Linger: time.Minute, Quantum: -1,
	}})
	admit := func(key string) *Ticket {
		return r.Admit(HashKey(key), Body{Bytes: 60 * BytesPerToken}, nil, t0, nil)
	}
	shared := func() (int, bool) {
		st := r.Status().Admission
		return st.SharedPrefix, st.SharedPrefixKnown
	}

	a := admit("a")
	mustState(t, a, Admitted)
	a.End(t0, Reply{PromptTokens: 60, CacheReported: true}) // alone: nothing to share with
	if n, known := shared(); known {
		t.Fatalf("learned a shared prefix of %d from a first turn on an empty replica", n)
	}
	b := admit("b")
	mustState(t, b, Admitted)
	b.End(t0, Reply{PromptTokens: 60, CachedTokens: 50, CacheReported: true})
	if n, known := shared(); !known || n != 50 {
		t.Fatalf("shared prefix %d (known %v) after b found 50 tokens cached beside a, want 50", n, known)
	}
	admit("a").End(t0, Reply{PromptTokens: 60, CachedTokens: 60, CacheReported: true})
	if n, _ := shared(); n != 50 {
		t.Fatalf("shared prefix %d after a resident's turn found its own history cached, want 50", n)
	}

	// 3 × 60 tokens counted whole overfill 150; with 50 shared they hold 80.
	c := admit("c")
	mustState(t, c, Admitted)
	if got := r.Status().Replicas[0]; got.Residents != 3 || got.ResidentTokens != 80 {
		t.Fatalf("%d residents holding %d tokens, want 3 holding 80 (60 + 2 × 10)", got.Residents, got.ResidentTokens)
	}
}

// Until a reply reports its cached part, every prompt counts whole.
func TestSharedPrefixUnknownCountsPromptsWhole(t *testing.T) {
	r := newTestRouter(1, Config{Admission: AdmissionConfig{
		Enabled: true, CapacityTokens: 150, Fill: 1, MinResidents: 1, Linger: time.Minute, Quantum: -1,
	}})
	for _, key := range []string{"a", "b"} {
		tk := r.Admit(HashKey(key), Body{Bytes: 60 * BytesPerToken}, nil, t0, nil)
		mustState(t, tk, Admitted)
		tk.End(t0, Reply{PromptTokens: 60}) // no cached part reported
	}
	mustState(t, r.Admit(HashKey("c"), Body{Bytes: 60 * BytesPerToken}, nil, t0, nil), Waiting)
	if st := r.Status(); st.Admission.SharedPrefixKnown || st.Replicas[0].ResidentTokens != 120 {
		t.Fatalf("shared prefix known %v, resident tokens %d; want unknown, 120", st.Admission.SharedPrefixKnown, st.Replicas[0].ResidentTokens)
	}
}

// By default a replica takes a second conversation however large, so that
// it does not idle through the tool pauses of its only one; a third must fit.
func TestAdmissionSecondResidentHoweverLarge(t *testing.T) {
	r := newTestRouter(1, Config{Admission: AdmissionConfig{
		Enabled: true, CapacityTokens: 100, Fill: 1, Linger: time.Minute,
	}})
	admit := func(key string, tokens int) *Ticket {
		return r.Admit(HashKey(key), Body{Bytes: int64(tokens * BytesPerToken)}, nil, t0, nil)
	}
	mustState(t, admit("a", 90), Admitted)
	mustState(t, admit("b", 90), Admitted)
	mustState(t, admit("c", 1), Waiting)
}

// The shared prefix is the lower quartile of the recent first turns: a
// fork that finds its parent's whole history cached, or a first turn that
// found nothing, moves it little; a new agent version's prompt takes over
// once most first turns carry it; of two agents, the smaller prefix counts
// unless the other brings more than three first turns in four.
func TestSharedPrefixIgnoresOutliers(t *testing.T) {
	var p sharedPrefix
	for _, cached := range []int{0, 3000, 3000, 3000, 3000, 3000, 3000, 50000} {
		p.observe(cached)
	}
	if got := p.value(); got != 3000 {
		t.Fatalf("shared prefix %d among first turns of 3,000 with a 0 and a 50,000, want 3,000", got)
	}
	for range 12 {
		p.observe(4000)
	}
	if got := p.value(); got != 4000 {
		t.Fatalf("shared prefix %d after 12 first turns of 4,000 in 16, want 4,000", got)
	}
	// Two agents, the larger prefix in 11 first turns of 16: the smaller
	// still counts, since overcounting the sharing would overfill.
	for i := range 16 {
		cached := 8000
		if i < 5 {
			cached = 2000
		}
		p.observe(cached)
	}
	if got := p.value(); got != 2000 {
		t.Fatalf("shared prefix %d among 5 first turns of 2,000 and 11 of 8,000, want 2,000", got)
	}
}
