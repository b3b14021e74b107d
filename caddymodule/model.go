package caddymodule

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/health"
	"github.com/lmwarden/caddy-warden/metricsfeed"
	"github.com/lmwarden/caddy-warden/selection"
	"github.com/lmwarden/caddy-warden/supervise"
)

// models holds each model's live state by name. It outlives config loads:
// every load takes a reference in Provision and drops it in Cleanup, and as
// Caddy provisions a new config before cleaning up the old one, a reload
// that keeps a model keeps its pins, counters, metrics and pollers.
var models = caddy.NewUsagePool()

// historyRetention is how far back the tokens-per-second history goes.
const historyRetention = time.Hour

// model is the state of one model that survives config reloads.
type model struct {
	name      string
	router    *selection.Router
	history   *metricsfeed.History
	poller    *metricsfeed.Poller
	transport *http.Transport

	logger atomic.Pointer[zap.Logger] // read by health callbacks, which run under a tracker's lock

	mu       sync.Mutex
	cfg      *ModelConfig
	trackers map[string]*health.Tracker       // by server address
	procs    map[string]*supervise.Supervisor // launched servers by address
	cancel   context.CancelFunc               // stops the poller and sweeper; nil when not running
	done     chan struct{}
}

func loadModel(name string, cfg *ModelConfig, logger *zap.Logger) (*model, error) {
	v, _, err := models.LoadOrNew(name, func() (caddy.Destructor, error) {
		m := &model{
			name:     name,
			router:   selection.NewRouter(name, cfg.routerConfig(), cfg.replicas(), time.Now()),
			history:  metricsfeed.NewHistory(historyRetention, cfg.metricsInterval()),
			trackers: map[string]*health.Tracker{},
		}
		// Its own transport, so that Destruct can close its idle connections.
		m.transport = http.DefaultTransport.(*http.Transport).Clone()
		m.transport.Proxy = nil // replicas are dialled directly
		m.poller = metricsfeed.NewPoller(metricsfeed.PollerConfig{
			Interval: cfg.metricsInterval(),
			Client:   &http.Client{Transport: m.transport},
			OnScrape: m.onScrape,
			OnHealth: m.onHealth,
		}, nil)
		return m, nil
	})
	if err != nil {
		return nil, err
	}
	m := v.(*model)
	m.configure(cfg, logger)
	return m, nil
}

// configure applies a (re)loaded model config.
func (m *model) configure(cfg *ModelConfig, logger *zap.Logger) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cfg = cfg
	m.logger.Store(logger)
	m.router.Configure(cfg.routerConfig())
	m.router.SetReplicas(cfg.replicas())
	trackers := make(map[string]*health.Tracker, len(cfg.addresses()))
	for _, addr := range cfg.addresses() {
		if t := m.trackers[addr]; t != nil {
			trackers[addr] = t
			continue
		}
		trackers[addr] = health.NewTracker(health.Config{
			Interval: cfg.metricsInterval(),
			OnChange: m.logHealthChange(addr),
		})
	}
	for addr := range m.trackers {
		if trackers[addr] == nil {
			m.history.Forget(addr)
		}
	}
	m.trackers = trackers
	m.poller.SetTargets(cfg.addresses())
}

// setProcesses records the model's launched servers.
func (m *model) setProcesses(ps []process) {
	procs := make(map[string]*supervise.Supervisor, len(ps))
	for _, p := range ps {
		procs[p.addr] = p.sup
	}
	m.mu.Lock()
	m.procs = procs
	m.mu.Unlock()
}

// processState is the state of the server at addr if warden launched it.
func (m *model) processState(addr string) *supervise.State {
	m.mu.Lock()
	sup := m.procs[addr]
	m.mu.Unlock()
	if sup == nil {
		return nil
	}
	st := sup.State()
	return &st
}

// config returns the model's current configuration.
func (m *model) config() *ModelConfig {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cfg
}

