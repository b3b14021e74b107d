package caddymodule

import (
	"time"

	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/metrics"
	"github.com/lmwarden/caddy-warden/pinstore"
	"github.com/lmwarden/caddy-warden/selection"
)

// openPinStore opens the model's shared pin store, nil when its pins are
// local. Opening makes no network call: Provision must not wait on Redis.
func openPinStore(name string, cfg *ModelConfig, rc *RedisConfig, logger *zap.Logger) (*pinstore.Store, error) {
	if rc == nil {
		return nil, nil
	}
	if err := validatePinStore(name, rc); err != nil {
		return nil, err
	}
	ttl, maxPins := time.Duration(cfg.SessionTTL), cfg.MaxSessions
	if ttl <= 0 {
		ttl = selection.DefaultSessionTTL
	}
	if maxPins <= 0 {
		maxPins = selection.DefaultMaxSessions
	}
	return pinstore.Open(rc.storeConfig(), pinstore.Options{
		Model:        name,
		TTL:          ttl,
		MaxPins:      maxPins,
		SyncInterval: time.Duration(rc.SyncInterval),
		Logger:       logger.Named("pin_store"),
		Observe:      metrics.ObservePinStore(name),
	})
}

func closePinStore(s *pinstore.Store) {
	if s != nil {
		_ = s.Close()
	}
}
