package caddymodule

import (
	"context"
	"errors"
	"io/fs"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/fleet"
	"github.com/lmwarden/caddy-warden/selection"
)

// storageTimeout bounds each read or write of a snapshot, so that a hung
// storage backend delays a start, a sweep or a stop by that much at most.
const storageTimeout = 10 * time.Second

// pinSnapshot keeps a model's pins in Caddy's storage across restarts: read
// once when the model's state is created, restored when its first config
// starts, written periodically and when the last config using it stops.
// One Caddy per storage: instances sharing one would overwrite each other's.
type pinSnapshot struct {
	key string

	writeMu sync.Mutex // one write at a time: the periodic and the final one

	mu      sync.Mutex
	pending []selection.Pin // read at creation, until the first start restores them
	written uint64          // the router's request count at the last write
	status  PinSnapshotStatus
}

// pinSnapshotKey is the model's snapshot in Caddy's storage. The name is
// escaped into one path segment, so that no model name reaches outside
// warden/ (file storage joins keys to its directory).
func pinSnapshotKey(model string) string {
	seg := url.PathEscape(model)
	if seg == "." || seg == ".." {
		seg = strings.ReplaceAll(seg, ".", "%2E")
	}
	return path.Join("warden", seg, "pins")
}

// load reads the snapshot for the first start. A missing one is a first
// run; an unreadable one is logged and ignored, as pins are an optimisation.
func (p *pinSnapshot) load(storage certmagic.Storage, logger *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), storageTimeout)
	defer cancel()
	data, err := storage.Load(ctx, p.key)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var pins []selection.Pin
	if err == nil {
		pins, err = fleet.DecodePins(data)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.status.LoadError = err.Error()
		logger.Warn("pin snapshot ignored: conversations are placed anew", zap.String("key", p.key), zap.Error(err))
		return
	}
	p.pending = pins
}

// restorePins puts the pins read at creation into the table of the first load
// to start, which it must have applied: its view decides what is kept.
func (m *model) restorePins(l *modelLoad, now time.Time) {
	p := &m.pins
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending == nil {
		return
	}
	st := l.plan.View().Restore(p.pending, now)
	p.pending = nil
	p.status.Restored = st.Restored
	p.status.Dropped = st.Dropped()
	p.status.DroppedExpired = st.Expired
	p.status.DroppedUnknownReplica = st.UnknownReplica
	p.status.DroppedOverCapacity = st.OverCapacity
	p.status.DroppedAlreadyPinned = st.Present
	l.logger.Info("pins restored", zap.String("model", m.name), zap.Int("restored", st.Restored),
		zap.Int("expired", st.Expired), zap.Int("unknown_replica", st.UnknownReplica),
		zap.Int("over_capacity", st.OverCapacity), zap.Int("already_pinned", st.Present))
}

// writePins stores the table through l's storage when l has snapshots on
// and a request was routed since the last write (an idle model's file is
// already current, bar expiry, which restore applies). It runs on the
// sweeper's goroutine or in Stop, never on a request's.
func (m *model) writePins(l *modelLoad, now time.Time) {
	if l.storage == nil || l.cfg.pinSnapshotInterval() <= 0 {
		return
	}
	p := &m.pins
	p.writeMu.Lock()
	defer p.writeMu.Unlock()
	requests := l.plan.View().Status().Requests
	p.mu.Lock()
	idle := requests == p.written
	p.mu.Unlock()
	if idle {
		return
	}
	start := time.Now()
	pins := m.fleet.Pins()
	data := fleet.EncodePins(pins)
	ctx, cancel := context.WithTimeout(context.Background(), storageTimeout)
	err := l.storage.Store(ctx, p.key, data)
	cancel()
	took := time.Since(start)

	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.status.WriteError = err.Error()
		l.logger.Warn("pin snapshot not written", zap.String("model", m.name), zap.String("key", p.key), zap.Error(err))
		return
	}
	p.written = requests
	p.status.WriteError = ""
	p.status.LastWritten = now
	p.status.LastWritePins = len(pins)
	p.status.LastWriteBytes = len(data)
	p.status.LastWriteMillis = float64(took.Microseconds()) / 1000
	l.logger.Debug("pin snapshot written", zap.String("model", m.name), zap.Int("pins", len(pins)),
		zap.Int("bytes", len(data)), zap.Duration("took", took))
}

// pinStatus is the snapshot's state for the admin API; nil when l has
// snapshots off.
func (m *model) pinStatus(l *modelLoad) *PinSnapshotStatus {
	if l.cfg.pinSnapshotInterval() <= 0 {
		return nil
	}
	m.pins.mu.Lock()
	defer m.pins.mu.Unlock()
	st := m.pins.status
	st.Key = m.pins.key
	return &st
}
