package selection

import (
	"fmt"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
	"github.com/lmwarden/caddy-warden/promptprefix"
)

// sharedRouter is one replica whose cache holds capacity tokens; a replica
// takes a second conversation only if it fits, and residents stay. Load
// control holds turns: it places new conversations itself.
func sharedRouter(capacity int) testRouter {
	return holding(newTestRouter(1, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: capacity, Fill: 1, MinResidents: 1, Linger: time.Hour, Quantum: -1,
	}}))
}

// endTurn admits a 60-token turn of key and ends it with its reply.
func endTurn(t *testing.T, r testRouter, key string, reply loadcontrol.Reply) {
	t.Helper()
	tk := r.admitKey(HashKey(key), loadcontrol.Body{Bytes: 60 * BytesPerToken}, nil, t0, nil)
	mustState(t, tk, loadcontrol.Admitted)
	tk.End(t0, reply)
}

// learnedPrefix is the shared prefix and whether the replies told it.
func learnedPrefix(r testRouter) (int, bool) {
	st := r.Status().Admission
	return st.SharedPrefix, st.SharedPrefixSource == loadcontrol.SharedFromReplies
}

// Load control learns the shared prefix from what new conversations' first
// turns, admitted beside residents, found cached, once four did. Turns that
// say nothing of the sharing teach nothing: a first turn alone on its
// replica (which may find an earlier run's history), a resident's later
// turn, and a pinned conversation's return (which finds its own history).
func TestSharedPrefixLearnedFromFirstTurnsBesideResidents(t *testing.T) {
	r := sharedRouter(10000)
	endTurn(t, r, "alone", loadcontrol.Reply{PromptTokens: 60, CachedTokens: 55, CacheReported: true})
	endTurn(t, r, "ended", loadcontrol.Reply{PromptTokens: 60, CachedTokens: 50, CacheReported: true, TaskEnded: true})
	endTurn(t, r, "ended", loadcontrol.Reply{PromptTokens: 60, CachedTokens: 58, CacheReported: true}) // pinned, back
	for i := range 3 {
		if n, known := learnedPrefix(r); known {
			t.Fatalf("shared prefix %d known after %d first turns beside residents, want unknown before 4", n, i+1)
		}
		endTurn(t, r, fmt.Sprintf("c%d", i), loadcontrol.Reply{PromptTokens: 60, CachedTokens: 50, CacheReported: true})
	}
	endTurn(t, r, "c0", loadcontrol.Reply{PromptTokens: 60, CachedTokens: 60, CacheReported: true}) // resident
	if n, known := learnedPrefix(r); !known || n != 50 {
		t.Fatalf("shared prefix %d (known %v), want 50", n, known)
	}
}

// A replica holds the shared prefix once: its residents' prompts less the
// prefix for each but one, never less than the new prompt or a mean one.
// Once learned, a conversation is admitted that fits only so counted.
func TestSharedPrefixIsCountedOnce(t *testing.T) {
	r := sharedRouter(10000)
	endTurn(t, r, "first", loadcontrol.Reply{PromptTokens: 60})
	for i := range 4 {
		endTurn(t, r, fmt.Sprintf("c%d", i), loadcontrol.Reply{PromptTokens: 60, CachedTokens: 50, CacheReported: true})
	}
	if got := r.Status().Replicas[0].ResidentTokens; got != 100 {
		t.Fatalf("5 residents of 60 with 50 shared hold %d tokens, want 100", got)
	}
	// 6 prompts of 60 hold 110; counted whole, or the new one not counted
	// among those that share, 360 or 160.
	tight := r.cfg
	tight.Admission.CapacityTokens = 150
	r.reload(tight, servers(1))
	mustState(t, r.admitKey(HashKey("fits"), loadcontrol.Body{Bytes: 60 * BytesPerToken}, nil, t0, nil), loadcontrol.Admitted)
	mustState(t, r.admitKey(HashKey("too-large"), loadcontrol.Body{Bytes: 200 * BytesPerToken}, nil, t0, nil), loadcontrol.Waiting)

}

// Once the server has reported a cached part, a first turn whose reply
// leaves it out found nothing cached (vLLM omits a zero): a fleet that
// shares nothing is not taken for one that shares what a few forks found.
func TestSharedPrefixCountsFirstTurnsThatFoundNothing(t *testing.T) {
	r := sharedRouter(10000)
	endTurn(t, r, "first", loadcontrol.Reply{PromptTokens: 60})
	endTurn(t, r, "fork", loadcontrol.Reply{PromptTokens: 60, CachedTokens: 55, CacheReported: true})
	for i := range 3 {
		endTurn(t, r, fmt.Sprintf("c%d", i), loadcontrol.Reply{PromptTokens: 60})
	}
	if n, known := learnedPrefix(r); !known || n != 0 {
		t.Fatalf("shared prefix %d (known %v) after a fork and 3 first turns that found nothing, want 0", n, known)
	}
}

