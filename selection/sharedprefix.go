package selection

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/lmwarden/caddy-warden/loadcontrol"
	"github.com/lmwarden/caddy-warden/promptprefix"
)

// The shared prefix. An agent fleet's conversations start with the same
// system prompt and tools, which a replica's prefix cache holds once however
// many of them are resident there. Counting every resident's prompt whole
// overstates what a replica holds by that prefix for each resident but one,
// by an amount that depends on the agent, so no fixed fill can make up for
// it (docs/research/policy.md#the-shared-prefix has the measurements).
//
// Routing counts it too: a conversation moved to another replica finds the
// shared prefix cached there, and computes only the rest (cost.go).
//
// So the router learns the shared prefix from what new conversations find
// cached: the cached part vLLM reports (--enable-prompt-tokens-details,
// read by warden_stop_reason) for a turn it placed by load on a replica
// that already held residents, mostly a conversation's first, is the
// prefix it shares with them. vLLM reports nothing without that flag, its
// default: the router then reads the prefix from new conversations'
// requests, as the longest run of system prompt and tool parts
// (Body.Prefix) that a conversation's request shares with another recent
// conversation's. The
// replies win once they tell: the template's own tokens and a server that
// caches less than the requests share are in them.
// A replica's residents then hold the sum of their prompts less the shared
// prefix for each but one. Until either tells, nothing counts as shared:
// every prompt counts whole, and fewer conversations are resident than
// fit, never more.

// sharedWindow is how many recent samples the shared prefix is read from
// (first turns' replies, or new conversations' requests), and sharedAfter
// how many it waits for: their lower quartile, so that a few unusual ones
// move it little either way. A fork of a
// conversation, new to load control, finds its parent's whole history
// cached, which other conversations do not share; a first turn beside a
// resident still in its first prefill finds nothing. Of a fleet of two
// agents, it is the smaller one's prefix while that agent brings at least
// one first turn in four: overcounting the sharing would overfill the
// caches, undercounting only keeps fewer resident.
const (
	sharedWindow = 16
	sharedAfter  = 4
)

// sharedPrefix is the lower quartile of the last sharedWindow samples of
// the shared prefix: the tokens a new conversation's first turn found
// cached, or the body bytes a new conversation's request shares with
// another's (g.mu held for its methods).
type sharedPrefix struct {
	recent   [sharedWindow]int
	n        int // samples observed
	quartile int // the lower quartile of recent
}

// observe adds a sample.
func (p *sharedPrefix) observe(sample int) {
	p.recent[p.n%sharedWindow] = sample
	p.n++
	sorted := slices.Clone(p.recent[:min(p.n, sharedWindow)])
	slices.Sort(sorted)
	p.quartile = sorted[(len(sorted)-1)/4]
}

// known reports whether enough samples were observed.
func (p *sharedPrefix) known() bool { return p.n >= sharedAfter }

// value is the lower quartile of the samples, 0 until known.
func (p *sharedPrefix) value() int {
	if !p.known() {
		return 0
	}
	return p.quartile
}

// declaredPrefixes are the prefixes of the last sharedWindow conversations
// whose requests load control saw arrive without residency, to compare each
// new one with.
type declaredPrefixes struct {
	recent [sharedWindow]declaredPrefix
	next   int
}

type declaredPrefix struct {
	key    uint64
	prefix promptprefix.Prefix
}

// observe records key's prefix and returns the body bytes it shares with
// the most similar other conversation's. ok is false when no other
// conversation's prefix was recorded, and for a conversation already
// recorded (back after linger, or a turn resent after a refusal): a sample
// per conversation, so that a few that come back often do not make up the
// quartile.
func (d *declaredPrefixes) observe(key uint64, prefix promptprefix.Prefix) (shared int, ok bool) {
	for i, r := range d.recent {
		if r.key == key {
			d.recent[i].prefix = prefix
			return 0, false
		}
	}
	for _, r := range d.recent {
		if r.prefix != nil {
			shared, ok = max(shared, prefix.SharedBytes(r.prefix)), true
		}
	}
	d.recent[d.next] = declaredPrefix{key, prefix}
	d.next = (d.next + 1) % sharedWindow
	return shared, ok
}

// prefixLearner learns the shared prefix, from replies and from requests.
// Routing reads it on every request, so what it learnt is kept in atomics;
// its lock serialises learning only.
type prefixLearner struct {
	mu sync.Mutex
	// replies is the prefix new conversations find cached; requests the
	// body bytes their requests share, which stand for it until the
	// replies tell.
	replies, requests sharedPrefix
	declared          declaredPrefixes
	// fromReplies (tokens) and fromRequests (body bytes) are the values
	// learnt, -1 while unknown.
	fromReplies, fromRequests atomic.Int64
}

func newPrefixLearner() *prefixLearner {
	l := &prefixLearner{}
	l.fromReplies.Store(-1)
	l.fromRequests.Store(-1)
	return l
}

// publish makes what the samples tell readable (l.mu held).
func (l *prefixLearner) publish() {
	if l.replies.known() {
		l.fromReplies.Store(int64(l.replies.value()))
	}
	if l.requests.known() {
		l.fromRequests.Store(int64(l.requests.value()))
	}
}

// noteRequest learns from the prefix parts of a new conversation's request.
func (l *prefixLearner) noteRequest(key uint64, prefix promptprefix.Prefix) {
	if len(prefix) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if shared, ok := l.declared.observe(key, prefix); ok {
		l.requests.observe(shared)
		l.publish()
	}
}

// noteReply learns from the cached part of a reply to a new conversation's
// first turn.
func (l *prefixLearner) noteReply(cached int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.replies.observe(cached)
	l.publish()
}

// repliesKnown reports whether the replies have told the shared prefix.
func (l *prefixLearner) repliesKnown() bool { return l.fromReplies.Load() >= 0 }

// tokens is the shared prefix in tokens: the replies' once they told it,
// else the requests' at perToken body bytes per token, else 0.
func (l *prefixLearner) tokens(perToken float64) (tokens int, source loadcontrol.SharedPrefixSource) {
	if n := l.fromReplies.Load(); n >= 0 {
		return int(n), loadcontrol.SharedFromReplies
	}
	if n := l.fromRequests.Load(); n >= 0 {
		return tokensOf(n, perToken), loadcontrol.SharedFromRequests
	}
	return 0, loadcontrol.SharedUnknown
}

// sharedTokens is the shared prefix in tokens (prefixLearner.tokens).
func (r *Router) sharedTokens() int {
	n, _ := r.sharedPrefix()
	return n
}

// sharedPrefix is the shared prefix in tokens and where it was learnt.
func (r *Router) sharedPrefix() (int, loadcontrol.SharedPrefixSource) {
	perToken, _ := r.bytesPerTokenLearned()
	return r.prefix.tokens(perToken)
}
