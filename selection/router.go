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
	// DefaultCompactionInterval: real compactions are many turns apart.
	DefaultCompactionInterval = time.Minute
)

// Config is one configuration's routing settings. Each config load has its
// own, in a View; the Router keeps only state.
type Config struct {
	// MaxNumSeqs is vLLM's --max-num-seqs of each replica.
	MaxNumSeqs int
	// SpillThreshold is the in-flight count above which a pinned replica
	// sheds a request; 0 means auto (MaxNumSeqs/4, at least 1).
	SpillThreshold int
	// Affinity pins sessions to replicas; off places every request by load.
	Affinity bool
	// SessionTTL forgets a session idle that long.
	SessionTTL time.Duration
	// ActiveWindow is how recently a session must have sent a request to
	// count as load on its replica when placing new sessions.
	ActiveWindow time.Duration
	// MaxSessions bounds the session table; the least recently used go first.
	MaxSessions int
	// Shared is the pin table shared with other routers; nil keeps pins to
	// this router alone.
	Shared SharedPins
	// Admission is load control, off by default.
	Admission AdmissionConfig
	// CompactionInterval is the least time between two placements of a
	// conversation for compaction (or since it was placed); a compaction
	// hint sooner is ignored (counted in Status.CompactionsIgnored).
	CompactionInterval time.Duration
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
	if c.CompactionInterval <= 0 {
		c.CompactionInterval = DefaultCompactionInterval
	}
	c.Admission = c.Admission.withDefaults()
	return c
}

// MinAutoSpillThreshold is the least threshold the KV cache can lower auto
// to. Lower, pins break under ordinary bursts: at 2 the lab's seed workload
// (16 sessions) loses a sixth of its throughput and 32 points of prefix hits
// (docs/policy.md).
const MinAutoSpillThreshold = 3

// AutoSpillThreshold is the threshold auto gives: a quarter of max_num_seqs,
// lowered to the number of typical prompts a replica's KV cache holds at
// once (kvTokens / typicalPrompt; either 0 when unknown), though not below
// MinAutoSpillThreshold. Past that many requests in flight the next one
// waits in the engine for KV room, or evicts its neighbours' prefixes,
// while a lighter replica could start it at once.
func AutoSpillThreshold(maxNumSeqs, kvTokens int, typicalPrompt float64) int {
	n := max(1, maxNumSeqs/4)
	if kvTokens <= 0 || typicalPrompt < 1 {
		return n
	}
	fit := int(math.Round(float64(kvTokens) / typicalPrompt))
	return min(n, max(MinAutoSpillThreshold, fit))
}

// Router is the routing state of one model: each replica's in-flight count,
// load and health, the session table and the counters. It is safe for
// concurrent use and meant to outlive config loads; the settings a request
// is routed with come from the View of its own config.
type Router struct {
	model string
	since time.Time

	statesMu sync.Mutex
	states   map[string]*replicaState // by replica ID, every replica an applied view listed

	sessions *sessionTable
	gate     *gate
	// placeMu serialises decisions that compare replicas, so that the load a
	// decision adds is visible to the next one (a burst of new sessions
	// spreads instead of piling on one replica).
	placeMu sync.Mutex

	// typicalPrompt is the requests' estimated prompt size in tokens, and
	// bytesPerToken the request bodies' bytes per prompt token as the
	// replies reported them (tokens.go); both outlive config loads like the
	// sessions.
	typicalPrompt, bytesPerToken smoothed

	requests  atomic.Uint64
	unkeyed   atomic.Uint64
	noReplica atomic.Uint64
	evicted   atomic.Uint64
	expired   atomic.Uint64
	// compactionsIgnored counts compaction hints that came within
	// CompactionInterval of the conversation's last placement.
	compactionsIgnored atomic.Uint64
}

// NewRouter returns the empty state of model's routing.
func NewRouter(model string, now time.Time) *Router {
	return &Router{
		model:    model,
		since:    now,
		states:   map[string]*replicaState{},
		sessions: newSessionTable(DefaultMaxSessions),
		gate:     newGate(),
	}
}

