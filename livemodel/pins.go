package livemodel

import (
	"context"
	"time"

	"github.com/lmwarden/caddy-warden/pinsnapshot"
	"github.com/lmwarden/caddy-warden/pinstore"
)

// writePins stores the pin table through l's storage when l has snapshots
// on (Snapshot.Write skips an idle model). It runs on the
// sweeper's goroutine or as a config stops, never on a request's.
func (m *Model) writePins(l *Load, now time.Time) {
	if l.spec.Storage == nil || l.spec.PinSnapshotInterval <= 0 {
		return
	}
	m.pins.Write(l.spec.Storage, l.plan.View(), m.fleet.Pins, now, l.spec.Logger)
}

// PinSnapshot is the snapshot's state for the admin API; nil when l has
// snapshots off.
func (l *Load) PinSnapshot() *pinsnapshot.Status {
	if l.spec.PinSnapshotInterval <= 0 {
		return nil
	}
	st := l.model.pins.Status()
	return &st
}

// storeSync is the applied load's store exchanging pins with the other
// instances: their re-pins, and the periodic refresh of this instance's.
type storeSync struct {
	load   *Load
	cancel context.CancelFunc
	done   chan struct{}
}

// syncStoreLocked makes l's store the one that syncs (nil: none). A reload
// that keeps the store's settings still switches to the new load's client,
// whose settings are the config in force.
func (m *Model) syncStoreLocked(l *Load) {
	if m.sync != nil && m.sync.load == l {
		return
	}
	if m.sync != nil {
		m.sync.cancel()
		<-m.sync.done
		m.sync = nil
	}
	if l == nil || l.spec.Store == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &storeSync{load: l, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		l.spec.Store.Run(ctx, localPins{m})
	}()
	m.sync = s
}

// localPins is the model's session table as the store sees it.
type localPins struct{ m *Model }

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