func (m *model) logHealthChange(addr string) func(old, new health.State) {
	return func(old, new health.State) {
		logger := m.logger.Load()
		fields := []zap.Field{zap.String("model", m.name), zap.String("server", addr), zap.String("was", old.String())}
		switch {
		case new.Healthy:
			logger.Info("replica healthy", fields...)
		case !old.Healthy && startingUp(old.Reason) && startingUp(new.Reason):
			logger.Debug("replica starting", append(fields, zap.String("reason", new.String()))...)
		default:
			logger.Warn("replica unhealthy", append(fields, zap.String("reason", new.String()))...)
		}
	}
}

// startingUp reports a reason a replica has before its first full check.
func startingUp(r health.Reason) bool {
	return r == health.ReasonNoMetrics || r == health.ReasonNoHealthCheck
}

// start runs the metrics poller and the session sweeper until stop or
// Destruct. Starting a running model does nothing.
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
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case now := <-tick.C:
			m.router.Sweep(now)
			m.refreshHealth(now)
		}
	}
}

// Destruct stops the model's goroutines when no config references it.
func (m *model) Destruct() error {
	m.mu.Lock()
	cancel, done := m.cancel, m.done
	m.cancel = nil
	m.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	m.transport.CloseIdleConnections()
	return nil
}

func (m *model) tracker(addr string) *health.Tracker {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.trackers[addr]
}

// refreshHealth re-evaluates every replica, so that metrics that stop
// arriving turn a replica unhealthy even without a failed scrape.
func (m *model) refreshHealth(now time.Time) {
	for _, rep := range m.router.Replicas() {
		if t := m.tracker(rep.Address); t != nil {
			m.router.SetHealthy(rep.ID, t.Healthy(now))
		}
	}
}

func (m *model) onHealth(addr string, at time.Time, err error) {
	if t := m.tracker(addr); t != nil {
		t.ObserveHealth(at, err)
		m.refreshHealth(at)
	}
}

func (m *model) onScrape(addr string, at time.Time, s metricsfeed.Scrape, err error) {
	t := m.tracker(addr)
	if t == nil {
		return
	}
	t.ObserveScrape(at, err)
	if err == nil {
		m.history.Add(addr, at, s)
	}
	for _, rep := range m.router.Replicas() {
		if rep.Address != addr {
			continue
		}
		load := selection.Load{} // unknown: scored as full
		if err == nil {
			load = replicaLoad(rep, s)
		}
		m.router.SetLoad(rep.ID, load)
	}
	m.refreshHealth(at)
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
		l.KVCapacityTokens += float64(e.BlockSize * e.NumGPUBlocks)
		engines++
	}
	if engines == 0 {
		return selection.Load{}
	}
	l.KVUsage /= float64(engines)
	l.Known = true
	return l
}

// source selects a replica's counters in the history.
func source(rep selection.Replica) metricsfeed.Source {
	if rep.SetsRank {
		return metricsfeed.Source{Target: rep.Address, Engine: rep.Rank}
	}
	return metricsfeed.WholeTarget(rep.Address)
}

// lookupModel finds a model's live state by name.
func lookupModel(name string) (*model, bool) {
	var found *model
	models.Range(func(key, value any) bool {
		if key.(string) == name {
			found = value.(*model)
			return false
		}
		return true
	})
	return found, found != nil
}

// modelNames lists the live models, sorted.
func modelNames() []string {
	var names []string
	models.Range(func(key, _ any) bool {
		names = append(names, key.(string))
		return true
	})
	slices.Sort(names)
	return names
}

// sources select the counters of every replica of the model.
func (m *model) sources() []metricsfeed.Source {
	reps := m.router.Replicas()
	out := make([]metricsfeed.Source, len(reps))
	for i, rep := range reps {
		out[i] = source(rep)
	}
	return out
}

// fleetRates are the model's token rates over window, all replicas together.
func (m *model) fleetRates(now time.Time, window time.Duration) metricsfeed.Rates {
	rates, _ := m.history.Rates(now, window, m.sources()...)
	return rates
}