// View binds a configuration's settings and replicas to the router's state.
// Making one changes nothing shared: a replica the router has never had
// gets a state of its own in the view until Apply adopts it, so a config
// that is provisioned and then rejected leaves no trace. A view routes as
// soon as it exists (Caddy may start serving a new config's requests before
// its apps start), and keeps routing by its own settings while it lives.
func (r *Router) View(cfg Config, replicas []Replica) *View {
	v := &View{router: r, cfg: cfg.withDefaults(), byID: make(map[string]*replicaState, len(replicas))}
	r.statesMu.Lock()
	defer r.statesMu.Unlock()
	for _, rep := range replicas {
		if _, dup := v.byID[rep.ID]; dup {
			continue
		}
		s := r.states[rep.ID]
		if s == nil || s.Replica != rep {
			s = newReplicaState(rep)
		}
		v.replicas = append(v.replicas, s)
		v.byID[rep.ID] = s
	}
	return v
}

// Apply makes v the view whose replicas take metrics and health (SetLoad,
// SetHealthy) and whose settings bound the session table. A replica that
// leaves keeps its state (streams in flight, pins, counters) in case it is
// listed again.
func (r *Router) Apply(v *View) {
	r.statesMu.Lock()
	for _, s := range v.replicas {
		r.states[s.ID] = s
	}
	r.statesMu.Unlock()
	r.sessions.setCapacity(v.cfg.MaxSessions)
}

func (r *Router) state(id string) *replicaState {
	r.statesMu.Lock()
	defer r.statesMu.Unlock()
	return r.states[id]
}

// SetLoad records the replica's metrics; unknown IDs are ignored.
func (r *Router) SetLoad(id string, l Load) {
	if s := r.state(id); s != nil {
		s.setLoad(l)
	}
}

// SetHealthy records whether the replica can take work.
func (r *Router) SetHealthy(id string, ok bool) {
	if s := r.state(id); s != nil {
		s.healthy.Store(ok)
	}
}

// View is one configuration of a model's routing: its settings and its
// replicas, over the router's shared state. It is immutable.
type View struct {
	router   *Router
	cfg      Config
	replicas []*replicaState
	byID     map[string]*replicaState
}

// Affinity reports whether sessions are pinned.
func (v *View) Affinity() bool { return v.cfg.Affinity }

// SpillThreshold returns the threshold in force and whether it is automatic.
// Auto reads the smallest KV cache among the replicas that publish theirs
// and the typical prompt the router has seen (AutoSpillThreshold).
func (v *View) SpillThreshold() (n int, auto bool) {
	if v.cfg.SpillThreshold > 0 {
		return v.cfg.SpillThreshold, false
	}
	kv := 0
	for _, s := range v.replicas {
		if l := s.load.Load(); l.Known && l.KVTokens > 0 && (kv == 0 || l.KVTokens < kv) {
			kv = l.KVTokens
		}
	}
	return AutoSpillThreshold(v.cfg.MaxNumSeqs, kv, v.router.TypicalPrompt()), true
}

// promptSmoothing is the weight of one request in the typical prompt: it
// follows the workload over the last hundred or so requests.
const promptSmoothing = 0.02

// observePrompt folds a request's prompt size into the typical one.
func (r *Router) observePrompt(tokens int) { r.typicalPrompt.observe(float64(tokens), promptSmoothing) }

// typicalOr1 is TypicalPrompt, or 1 before any request told its size: a
// request then counts as one.
func (r *Router) typicalOr1() float64 {
	return max(r.TypicalPrompt(), 1)
}

// TypicalPrompt is the requests' prompt size in tokens, smoothed; 0 before
// any request told its size.
func (r *Router) TypicalPrompt() float64 { return r.typicalPrompt.value() }

// Replicas lists the view's replicas.
func (v *View) Replicas() []Replica {
	out := make([]Replica, len(v.replicas))
	for i, s := range v.replicas {
		out[i] = s.Replica
	}
	return out
}

// has reports whether s is one of the view's replicas.
func (v *View) has(s *replicaState) bool {
	for _, m := range v.replicas {
		if m == s {
			return true
		}
	}
	return false
}

// Sweep forgets sessions idle past the view's TTL and ends the active state
// of those idle past its active window. Call it periodically (every second)
// on the applied view.
func (v *View) Sweep(now time.Time) {
	r := v.router
	ttl, window := int64(v.cfg.SessionTTL), int64(v.cfg.ActiveWindow)
	for i := range r.sessions.shards {
		sh := &r.sessions.shards[i]
		sh.mu.Lock()
		n := sh.sweep(now.UnixNano(), ttl, window)
		sh.mu.Unlock()
		r.expired.Add(uint64(n))
	}
	if !v.cfg.Admission.Enabled {
		r.ReleaseWaiting() // a reload turned load control off
		return
	}
	r.gate.mu.Lock()
	notify := v.expire(now.UnixNano())
	r.gate.mu.Unlock()
	runAll(notify)
}
