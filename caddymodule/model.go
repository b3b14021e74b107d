package caddymodule

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/fleet"
	"github.com/lmwarden/caddy-warden/health"
	"github.com/lmwarden/caddy-warden/kvevents"
	"github.com/lmwarden/caddy-warden/metricsfeed"
	"github.com/lmwarden/caddy-warden/pinstore"
	"github.com/lmwarden/caddy-warden/selection"
	"github.com/lmwarden/caddy-warden/supervise"
)

// models holds each model's live state by name. It outlives config loads:
// every load takes a reference in Provision and drops it in Cleanup, and as
// Caddy provisions a new config before cleaning up the old one, a reload
// that keeps a model keeps its pins, counters, metrics and pollers.
var models = caddy.NewUsagePool()

// model is the state of one model that survives config reloads: the fleet
// runtime, the poller that feeds it and the pins' snapshot. Settings are
// not state: each config load has its own (modelLoad), and the one applied
// is the newest started load still running.
type model struct {
	name      string
	fleet     *fleet.Model
	poller    *metricsfeed.Poller
	transport *http.Transport

	logger atomic.Pointer[zap.Logger] // the applied load's; read by health callbacks
	pins   pinSnapshot

	mu     sync.Mutex
	live   []*modelLoad          // started and not stopped, oldest first
	feeds  map[kvFeedKey]*kvFeed // the replicas' KV cache events the live loads follow
	cancel context.CancelFunc    // stops the poller and sweeper; nil when not running
	done   chan struct{}
	sync   *storeSync // the applied load's pin store exchanging with the others
}

// modelLoad is one config load's version of a model: its settings, its
// routing plan and its processes. It is private to its load until Start.
type modelLoad struct {
	model   *model
	cfg     *ModelConfig
	plan    *fleet.Plan
	procs   []process
	storage certmagic.Storage // the config's, where pin snapshots go
	logger  *zap.Logger
	// store shares the pins with other Caddy instances; nil keeps them local.
	store *pinstore.Store
	// feeds follow the replicas' KV cache events, by replica ID, from Start
	// to Stop (model.mu).
	feeds map[string]*kvFeed
}

// loadModel takes a reference on the model's live state, creating it for a
// new model (reading its pin snapshot), and prepares this load's version of
// it. Nothing the running config uses changes.
func loadModel(name string, cfg *ModelConfig, store *pinstore.Store, storage certmagic.Storage, logger *zap.Logger) (*modelLoad, error) {
	v, _, err := models.LoadOrNew(name, func() (caddy.Destructor, error) {
		m := &model{name: name, pins: pinSnapshot{key: pinSnapshotKey(name)}, feeds: map[kvFeedKey]*kvFeed{}}
		m.fleet = fleet.New(name, cfg.metricsInterval(), time.Now(), m.logHealthChange)
		// Its own transport, so that Destruct can close its idle connections.
		m.transport = http.DefaultTransport.(*http.Transport).Clone()
		m.transport.Proxy = nil // replicas are dialled directly
		m.poller = metricsfeed.NewPoller(metricsfeed.PollerConfig{
			Interval: cfg.metricsInterval(),
			Client:   &http.Client{Transport: m.transport},
			OnScrape: m.fleet.ObserveScrape,
			OnHealth: m.fleet.ObserveHealth,
		}, nil)
		m.logger.Store(logger)
		if storage != nil && cfg.pinSnapshotInterval() > 0 {
			m.pins.load(storage, logger)
		}
		return m, nil
	})
	if err != nil {
		return nil, err
	}
	m := v.(*model)
	var shared selection.SharedPins // a nil *pinstore.Store must stay a nil interface
	if store != nil {
		shared = store
	}
	return &modelLoad{
		model:   m,
		cfg:     cfg,
		plan:    m.fleet.Prepare(cfg.fleetSpec(shared)),
		storage: storage,
		logger:  logger,
		store:   store,
	}, nil
}