// Until a reply reports its cached part, every prompt counts whole.
func TestSharedPrefixUnknownCountsPromptsWhole(t *testing.T) {
	r := sharedRouter(150)
	for _, key := range []string{"a", "b"} {
		endTurn(t, r, key, loadcontrol.Reply{PromptTokens: 60}) // no cached part reported
	}
	mustState(t, r.admitKey(HashKey("c"), loadcontrol.Body{Bytes: 60 * BytesPerToken}, nil, t0, nil), loadcontrol.Waiting)
	if st := r.Status(); st.Admission.SharedPrefixSource != loadcontrol.SharedUnknown || st.Replicas[0].ResidentTokens != 120 {
		t.Fatalf("shared prefix from %v, resident tokens %d; want unknown, 120", st.Admission.SharedPrefixSource, st.Replicas[0].ResidentTokens)
	}
}

// The shared prefix is the lower quartile of the recent first turns: a
// fork that finds its parent's whole history cached, or a first turn that
// found nothing, moves it little; a new agent version's prompt takes over
// once three first turns in four carry it; of two agents, the smaller
// prefix counts while it comes in at least one first turn in four.
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
	for i := range 16 {
		cached := 8000
		if i < 4 {
			cached = 2000
		}
		p.observe(cached)
	}
	if got := p.value(); got != 2000 {
		t.Fatalf("shared prefix %d among 4 first turns of 2,000 and 12 of 8,000, want 2,000", got)
	}
}

// By default a replica takes a second conversation however large, so that
// it does not idle through the tool pauses of its only one, and keeps both
// when their replies show them larger still; a third must fit.
func TestAdmissionSecondResidentHoweverLarge(t *testing.T) {
	r := newTestRouter(1, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 100, Fill: 1, Linger: time.Minute,
	}})
	admit := func(key string, tokens int) *loadcontrol.Ticket {
		return r.admitKey(HashKey(key), loadcontrol.Body{Bytes: int64(tokens * BytesPerToken)}, nil, t0, nil)
	}
	a, b := admit("a", 40), admit("b", 40)
	mustState(t, a, loadcontrol.Admitted)
	mustState(t, b, loadcontrol.Admitted)
	a.End(t0, loadcontrol.Reply{PromptTokens: 90}) // sized on the assumed bytes per token: 90, not 40
	b.End(t0, loadcontrol.Reply{PromptTokens: 90})
	if got := r.Status().Replicas[0].Residents; got != 2 {
		t.Fatalf("%d residents after their replies showed 2 × 90 tokens, want both kept", got)
	}
	mustState(t, admit("c", 1), loadcontrol.Waiting)
}

// prefixOf builds a promptprefix.Prefix whose parts are named by names and take bytes each.
func prefixOf(bytes int, names ...string) promptprefix.Prefix {
	var p promptprefix.Prefix
	var hash uint64
	for i, name := range names {
		hash = hash*31 + HashKey(name)
		p = append(p, promptprefix.Part{Hash: hash, Bytes: (i + 1) * bytes})
	}
	return p
}

// Without cached parts in the replies (vLLM's default), load control reads
// the shared prefix from the requests: the system prompt and tool parts a
// new conversation's request shares with another recent one's, in tokens
// at the bytes per token learned. A conversation compared with nothing, a
// resident's turns and a conversation's return teach nothing; the replies
// win once they tell.
func TestSharedPrefixReadFromRequests(t *testing.T) {
	r := sharedRouter(10000)
	turn := func(key string, prefix promptprefix.Prefix, reply loadcontrol.Reply) {
		t.Helper()
		tk := r.admitKey(HashKey(key), loadcontrol.Body{Bytes: 1000 * BytesPerToken, Prefix: prefix}, nil, t0, nil)
		mustState(t, tk, loadcontrol.Admitted)
		tk.End(t0, reply)
	}
	agent := prefixOf(400, "system", "tool-a", "tool-b") // 1,200 bytes, 300 tokens
	other := prefixOf(400, "system", "tool-a", "tool-c") // shares 800 bytes with agent
	turn("a0", agent, loadcontrol.Reply{})               // nothing to compare with
	turn("a0", agent, loadcontrol.Reply{})               // resident
	for i := range 4 {
		if st := r.Status().Admission; st.SharedPrefixSource != loadcontrol.SharedUnknown {
			t.Fatalf("shared prefix from %v after %d conversations compared, want unknown before 4", st.SharedPrefixSource, i)
		}
		turn(fmt.Sprintf("a%d", i+1), agent, loadcontrol.Reply{})
	}
	turn("o", other, loadcontrol.Reply{}) // one in five: the lower quartile stays
	st := r.Status().Admission
	if st.SharedPrefixSource != loadcontrol.SharedFromRequests || st.SharedPrefix != 300 {
		t.Fatalf("shared prefix %d from %v, want 300 from the requests", st.SharedPrefix, st.SharedPrefixSource)
	}
	// 4,000 bytes of prompt for 2,000 tokens: 2 bytes per token, so the
	// 1,200 bytes shared are 600 tokens.
	turn("a1", agent, loadcontrol.Reply{PromptTokens: 2000})
	if st := r.Status().Admission; st.SharedPrefix != 600 {
		t.Fatalf("shared prefix %d at 2 bytes per token, want 600", st.SharedPrefix)
	}
	for i := range 4 {
		turn(fmt.Sprintf("r%d", i), agent, loadcontrol.Reply{PromptTokens: 1000, CachedTokens: 250, CacheReported: true})
	}
	if st := r.Status().Admission; st.SharedPrefixSource != loadcontrol.SharedFromReplies || st.SharedPrefix != 250 {
		t.Fatalf("shared prefix %d from %v once 4 replies told 250, want 250 from the replies", st.SharedPrefix, st.SharedPrefixSource)
	}
}

