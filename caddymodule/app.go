package caddymodule

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/lmwarden/caddy-warden/metrics"
)

func init() {
	caddy.RegisterModule(App{})
}

// App is the warden app: the models it routes, each with its replicas. It
// polls every replica's /metrics and keeps sessions and counters across
// config reloads.
//
// A config load is a transaction: Provision prepares this config's version
// of each model without touching what the running config uses; Start
// applies it; a load that fails anywhere leaves routing, pins, counters,
// history, pollers and processes as they were.
type App struct {
	// Models by name; `lb_policy warden <name>` routes for one of them.
	Models map[string]*ModelConfig `json:"models,omitempty"`
	// PinStore shares every model's pins between Caddy instances, unless
	// the model sets its own.
	PinStore *PinStoreConfig `json:"pin_store,omitempty"`

	loads []*modelLoad // sorted by model name
	// repliesRead is set when a warden_stop_reason of this config was
	// provisioned (checkRepliesRead).
	repliesRead bool
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "warden",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision completes each model from its process command lines and
// prepares this config's version of it.
func (a *App) Provision(ctx caddy.Context) error {
	logger := ctx.Logger()
	metrics.Register(ctx.GetMetricsRegistry(), appliedModels, logger)
	names := make([]string, 0, len(a.Models))
	for name := range a.Models {
		names = append(names, name)
	}
	slices.Sort(names)
	if err := checkModelNames(a.Models); err != nil {
		return err
	}
	for _, name := range names {
		cfg := a.Models[name]
		if cfg == nil {
			return fmt.Errorf("model %q: empty configuration", name)
		}
		if err := cfg.provision(name); err != nil {
			return err
		}
		// Checked before anything is built from it (Validate would run after
		// Provision): ranks -1 panicked, 1e8 would take gigabytes.
		if err := errors.Join(cfg.validate(name), validatePinStore(name, cfg.pinStore(a.PinStore))); err != nil {
			return err
		}
		store, err := openPinStore(name, cfg, cfg.pinStore(a.PinStore), logger)
		if err != nil {
			return err
		}
		procs, err := loadProcesses(name, cfg)
		if err != nil {
			closePinStore(store)
			return err
		}
		l, err := loadModel(name, cfg, store, procs, ctx.Storage(), logger)
		if err != nil {
			releaseProcesses(procs)
			closePinStore(store)
			return err
		}
		a.loads = append(a.loads, l) // referenced: Cleanup releases it
	}
	return nil
}

// load is this config's version of the named model.
func (a *App) load(name string) (*modelLoad, bool) {
	for _, l := range a.loads {
		if l.name() == name {
			return l, true
		}
	}
	return nil, false
}

// Start applies this config to every model, launches the processes not
// running yet and starts polling.
func (a *App) Start() error {
	for _, l := range a.loads {
		l.activate()
		startProcesses(l.procs)
		l.live.Model().Run()
	}
	return nil
}

// Stop gives each model back to the newest config still running, if this
// one was applied. Pollers and processes belong to the models, which stop
// them when the last config that uses them is cleaned up. A model no
// running config uses any more writes its pin snapshot here, while this
// config's storage is still open (Cleanup may close it).
func (a *App) Stop() error {
	for _, l := range a.loads {
		l.live.Model().Deactivate(l.live, time.Now())
	}
	return nil
}

// Cleanup drops this config's references to its models and processes.
func (a *App) Cleanup() error {
	var errs []error
	for _, l := range a.loads {
		releaseProcesses(l.procs)
		closePinStore(l.live.Spec().Store)
		if _, err := models.Delete(l.name()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)
