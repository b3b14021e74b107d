package caddymodule

import (
	"cmp"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/livemodel"
	"github.com/lmwarden/caddy-warden/metrics"
	"github.com/lmwarden/caddy-warden/pinstore"
	"github.com/lmwarden/caddy-warden/selection"
	"github.com/lmwarden/caddy-warden/supervise"
)

// models holds each model's live state by name. It outlives config loads:
// every load takes a reference in Provision and drops it in Cleanup, and as
// Caddy provisions a new config before cleaning up the old one, a reload
// that keeps a model keeps its pins, counters, metrics and pollers.
var models = caddy.NewUsagePool()

// pooledModel is a model in the pool, stopped when no config references it.
type pooledModel struct{ *livemodel.Model }

// Destruct stops the model's goroutines; the process-wide histograms
// forget it, as the gauges read from the running config do.
func (m pooledModel) Destruct() error {
	m.Close()
	metrics.Forget(m.Name())
	return nil
}

// modelLoad is one config load's version of a model: its settings, its
// live version and its processes. It is private to its load until Start.
type modelLoad struct {
	cfg   *ModelConfig
	live  *livemodel.Load
	procs []process
}

// loadModel takes a reference on the model's live state, creating it for a
// new model (reading its pin snapshot), and prepares this load's version of
// it. Nothing the running config uses changes.
func loadModel(name string, cfg *ModelConfig, store *pinstore.Store, procs []process, storage certmagic.Storage, logger *zap.Logger) (*modelLoad, error) {
	v, _, err := models.LoadOrNew(name, func() (caddy.Destructor, error) {
		m := livemodel.New(name, cfg.metricsInterval(), logger)
		if storage != nil && cfg.pinSnapshotInterval() > 0 {
			m.ReadPins(storage, logger)
		}
		return pooledModel{m}, nil
	})
	if err != nil {
		return nil, err
	}
	spec := livemodel.Spec{
		MaxNumSeqsSource:    cfg.maxNumSeqsSource,
		FlowHeader:          cfg.LoadControl.flowHeader(),
		KVEvents:            cfg.kvEvents(),
		PinSnapshotInterval: cfg.pinSnapshotInterval(),
		Store:               store,
		Processes:           map[string]*supervise.Supervisor{},
		Logger:              logger,
	}
	var shared selection.SharedPins // a nil *pinstore.Store must stay a nil interface
	if store != nil {
		shared = store
	}
	spec.Fleet = cfg.fleetSpec(shared)
	if storage != nil { // a nil certmagic.Storage must stay a nil interface
		spec.Storage = storage
	}
	for _, p := range procs {
		spec.Processes[p.addr] = p.sup
	}
	return &modelLoad{cfg: cfg, live: v.(pooledModel).Prepare(spec), procs: procs}, nil
}

// name is the model's name.
func (l *modelLoad) name() string { return l.live.Model().Name() }

// appliedModels are the loads running configs apply, sorted by model name.
func appliedModels() []*livemodel.Load {
	var out []*livemodel.Load
	models.Range(func(_, value any) bool {
		if l := value.(pooledModel).Applied(); l != nil {
			out = append(out, l)
		}
		return true
	})
	slices.SortFunc(out, func(a, b *livemodel.Load) int { return cmp.Compare(a.Model().Name(), b.Model().Name()) })
	return out
}

// appliedModel is the applied load of the named model.
func appliedModel(name string) (*livemodel.Load, bool) {
	var found *livemodel.Load
	models.Range(func(key, value any) bool {
		if key.(string) != name {
			return true
		}
		found = value.(pooledModel).Applied()
		return false
	})
	return found, found != nil
}

// activate applies l, as its config starts.
func (l *modelLoad) activate() {
	l.live.Model().Activate(l.live, time.Now())
	if l.live.Plan().View().Admission().Enabled {
		metrics.ShowWait(l.name())
	}
}

var _ caddy.Destructor = pooledModel{}