// Prefixes share the bytes of their parts up to the first that differs.
func TestPrefixSharedBytes(t *testing.T) {
	for _, c := range []struct {
		p, q promptprefix.Prefix
		want int
	}{
		{prefixOf(10, "s", "a", "b"), prefixOf(10, "s", "a", "b"), 30},
		{prefixOf(10, "s", "a", "b"), prefixOf(10, "s", "a"), 20},
		{prefixOf(10, "s", "a", "b"), prefixOf(10, "s", "x", "b"), 10},
		{prefixOf(10, "s"), prefixOf(10, "t"), 0},
		{nil, prefixOf(10, "s"), 0},
	} {
		if got := c.p.SharedBytes(c.q); got != c.want {
			t.Errorf("%v shares %d bytes with %v, want %d", c.p, got, c.q, c.want)
		}
	}
}

// A turn's prefix parts are wanted only for a conversation the router
// does not know yet or, with load control, one not resident; never for a
// turn without a key or with affinity off.
func TestWantsPrefix(t *testing.T) {
	off := newTestRouter(1, Config{})
	if !off.WantsPrefix(HashKey("a")) {
		t.Error("load control off: a new conversation's prefix not wanted")
	}
	pick(t, off, "a").Release()
	if off.WantsPrefix(HashKey("a")) {
		t.Error("load control off: a known conversation's prefix wanted")
	}
	noAffinity := newTestRouter(1, Config{})
	noAffinity.reload(Config{}, servers(1))
	if noAffinity.WantsPrefix(HashKey("b")) {
		t.Error("affinity off: prefix wanted")
	}
	r := sharedRouter(10000)
	if r.WantsPrefix(0) {
		t.Error("a turn without a key: prefix wanted")
	}
	if !r.WantsPrefix(HashKey("a")) {
		t.Fatal("a new conversation's prefix not wanted")
	}
	endTurn(t, r, "a", loadcontrol.Reply{})
	if r.WantsPrefix(HashKey("a")) {
		t.Error("a resident conversation's prefix wanted")
	}
}

// A conversation counts once among the requests' samples: another agent's
// two conversations that come back again and again (after their tasks
// end, or resent after a refusal) do not outweigh six of the main agent's.
func TestSharedPrefixFromRequestsOneSamplePerConversation(t *testing.T) {
	r := sharedRouter(100000)
	turn := func(key string, prefix promptprefix.Prefix) {
		t.Helper()
		tk := r.admitKey(HashKey(key), loadcontrol.Body{Bytes: 1000 * BytesPerToken, Prefix: prefix}, nil, t0, nil)
		mustState(t, tk, loadcontrol.Admitted)
		tk.End(t0, loadcontrol.Reply{TaskEnded: true}) // not resident: its next turn is read again
	}
	main, other := prefixOf(400, "main"), prefixOf(4000, "other")
	for i := range 6 {
		turn(fmt.Sprintf("m%d", i), main)
	}
	for range 8 {
		turn("o0", other)
		turn("o1", other)
	}
	if st := r.Status().Admission; st.SharedPrefix != 100 {
		t.Fatalf("shared prefix %d tokens with two conversations of another agent back 8 times each, want the main agent's 100", st.SharedPrefix)
	}
}

// Once the replies have told the shared prefix, no request body need be
// read for it.
func TestWantsPrefixNotOnceRepliesTell(t *testing.T) {
	r := sharedRouter(10000)
	for i := range 5 {
		endTurn(t, r, fmt.Sprintf("c%d", i), loadcontrol.Reply{PromptTokens: 60, CachedTokens: 50, CacheReported: true})
	}
	if r.WantsPrefix(HashKey("new")) {
		t.Error("prefix wanted although the replies told it")
	}
}
