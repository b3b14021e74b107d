// Package fleet is the Caddy-free runtime of one model's fleet: it turns
// each replica's scrapes and health probes into health states and load for
// the router, sweeps the session table and keeps the token history. It
// never reads the clock: Caddy drives it with wall time, the lab with
// virtual time, through the same code.
package fleet

import (
	"sync"
	"time"

	"github.com/lmwarden/caddy-warden/health"
	"github.com/lmwarden/caddy-warden/metricsfeed"
	"github.com/lmwarden/caddy-warden/selection"
)

// HistoryRetention is how far back the token history goes.
const HistoryRetention = time.Hour

// SweepInterval is how often Tick should be called.
const SweepInterval = time.Second

// Spec is one configuration of a model's fleet.
type Spec struct {
	Routing  selection.Config
	Replicas []selection.Replica
	// MetricsInterval is how often each server is scraped (default 1s).
	MetricsInterval time.Duration
}

// Plan is a Spec prepared over a model's state: its routing view is ready to
// route, and nothing shared has changed until the plan is applied.
type Plan struct {
	view      *selection.View
	addresses []string
	interval  time.Duration
}

// View routes requests with the plan's settings.
func (p *Plan) View() *selection.View { return p.view }

// Addresses are the servers to scrape, each once.
func (p *Plan) Addresses() []string { return p.addresses }

// MetricsInterval is how often each server is scraped.
func (p *Plan) MetricsInterval() time.Duration { return p.interval }

// Model is the live state of one model: router state, health trackers and
// history, shared by every configuration that names the model.
type Model struct {
	router   *selection.Router
	history  *metricsfeed.History
	onChange func(addr string, old, new health.State)

	mu       sync.Mutex
	applied  *Plan
	trackers map[string]*health.Tracker // by server address
}

// New returns an empty model. onHealthChange, if set, hears every change of
// a server's health; it runs under the server's tracker lock and must be quick.
func New(name string, historyInterval time.Duration, now time.Time, onHealthChange func(addr string, old, new health.State)) *Model {
	return &Model{
		router:   selection.NewRouter(name, now),
		history:  metricsfeed.NewHistory(HistoryRetention, withDefault(historyInterval)),
		onChange: onHealthChange,
		trackers: map[string]*health.Tracker{},
	}
}

func withDefault(interval time.Duration) time.Duration {
	if interval > 0 {
		return interval
	}
	return time.Second
}

// Prepare builds a plan for spec without changing any shared state.
func (m *Model) Prepare(spec Spec) *Plan {
	p := &Plan{view: m.router.View(spec.Routing, spec.Replicas), interval: withDefault(spec.MetricsInterval)}
	seen := map[string]bool{}
	for _, rep := range p.view.Replicas() {
		if !seen[rep.Address] {
			seen[rep.Address] = true
			p.addresses = append(p.addresses, rep.Address)
		}
	}
	return p
}

// Apply makes p the plan whose servers are tracked and whose settings the
// session table follows. Servers that p leaves out keep their trackers and
// history until Retain drops them, so that applying the previous plan again
// (a config whose start failed hands back to the running one) finds them
// as they were.
func (m *Model) Apply(p *Plan) {
	m.router.Apply(p.view)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.applied = p
	for _, addr := range p.addresses {
		if t := m.trackers[addr]; t != nil {
			t.SetInterval(p.interval) // the poller follows the plan's interval too
		} else {
			m.trackers[addr] = health.NewTracker(health.Config{Interval: p.interval, OnChange: m.reportChange(addr)})
		}
	}
}

// Retain forgets the trackers and history of every server not in addrs:
// call it with the servers of every configuration still running.
func (m *Model) Retain(addrs []string) {
	keep := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		keep[a] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for addr := range m.trackers {
		if !keep[addr] {
			delete(m.trackers, addr)
			m.history.Forget(addr)
		}
	}
}

func (m *Model) reportChange(addr string) func(old, new health.State) {
	if m.onChange == nil {
		return nil
	}
	return func(old, new health.State) { m.onChange(addr, old, new) }
}

// Stop lets the turns load control holds go at once: the model left the
// config, and no sweep will admit them any more.
func (m *Model) Stop() { m.router.ReleaseWaiting() }

// Applied is the plan in force, nil before the first Apply.
func (m *Model) Applied() *Plan {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.applied
}