// activate makes l the model's applied version; called by Start. The
// first load to start restores the pins read at creation.
func (m *model) activate(l *modelLoad) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.live = append(m.live, l)
	m.acquireFeedsLocked(l)
	m.applyLocked(l)
	m.restorePins(l, time.Now())
	if l.plan.View().Admission().Enabled {
		// The wait histogram exists from the start, at zero, so that a
		// dashboard shows "no wait" rather than "no data".
		loadControlWaitSeconds.WithLabelValues(m.name)
	}
}

// deactivate drops l, called by Stop. When l was applied, the newest load
// still running is applied again: that is how a config whose start failed
// after this app started gives the routing back to the running config.
// last reports that no running config uses the model any more: Caddy is
// exiting, or the new config dropped the model.
func (m *model) deactivate(l *modelLoad) (last bool) {
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

func (m *model) applyLocked(l *modelLoad) {
	m.logger.Store(l.logger)
	m.fleet.Apply(l.plan)
	l.followFeeds()
	m.poller.SetInterval(l.plan.MetricsInterval(), 0)
	m.poller.SetTargets(l.plan.Addresses())
	for _, p := range l.procs {
		p.logTo(l.logger, m.name)
	}
	m.syncStoreLocked(l)
}

// applied is the load in force, nil while no config using the model runs.
func (m *model) applied() *modelLoad {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.live) == 0 {
		return nil
	}
	return m.live[len(m.live)-1]
}

// processState is the state of the server at addr if the applied load launched it.
func (l *modelLoad) processState(addr string) *supervise.State {
	for _, p := range l.procs {
		if p.addr == addr {
			st := p.sup.State()
			return &st
		}
	}
	return nil
}

func (m *model) logHealthChange(addr string, old, new health.State) {
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

// start runs the metrics poller, the session sweeper and the periodic pin
// snapshot until Destruct. Starting a running model does nothing.
func (m *model) start() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel, m.done = cancel, make(chan struct{})
	go m.run(ctx, m.done)
}

func (m *model) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	var wg sync.WaitGroup
	wg.Go(func() { _ = m.poller.Run(ctx) })
	tick := time.NewTicker(fleet.SweepInterval)
	defer tick.Stop()
	lastPins := time.Now()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case now := <-tick.C:
			m.fleet.Tick(now)
			if l := m.applied(); l != nil && now.Sub(lastPins) >= l.cfg.pinSnapshotInterval() {
				lastPins = now
				m.writePins(l, now)
			}
		}
	}
}

// Destruct stops the model's goroutines when no config references it.
func (m *model) Destruct() error {
	m.mu.Lock()
	cancel, done := m.cancel, m.done
	m.cancel = nil
	m.syncStoreLocked(nil)
	feeds := m.feeds
	m.feeds = map[kvFeedKey]*kvFeed{}
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
	// The process-wide histograms forget the model, as the gauges read
	// from the running config do.
	byModel := prometheus.Labels{"model": m.name}
	loadControlWaitSeconds.DeletePartialMatch(byModel)
	pinStoreSeconds.DeletePartialMatch(byModel)
	return nil
}

// appliedModels are the models a running config applies, sorted by name.
func appliedModels() []*modelLoad {
	var out []*modelLoad
	models.Range(func(_, value any) bool {
		if l := value.(*model).applied(); l != nil {
			out = append(out, l)
		}
		return true
	})
	slices.SortFunc(out, func(a, b *modelLoad) int { return cmp.Compare(a.model.name, b.model.name) })
	return out
}

// appliedModel is the applied load of the named model.
func appliedModel(name string) (*modelLoad, bool) {
	var found *modelLoad
	models.Range(func(key, value any) bool {
		if key.(string) != name {
			return true
		}
		found = value.(*model).applied()
		return false
	})
	return found, found != nil
}

var _ caddy.Destructor = (*model)(nil)
