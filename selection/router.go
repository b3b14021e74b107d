package selection

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Config.
const (
	DefaultMaxNumSeqs   = 32
	DefaultSessionTTL   = 30 * time.Minute
	DefaultActiveWindow = 2 * time.Minute
	DefaultMaxSessions  = 100_000
)

// Config is a model's routing configuration.
type Config struct {
	// MaxNumSeqs is vLLM's --max-num-seqs of each replica.
	MaxNumSeqs int
	// SpillThreshold is the in-flight count above which a pinned replica
	// sheds a request; 0 means auto (MaxNumSeqs/4, at least 1).
	SpillThreshold int
	// Affinity pins conversations to replicas; off places every request by load.
	Affinity bool
	// SessionTTL forgets a conversation idle that long.
	SessionTTL time.Duration
	// ActiveWindow is how recently a conversation must have sent a request
	// to count as load on its replica when placing new conversations.
	ActiveWindow time.Duration
	// MaxSessions bounds the session table; the least recently used go first.
	MaxSessions int
	// Rule is the routing rule: RuleSeed (also "", the default) or
	// RuleCacheFit. An unknown name (see CheckRule) is taken as the default.
	Rule string
	// BytesPerToken converts Request.PromptBytes into prompt tokens for
	// RuleCacheFit; 0 means DefaultBytesPerToken.
	BytesPerToken float64
}

func (c Config) withDefaults() Config {
	if c.MaxNumSeqs <= 0 {
		c.MaxNumSeqs = DefaultMaxNumSeqs
	}
	if c.SessionTTL <= 0 {
		c.SessionTTL = DefaultSessionTTL
	}
	if c.ActiveWindow <= 0 {
		c.ActiveWindow = DefaultActiveWindow
	}
	if c.MaxSessions <= 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	if c.BytesPerToken <= 0 {
		c.BytesPerToken = DefaultBytesPerToken
	}
	return c
}

// AutoSpillThreshold is the seed's default: a quarter of max_num_seqs.
func AutoSpillThreshold(maxNumSeqs int) int {
	return max(1, maxNumSeqs/4)
}

// fleet is an immutable view of a model's replicas, swapped on reconfiguration.
type fleet struct {
	replicas []*replicaState
	byID     map[string]*replicaState
}

// Router routes one model's requests over its replicas. It is safe for
// concurrent use; its state is meant to outlive config reloads.
type Router struct {
	model string
	since time.Time

	fleet    atomic.Pointer[fleet]
	sessions *sessionTable
	// placeMu serialises decisions that compare replicas, so that the load a
	// decision adds is visible to the next one (a burst of new conversations
	// spreads instead of piling on one replica).
	placeMu sync.Mutex

	affinity      atomic.Bool
	spillManual   atomic.Int64 // 0 = auto
	maxNumSeqs    atomic.Int64
	ttl           atomic.Int64 // nanoseconds
	activeWindow  atomic.Int64 // nanoseconds
	rule          atomic.Uint32
	bytesPerToken atomic.Uint64 // float64 bits

	configured Config                   // last configuration applied by Configure, under placeMu
	retired    map[string]*replicaState // removed replicas by ID, under placeMu

	requests  atomic.Uint64
	unkeyed   atomic.Uint64
	noReplica atomic.Uint64
	evicted   atomic.Uint64
	expired   atomic.Uint64
}

// NewRouter returns a router for model over replicas.
func NewRouter(model string, cfg Config, replicas []Replica, now time.Time) *Router {
	cfg = cfg.withDefaults()
	r := &Router{model: model, since: now, sessions: newSessionTable(cfg.MaxSessions), retired: map[string]*replicaState{}}
	r.fleet.Store(&fleet{byID: map[string]*replicaState{}})
	r.apply(cfg, true)
	r.SetReplicas(replicas)
	return r
}

// Model is the model name the router serves.
func (r *Router) Model() string { return r.model }

// Configure applies a (re)loaded configuration. A setting whose configured
// value did not change since the last load keeps its runtime value, so a
// reload of the same config keeps an affinity or threshold toggled through
// the admin API.
func (r *Router) Configure(cfg Config) {
	r.apply(cfg.withDefaults(), false)
}