func (m *Model) tracker(addr string) *health.Tracker {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.trackers[addr]
}

// ObserveScrape records a /metrics attempt on the server at addr that
// finished at at: err is nil for a valid scrape. A failed scrape makes the
// server's load unknown, which the router scores as full.
func (m *Model) ObserveScrape(addr string, at time.Time, s metricsfeed.Scrape, err error) {
	t := m.tracker(addr)
	p := m.Applied()
	if t == nil || p == nil {
		return
	}
	t.ObserveScrape(at, err)
	if err == nil {
		m.history.Add(addr, at, s)
	}
	for _, rep := range p.view.Replicas() {
		if rep.Address != addr {
			continue
		}
		load := selection.Load{} // unknown: scored as full
		if err == nil {
			load = replicaLoad(rep, s)
			load.At = at
		}
		m.router.SetLoad(rep.ID, load)
	}
	m.refreshHealth(at)
}

// ObserveHealth records a /health probe of the server at addr.
func (m *Model) ObserveHealth(addr string, at time.Time, err error) {
	if t := m.tracker(addr); t != nil {
		t.ObserveHealth(at, err)
		m.refreshHealth(at)
	}
}

// Tick sweeps idle sessions and re-evaluates health, so that metrics that
// stop arriving turn a server unhealthy even without a failed scrape. Call
// it every SweepInterval.
func (m *Model) Tick(now time.Time) {
	if p := m.Applied(); p != nil {
		p.view.Sweep(now)
		m.refreshHealth(now)
	}
}

func (m *Model) refreshHealth(now time.Time) {
	p := m.Applied()
	if p == nil {
		return
	}
	for _, rep := range p.view.Replicas() {
		t := m.tracker(rep.Address)
		if t == nil {
			continue
		}
		// Until its first check completes, a replica keeps the health it
		// routes with (healthy when new): right after a restart, the pins
		// restored to servers not scraped yet must not move while another
		// server's first scrape comes in. Its unknown load already keeps
		// new conversations away.
		if st := t.State(now); !st.Reason.Pending() {
			m.router.SetHealthy(rep.ID, st.Healthy)
		}
	}
}

// Health is the server's health state at now; ok is false for a server no
// applied plan has listed since the last Retain.
func (m *Model) Health(addr string, now time.Time) (st health.State, ok bool) {
	t := m.tracker(addr)
	if t == nil {
		return health.State{}, false
	}
	return t.State(now), true
}

// replicaLoad is a replica's load in a scrape: its own engine for a rank,
// all engines of the server for a whole server.
func replicaLoad(rep selection.Replica, s metricsfeed.Scrape) selection.Load {
	var l selection.Load
	engines := 0
	for _, e := range s.Engines {
		if rep.SetsRank && e.Engine != rep.Rank {
			continue
		}
		if !e.Has(metricsfeed.LoadFields) {
			return selection.Load{}
		}
		l.Running += float64(e.Running)
		l.Waiting += float64(e.Waiting)
		l.KVUsage += e.KVUsage
		if e.Has(metricsfeed.FieldBlockSize | metricsfeed.FieldNumGPUBlocks) {
			l.KVTokens += e.NumGPUBlocks * e.BlockSize
		}
		if e.Has(metricsfeed.FieldBlockSize) {
			l.BlockSize = e.BlockSize
		}
		if e.Has(metricsfeed.FieldPrefixQueries | metricsfeed.FieldPrefixHits | metricsfeed.FieldGenerationTokens) {
			l.Written += e.PrefixQueries - e.PrefixHits + e.GenerationTokens
		}
		if e.Has(metricsfeed.FieldPromptTokens | metricsfeed.FieldPromptTokensCached | metricsfeed.FieldTTFT) {
			l.Prefilled += e.PromptTokens - e.PromptTokensCached
			l.TTFTSeconds += e.TTFTSeconds
		}
		l.HostTierGiB += e.HostTierGiB
		if e.Has(metricsfeed.FieldExternalQueries | metricsfeed.FieldExternalHits) {
			l.ExternalQueries += e.ExternalQueries
			l.ExternalHits += e.ExternalHits
		}
		if e.Has(metricsfeed.FieldHostStoredBytes) {
			l.HostStoredBytes += e.HostStoredBytes
		}
		engines++
	}
	if engines == 0 {
		return selection.Load{}
	}
	l.KVUsage /= float64(engines)
	l.Known = true
	return l
}
