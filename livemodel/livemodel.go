// Package livemodel runs one model on wall time for as long as a config
// uses it: the fleet runtime fed by its metrics poller, the session
// sweeper, the replicas' KV cache event feeds, the shared pin store's sync
// and the pin snapshot. Each config load prepares its own Load of the
// model, private until it is activated; the newest activated Load not yet
// deactivated is the one applied, so a config whose start fails gives the
// model back to the running one. Nothing here knows Caddy: the caller
// keeps each Model alive across config loads.
package livemodel

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/fleet"
	"github.com/lmwarden/caddy-warden/health"
	"github.com/lmwarden/caddy-warden/kvevents"
	"github.com/lmwarden/caddy-warden/metricsfeed"
	"github.com/lmwarden/caddy-warden/pinsnapshot"
	"github.com/lmwarden/caddy-warden/pinstore"
	"github.com/lmwarden/caddy-warden/supervise"
)

// Model is the state of one model that survives config loads: the fleet
// runtime, the poller that feeds it and the pins' snapshot. Settings are
// not state: each config load has its own Load.
type Model struct {
	name      string
	fleet     *fleet.Model
	poller    *metricsfeed.Poller
	transport *http.Transport

	logger atomic.Pointer[zap.Logger] // the applied load's; read by health callbacks
	pins   *pinsnapshot.Snapshot

	mu     sync.Mutex
	live   []*Load             // activated and not deactivated, oldest first
	feeds  map[feedKey]*kvFeed // the replicas' KV cache events the live loads follow
	cancel context.CancelFunc  // stops the poller and sweeper; nil when not running
	done   chan struct{}
	sync   *storeSync // the applied load's pin store exchanging with the others

	refresh refresher
}

// Spec is what one config says of the model.
type Spec struct {
	Fleet fleet.Spec
	// MaxNumSeqsSource says where Fleet's max_num_seqs came from, and
	// FlowHeader the header that names a turn's flow for load control
	// ("" reads the credential), for the admin API.
	MaxNumSeqsSource string
	FlowHeader       string
	// KVEvents is where each replica that publishes its KV cache events
	// does, by replica ID.
	KVEvents map[string]kvevents.Options
	// PinSnapshotInterval is how often the pins are written to Storage; 0
	// turns snapshots off.
	PinSnapshotInterval time.Duration
	// Storage is the config's storage, where pin snapshots go; nil has none.
	Storage pinsnapshot.Storage
	// Store shares the pins with other instances; nil keeps them local.
	Store *pinstore.Store
	// Processes are the servers the config launches, by address.
	Processes map[string]*supervise.Supervisor
	Logger    *zap.Logger
}

// Load is one config load's version of a model: its settings and its
// routing plan. It is private to its config until activated.
type Load struct {
	model *Model
	spec  Spec
	plan  *fleet.Plan
	// feeds follow the replicas' KV cache events, by replica ID, from
	// Activate to Deactivate (model.mu).
	feeds map[string]*kvFeed
}

// New is a model that polls its replicas' /metrics every metricsInterval
// once it runs, and logs through logger until a load is applied.
func New(name string, metricsInterval time.Duration, logger *zap.Logger) *Model {
	m := &Model{name: name, pins: pinsnapshot.New(name), feeds: map[feedKey]*kvFeed{}}
	m.fleet = fleet.New(name, metricsInterval, time.Now(), m.logHealthChange)
	// Its own transport, so that Close can close its idle connections.
	m.transport = http.DefaultTransport.(*http.Transport).Clone()
	m.transport.Proxy = nil // replicas are dialled directly
	// Refreshes of the conversations kept on one replica run side by side.
	m.transport.MaxIdleConnsPerHost = 16
	m.poller = metricsfeed.NewPoller(metricsfeed.PollerConfig{
		Interval: metricsInterval,
		Client:   &http.Client{Transport: m.transport},
		OnScrape: m.fleet.ObserveScrape,
		OnHealth: m.fleet.ObserveHealth,
	}, nil)
	m.logger.Store(logger)
	return m
}

// Name is the model's name.
func (m *Model) Name() string { return m.name }

// Fleet is the model's fleet runtime.
func (m *Model) Fleet() *fleet.Model { return m.fleet }

// ReadPins reads the pin snapshot that the first load to be activated
// restores.
func (m *Model) ReadPins(storage pinsnapshot.Storage, logger *zap.Logger) {
	m.pins.Load(storage, logger)
}

// Prepare is a config's version of the model. Nothing the running config
// uses changes. The first config's restores the pins read at creation,
// before its server can take a request: Caddy may start its HTTP servers
// before the warden app, and a conversation placed meanwhile would lose
// its pin.
func (m *Model) Prepare(spec Spec) *Load {
	l := &Load{model: m, spec: spec, plan: m.fleet.Prepare(spec.Fleet)}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.live) == 0 {
		m.pins.Restore(l.plan.View(), time.Now(), spec.Logger)
	}
	return l
}

// Activate makes l the model's applied version, as its config starts.
func (m *Model) Activate(l *Load, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.live = append(m.live, l)
	m.acquireFeedsLocked(l)
	m.applyLocked(l)
}

