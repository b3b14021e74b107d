package caddymodule

import (
	"context"
	"time"

	"go.uber.org/zap"

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
		Observe:      observePinStore(name),
	})
}

func closePinStore(s *pinstore.Store) {
	if s != nil {
		_ = s.Close()
	}
}

// storeSync is the applied load's store exchanging pins with the other
// instances: their re-pins, and the periodic refresh of this instance's.
type storeSync struct {
	load   *modelLoad
	cancel context.CancelFunc
	done   chan struct{}
}

// syncStoreLocked makes l's store the one that syncs (nil: none). A reload
// that keeps the store's settings still switches to the new load's client,
// whose settings are the config in force.
func (m *model) syncStoreLocked(l *modelLoad) {
	if m.sync != nil && m.sync.load == l {
		return
	}
	if m.sync != nil {
		m.sync.cancel()
		<-m.sync.done
		m.sync = nil
	}
	if l == nil || l.store == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &storeSync{load: l, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		l.store.Run(ctx, localPins{m})
	}()
	m.sync = s
}

// localPins is the model's session table as the store sees it.
type localPins struct{ m *model }

func (p localPins) PinsUsedSince(t time.Time) []pinstore.Pin {
	pins := p.m.fleet.PinsUsedSince(t)
	out := make([]pinstore.Pin, len(pins))
	for i, pin := range pins {
		out[i] = pinstore.Pin{Key: pin.Key, Replica: pin.Replica}
	}
	return out
}

// Adopt follows another instance's pin, within the config in force. It
// asks the fleet, not the model, for the applied plan: the model's lock is
// held while a sync is stopped.
func (p localPins) Adopt(key uint64, replica string) bool {
	plan := p.m.fleet.Applied()
	return plan != nil && plan.View().Adopt(key, replica, time.Now())
}