func (r *Router) apply(cfg Config, first bool) {
	r.placeMu.Lock()
	defer r.placeMu.Unlock()
	old := r.configured
	if first || cfg.Affinity != old.Affinity {
		r.affinity.Store(cfg.Affinity)
	}
	if first || cfg.SpillThreshold != old.SpillThreshold {
		r.spillManual.Store(int64(max(0, cfg.SpillThreshold)))
	}
	r.maxNumSeqs.Store(int64(cfg.MaxNumSeqs))
	r.ttl.Store(int64(cfg.SessionTTL))
	r.activeWindow.Store(int64(cfg.ActiveWindow))
	parsed, _ := parseRule(cfg.Rule)
	r.rule.Store(uint32(parsed))
	r.bytesPerToken.Store(math.Float64bits(cfg.BytesPerToken))
	if first || cfg.MaxSessions != old.MaxSessions {
		r.sessions.setCapacity(cfg.MaxSessions)
	}
	r.configured = cfg
}

// SetReplicas replaces the fleet. Replicas whose ID is kept keep their
// counters and conversations; conversations pinned to a removed replica are
// placed again on their next request, unless it comes back first: a replica
// listed again takes up its state (streams still in flight, pins, counters).
func (r *Router) SetReplicas(replicas []Replica) {
	r.placeMu.Lock()
	defer r.placeMu.Unlock()
	old := r.fleet.Load()
	next := &fleet{byID: make(map[string]*replicaState, len(replicas))}
	for _, rep := range replicas {
		if _, dup := next.byID[rep.ID]; dup {
			continue
		}
		s := old.byID[rep.ID]
		if s == nil {
			s = r.retired[rep.ID]
			delete(r.retired, rep.ID)
		}
		if s == nil {
			s = newReplicaState(rep)
			s.healthy.Store(true) // until its metrics say otherwise
		}
		s.removed.Store(false)
		next.replicas = append(next.replicas, s)
		next.byID[rep.ID] = s
	}
	for id, s := range old.byID {
		if next.byID[id] == nil {
			s.removed.Store(true)
			r.retired[id] = s
		}
	}
	r.fleet.Store(next)
}

// SetAffinity switches affinity at runtime; pins are kept either way.
func (r *Router) SetAffinity(on bool) { r.affinity.Store(on) }

// Affinity reports whether conversations are pinned.
func (r *Router) Affinity() bool { return r.affinity.Load() }

// SetSpillThreshold sets a fixed threshold, or auto when n <= 0.
func (r *Router) SetSpillThreshold(n int) { r.spillManual.Store(int64(max(0, n))) }

// SpillThreshold returns the threshold in force and whether it is automatic.
func (r *Router) SpillThreshold() (n int, auto bool) {
	if m := r.spillManual.Load(); m > 0 {
		return int(m), false
	}
	return AutoSpillThreshold(int(r.maxNumSeqs.Load())), true
}

// SetLoad records the replica's metrics; unknown IDs are ignored.
func (r *Router) SetLoad(id string, l Load) {
	if s := r.fleet.Load().byID[id]; s != nil {
		s.setLoad(l)
	}
}

// SetHealthy records whether the replica can take work.
func (r *Router) SetHealthy(id string, ok bool) {
	if s := r.fleet.Load().byID[id]; s != nil {
		s.healthy.Store(ok)
	}
}

// Replicas lists the current fleet.
func (r *Router) Replicas() []Replica {
	f := r.fleet.Load()
	out := make([]Replica, len(f.replicas))
	for i, s := range f.replicas {
		out[i] = s.Replica
	}
	return out
}

// Sweep forgets conversations idle past the TTL and ends the active state of
// those idle past the active window. Call it periodically (every second).
func (r *Router) Sweep(now time.Time) {
	ttl, window := r.ttl.Load(), r.activeWindow.Load()
	for i := range r.sessions.shards {
		sh := &r.sessions.shards[i]
		sh.mu.Lock()
		n := sh.sweep(now.UnixNano(), ttl, window)
		sh.mu.Unlock()
		r.expired.Add(uint64(n))
	}
}
