package selection

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// Defaults of Config.
const (
	DefaultMaxNumSeqs = 32
	DefaultSessionTTL = 30 * time.Minute
	// DefaultActiveWindow bounds the active window learnt from the
	// conversations' pauses (activeWindow).
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
	// SpillThreshold, when set, is the most requests in flight a pin takes
	// beyond which its conversation moves to a replica under it; 0 is auto:
	// a conversation moves only where another replica would start its turn
	// sooner (cost.go).
	SpillThreshold int
	// Affinity pins sessions to replicas; off places every request by load.
	Affinity bool
	// SessionTTL forgets a session idle that long.
	SessionTTL time.Duration
	// ActiveWindow is how recently a session must have sent a request to
	// count as load on its replica when placing new sessions; 0 learns it
	// from the conversations' pauses between turns (activeWindow).
	ActiveWindow time.Duration
	// MaxSessions bounds the session table; the least recently used go first.
	MaxSessions int
	// Shared is the pin table shared with other routers; nil keeps pins to
	// this router alone.
	Shared SharedPins
	// Admission is load control, off by default.
	Admission loadcontrol.Config
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
	if c.MaxSessions <= 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	if c.CompactionInterval <= 0 {
		c.CompactionInterval = DefaultCompactionInterval
	}
	c.Admission = c.Admission.WithDefaults()
	return c
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
	gate     *loadcontrol.Gate
	// views numbers the views made, applied is the last one applied
	// (Current).
	views   atomic.Uint64
	applied atomic.Pointer[View]
	// prefix learns the system prompt and tools conversations share.
	prefix *prefixLearner
	// placeMu serialises decisions that compare replicas, so that the load a
	// decision adds is visible to the next one (a burst of new sessions
	// spreads instead of piling on one replica).
	placeMu sync.Mutex

	// typicalPrompt is the requests' estimated prompt size in tokens, and
	// bytesPerToken the request bodies' bytes per prompt token as the
	// replies reported them (tokens.go); both outlive config loads like the
	// sessions.
	typicalPrompt, bytesPerToken smoothed
	// prefill is the fleet's prefill rate, the fastest of its replicas'
	// (float64 bits; cost.go), kept here as every pick reads it.
	prefill atomic.Uint64
	// turnSeconds is our requests' duration, from their routing to their
	// end, and gapSeconds the time between a conversation's turns (from
	// the start of one to the next), both smoothed (cost.go).
	turnSeconds, gapSeconds smoothed
	gaps                    atomic.Int64 // gaps folded into gapSeconds

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
		gate:     loadcontrol.NewGate(),
		prefix:   newPrefixLearner(),
	}
}

// View binds a configuration's settings and replicas to the router's state.
// Making one changes nothing shared: a replica the router has never had
// gets a state of its own in the view until Apply adopts it, so a config
// that is provisioned and then rejected leaves no trace. A view routes as
// soon as it exists (Caddy may start serving a new config's requests before
// its apps start), and keeps routing by its own settings until a view made
// after it is applied (Current).
func (r *Router) View(cfg Config, replicas []Replica) *View {
	v := &View{router: r, cfg: cfg.withDefaults(), byID: make(map[string]*replicaState, len(replicas)), made: r.views.Add(1)}
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
	v.lc = r.gate.View(v.cfg.Admission, v.cfg.Affinity, loadRouting{v})
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
	r.applied.Store(v)
}

// Current is the view a request that v's config received should be routed
// by: v, unless a view made after it has been applied since. Caddy starts
// stopping the old config's servers but does not wait for it, and the old
// listener may still accept connections meanwhile, so requests can reach
// a replaced config after the change that replaced it (a runtime toggle
// of affinity, say) has returned; they follow the change.
func (v *View) Current() *View {
	if a := v.router.applied.Load(); a != nil && a.made > v.made {
		return a
	}
	return v
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
		r.learnPrefillRate()
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
	lc       *loadcontrol.View // load control under this config's settings
	made     uint64            // the router's count of views when it was made
}

// Affinity reports whether sessions are pinned.
func (v *View) Affinity() bool { return v.cfg.Affinity }

// SpillThreshold returns the manual spill threshold, or 0 and true for
// auto (moves by expected cost, cost.go).
func (v *View) SpillThreshold() (n int, auto bool) {
	return v.cfg.SpillThreshold, v.cfg.SpillThreshold <= 0
}

// promptSmoothing is the weight of one request in the typical prompt: it
// follows the workload over the last hundred or so requests.
const promptSmoothing = 0.02

// observePrompt folds a request's prompt size into the typical one.
func (r *Router) observePrompt(tokens int) { r.typicalPrompt.observe(float64(tokens), promptSmoothing) }

// observeGap folds the time since a conversation's last turn into the
// conversations' gap between turns.
func (r *Router) observeGap(nanos int64) {
	if nanos > 0 {
		r.gapSeconds.observe(float64(nanos)/1e9, promptSmoothing)
		r.gaps.Add(1)
	}
}

// minGaps is how many gaps between turns the learnt active window waits
// for: the first few say little (a client's title request a second before
// its turn is one).
const minGaps = 20

// activeWindowGaps is how many of its usual gaps between turns a
// conversation may stay silent and still count as under way: it has
// likely ended past that.
const activeWindowGaps = 3

// activeWindow is the configured active window, or one learnt from the
// conversations' gaps between turns, at most DefaultActiveWindow.
func (v *View) activeWindow() time.Duration {
	if v.cfg.ActiveWindow > 0 {
		return v.cfg.ActiveWindow
	}
	gap := v.router.gapSeconds.value()
	if gap <= 0 || v.router.gaps.Load() < minGaps {
		return DefaultActiveWindow
	}
	return min(DefaultActiveWindow, time.Duration(activeWindowGaps*gap*float64(time.Second)))
}

// observeTurn folds a request's duration into the turns' duration, at the
// typical prompt's weight.
func (r *Router) observeTurn(nanos int64) {
	if nanos > 0 {
		r.turnSeconds.observe(float64(nanos)/1e9, promptSmoothing)
	}
}

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

// Sweep forgets sessions idle past the view's TTL, ends the active state
// of those idle past its active window, and sweeps load control
// (loadcontrol.View.Sweep). Call it periodically (every second) on the
// applied view.
func (v *View) Sweep(now time.Time) {
	r := v.router
	ttl, window := int64(v.cfg.SessionTTL), int64(v.activeWindow())
	for i := range r.sessions.shards {
		sh := &r.sessions.shards[i]
		sh.mu.Lock()
		n := sh.sweep(now.UnixNano(), ttl, window)
		sh.mu.Unlock()
		r.expired.Add(uint64(n))
	}
	v.lc.Sweep(now)
}
