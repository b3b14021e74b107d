package caddymodule

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/internal/testrun"
	"github.com/lmwarden/caddy-warden/livemodel"
	"github.com/lmwarden/caddy-warden/metrics"
)

// A JSON config (no Caddyfile parsing checked it) is refused before its
// model is built: ranks -1 panicked in Provision, which left the model
// referenced, and polling, after Caddy had moved on.
func TestInvalidModelIsRefusedBeforeItIsBuilt(t *testing.T) {
	testrun.CaddyHome(t)
	for _, ranks := range []int{-1, 0, 100_000_000} {
		cfg := fmt.Sprintf(`{"admin":{"disabled":true,"config":{"persist":false}},"apps":{"warden":{"models":{"m":{"server":{"address":"127.0.0.1:1","ranks":%d}}}}}}`, ranks)
		err := caddy.Load([]byte(cfg), true)
		if err == nil || !strings.Contains(err.Error(), "needs ranks from 1 to 256") {
			t.Errorf("ranks %d: %v, want the load refused for its ranks", ranks, err)
		}
		if n, _ := models.References("m"); n != 0 {
			t.Errorf("ranks %d: the refused model is still referenced %d times", ranks, n)
		}
	}
}

// The wait histogram of a model with load control exists, at zero, once
// its config runs, and leaves with the model when a config drops it.
func TestWaitHistogramFollowsTheRunningModels(t *testing.T) {
	testrun.CaddyHome(t)
	series := func() []string {
		reg := prometheus.NewPedanticRegistry()
		metrics.Register(reg, func() []*livemodel.Load { return nil }, zap.NewNop())
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var models []string
		for _, f := range families {
			if f.GetName() != "caddy_warden_load_control_wait_seconds" {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					models = append(models, l.GetValue())
				}
			}
		}
		return models
	}
	load := func(model string) {
		t.Helper()
		cfg := fmt.Sprintf(`{"admin":{"disabled":true,"config":{"persist":false}},"apps":{"warden":{"models":{%q:{"replicas":[{"address":"127.0.0.1:1"}],"load_control":{"enabled":true}}}}}}`, model)
		if err := caddy.Load([]byte(cfg), true); err != nil {
			t.Fatal(err)
		}
	}
	load("old-model")
	if got := series(); !slices.Contains(got, "old-model") {
		t.Errorf("wait histogram series %v while old-model runs, want it there", got)
	}
	load("new-model")
	if got := series(); slices.Contains(got, "old-model") || !slices.Contains(got, "new-model") {
		t.Errorf("wait histogram series %v after old-model left the config, want new-model's alone", got)
	}
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
}