// Deactivate drops l, as its config stops. When l was applied, the newest
// load still live is applied again: that is how a config whose start
// failed gives the routing back to the running config. last reports that
// no live config uses the model any more (Caddy is exiting, or the new
// config dropped the model): the pins are then written through l's
// storage, while it is still open.
func (m *Model) Deactivate(l *Load, now time.Time) (last bool) {
	if last = m.deactivate(l); last {
		m.writePins(l, now)
	}
	return last
}

func (m *Model) deactivate(l *Load) (last bool) {
	var unused []*kvevents.Subscriber
	defer func() { // after the unlock: a feed's Close waits for its goroutine
		for _, sub := range unused {
			sub.Close()
		}
	}()
	m.mu.Lock()
	defer m.mu.Unlock()
	i := slices.Index(m.live, l)
	if i < 0 {
		return false
	}
	m.live = slices.Delete(m.live, i, i+1)
	unused = m.releaseFeedsLocked(l)
	if i == len(m.live) && len(m.live) > 0 {
		m.applyLocked(m.live[len(m.live)-1])
	}
	if len(m.live) == 0 {
		m.syncStoreLocked(nil)
	}
	var servers []string
	for _, other := range m.live {
		servers = append(servers, other.plan.Addresses()...)
	}
	m.fleet.Retain(servers)
	return len(m.live) == 0
}

func (m *Model) applyLocked(l *Load) {
	m.logger.Store(l.spec.Logger)
	m.fleet.Apply(l.plan)
	l.followFeeds()
	m.poller.SetInterval(l.plan.MetricsInterval(), 0)
	m.poller.SetTargets(l.plan.Addresses())
	for addr, sup := range l.spec.Processes {
		logProcess(sup, l.spec.Logger, m.name, addr)
	}
	m.syncStoreLocked(l)
}

// Applied is the load in force, nil while no config using the model runs.
func (m *Model) Applied() *Load {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.live) == 0 {
		return nil
	}
	return m.live[len(m.live)-1]
}

func (m *Model) logHealthChange(addr string, old, new health.State) {
	logger := m.logger.Load()
	fields := []zap.Field{zap.String("model", m.name), zap.String("server", addr), zap.String("was", old.String())}
	switch {
	case new.Healthy:
		logger.Info("replica healthy", fields...)
	case !old.Healthy && old.Reason.Pending() && new.Reason.Pending():
		logger.Debug("replica starting", append(fields, zap.String("reason", new.String()))...)
	case !old.Healthy && !old.Reason.Pending():
		// Only the reason changed (a slow scrape now too large, say): one
		// warning per outage is enough.
		logger.Info("replica still unhealthy", append(fields, zap.String("reason", new.String()))...)
	default:
		logger.Warn("replica unhealthy", append(fields, zap.String("reason", new.String()))...)
	}
}

// logProcess routes a launched server's output and state changes to
// logger's "process" child: output at debug with a constant message, as
// vLLM writes a line per request; state changes at info.
func logProcess(sup *supervise.Supervisor, logger *zap.Logger, model, addr string) {
	log := logger.Named("process").With(zap.String("model", model), zap.String("server", addr))
	sup.SetCallbacks(
		func(stream supervise.Stream, line string) {
			log.Debug("output", zap.String("stream", string(stream)), zap.String("line", line))
		},
		func(st supervise.State) {
			log.Info("state", zap.String("state", string(st.State)), zap.Int("pid", st.PID), zap.Int("restarts", st.Restarts), zap.String("error", st.Error))
		})
}

// Run starts the metrics poller, the session sweeper and the periodic pin
// snapshot, until Close. Running a running model does nothing.
func (m *Model) Run() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel, m.done = cancel, make(chan struct{})
	go m.run(ctx, m.done)
}

func (m *Model) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	var wg sync.WaitGroup
	wg.Go(func() { _ = m.poller.Run(ctx) })
	tick := time.NewTicker(fleet.SweepInterval)
	defer tick.Stop()
	refresh := time.NewTimer(m.refreshInterval())
	defer refresh.Stop()
	lastPins := time.Now()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			m.refresh.inFlight.Wait()
			return
		case now := <-refresh.C:
			m.refreshKept(ctx, now)
			refresh.Reset(m.refreshInterval())
		case now := <-tick.C:
			m.fleet.Tick(now)
			if l := m.Applied(); l != nil && now.Sub(lastPins) >= l.spec.PinSnapshotInterval {
				lastPins = now
				m.writePins(l, now)
			}
		}
	}
}

// Close stops the model's goroutines, once no config uses it.
func (m *Model) Close() {
	m.mu.Lock()
	cancel, done := m.cancel, m.done
	m.cancel = nil
	m.syncStoreLocked(nil)
	feeds := m.feeds
	m.feeds = map[feedKey]*kvFeed{}
	m.mu.Unlock()
	for _, f := range feeds {
		f.sub.Close()
	}
	if cancel != nil {
		cancel()
		<-done
	}
	m.fleet.Stop()
	m.transport.CloseIdleConnections()
}

// Model is the model l is a version of.
func (l *Load) Model() *Model { return l.model }

// Plan is l's routing plan.
func (l *Load) Plan() *fleet.Plan { return l.plan }

// Spec is what l's config says of the model.
func (l *Load) Spec() Spec { return l.spec }

// ProcessState is the state of the server at addr if l's config launches it.
func (l *Load) ProcessState(addr string) *supervise.State {
	sup := l.spec.Processes[addr]
	if sup == nil {
		return nil
	}
	st := sup.State()
	return &st
}
