package caddymodule

import (
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

func init() {
	caddy.RegisterModule(App{})
}

// App is the warden app: the models it routes, each with its replicas. It
// polls every replica's /metrics and keeps conversations and counters across
// config reloads.
type App struct {
	// Models by name; `lb_policy warden <name>` routes for one of them.
	Models map[string]*ModelConfig `json:"models,omitempty"`

	models    []*model
	processes []process
	logger    *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "warden",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision validates the models and attaches them to their live state.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	registerMetrics(ctx.GetMetricsRegistry(), a.logger)
	for name, cfg := range a.Models {
		if cfg == nil {
			return fmt.Errorf("model %q: empty configuration", name)
		}
		if err := cfg.validate(name); err != nil {
			return err
		}
	}
	for name, cfg := range a.Models {
		m, err := loadModel(name, cfg, a.logger)
		if err != nil {
			return err
		}
		a.models = append(a.models, m)
		ps, err := loadProcesses(name, cfg, a.logger)
		if err != nil {
			return err
		}
		a.processes = append(a.processes, ps...)
		m.setProcesses(ps)
	}
	return nil
}

// model returns the live state of a model of this config.
func (a *App) model(name string) (*model, bool) {
	for _, m := range a.models {
		if m.name == name {
			return m, true
		}
	}
	return nil, false
}

// Start launches the processes not running yet and starts polling the
// replicas of every model.
func (a *App) Start() error {
	startProcesses(a.processes)
	for _, m := range a.models {
		m.start()
	}
	return nil
}

// Stop does nothing: pollers and processes belong to the models, which stop
// them when the last config that uses them is cleaned up.
func (a *App) Stop() error { return nil }

// Cleanup drops this config's references to its models and processes.
func (a *App) Cleanup() error {
	releaseProcesses(a.processes)
	for _, m := range a.models {
		if _, err := models.Delete(m.name); err != nil {
			return err
		}
	}
	return nil
}

var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)
