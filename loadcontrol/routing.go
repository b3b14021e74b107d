// Package loadcontrol holds a turn of an agent's conversation at the proxy
// while its replica's KV cache holds other conversations' prompts, instead
// of letting it evict them (admission.go). It decides when a turn goes and
// to which replica's residency; where a turn goes within that is routing's
// business (package selection), which it asks through Routing. It imports
// neither Caddy nor routing, so that routing can hold a Gate per model and
// a View per config.
package loadcontrol

import (
	"time"

	"github.com/lmwarden/caddy-warden/promptprefix"
)

// Replica is routing's handle on one of its replicas. Load control keeps
// its state per handle, comparing handles by identity: routing must hand
// out one comparable value (a pointer) per replica, and nil for none.
type Replica any

// Routing is what load control asks of the routing in front of which it
// holds turns: a conversation's pin, the replicas' health and load, and
// what routing learns of prompts. Routing implements it for each config's
// view of its replicas; every method is safe for concurrent use and is
// called with the gate's lock held, so none may call back into load
// control.
type Routing interface {
	// Replicas lists the view's replicas in their order.
	Replicas() []Replica
	// Pin is the replica key's conversation is pinned to, nil for none.
	Pin(key uint64, now int64) Replica
	// Settle pins key's conversation to rep, where load control admitted
	// its turn: a new conversation is placed there, a pinned one moved.
	Settle(key uint64, rep Replica, now int64)
	// Usable reports whether rep may take a turn now (healthy, listed by
	// the view, and accepted by usable, the proxy's filter; nil: any).
	Usable(rep Replica, usable func(string) bool) bool
	// Healthy reports whether rep's health checks pass.
	Healthy(rep Replica) bool
	// AnyHealthy reports whether a replica usable's filter accepts is
	// healthy.
	AnyHealthy(usable func(string) bool) bool
	// Lightest is the least-loaded replica accepted by usable and by ok
	// (nil: all), healthy ones first; nil when none is.
	Lightest(usable func(string) bool, key uint64, ok func(Replica) bool) Replica
	// KVTokens is rep's KV cache in tokens as its metrics tell it, 0 when
	// unknown.
	KVTokens(rep Replica) int
	// GPUKVTokens is the part of it on the GPU, without a host tier; 0
	// when unknown.
	GPUKVTokens(rep Replica) int
	// EstimateTokens sizes a prompt from its body's bytes, and reports
	// whether a reply has taught the bytes per token yet.
	EstimateTokens(bodyBytes int64) (tokens int, learned bool)
	// BytesPerToken is the bytes per token prompts are sized with.
	BytesPerToken() float64
	// LearnTokenSize teaches routing a prompt's size in the server's
	// tokens from its reply.
	LearnTokenSize(bodyBytes int64, promptTokens int)
	// SharedPrefix is the prefix, in tokens, conversations share, and
	// where routing read it.
	SharedPrefix() (tokens int, source SharedPrefixSource)
	// NoteRequestPrefix tells routing the prefix parts a conversation
	// declared as it arrived without residency; NoteReplyPrefix, the
	// cached part of a turn placed beside other residents.
	NoteRequestPrefix(key uint64, prefix promptprefix.Prefix)
	NoteReplyPrefix(cached int)
	// LastPrompt is the size of key's conversation's last prompt, 0 when
	// unknown.
	LastPrompt(key uint64, now int64) int
}

// Turn is a request as load control sees it.
type Turn struct {
	// Key is the conversation's hashed key; 0 (none) is never held.
	Key uint64
	Now time.Time
	// Usable is the proxy's filter of replica addresses (nil: any).
	Usable func(string) bool
	// Flow is who sent the turn, FlowWeight its share against other flows
	// (flows.go), and Subagent marks a sub-agent's turn, which waits
	// behind its flow's main turns.
	Flow       uint64
	FlowWeight float64
	Subagent   bool
}

// View is one config's load control: its settings over the gate's state,
// and that config's routing.
type View struct {
	gate    *Gate
	cfg     Config
	on      bool // load control on, and affinity with it
	routing Routing
}

// View binds a config's settings, affinity and routing to the gate's
// state. cfg's defaults are filled in.
func (g *Gate) View(cfg Config, affinity bool, routing Routing) *View {
	cfg = cfg.WithDefaults()
	return &View{gate: g, cfg: cfg, on: cfg.Enabled && affinity, routing: routing}
}

// Holds reports whether key's conversation is resident on a replica.
func (g *Gate) Holds(key uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.residents[key] != nil
}

// Sweep ends the residencies idle past Linger and admits the turns that
// then fit; with load control off (a reload turned it off), it lets every
// waiting turn go. Call it periodically on the applied config's view.
func (v *View) Sweep(now time.Time) {
	if !v.cfg.Enabled {
		v.gate.ReleaseWaiting()
		return
	}
	v.gate.mu.Lock()
	notify := v.expire(now.UnixNano())
	v.gate.mu.Unlock()
	runAll(notify)
}

// sharedTokens is the shared prefix in tokens.
func (v *View) sharedTokens() int {
	n, _ := v.routing.SharedPrefix()
	return n
}
