// Package pinsnapshot keeps a model's pins in a storage (Caddy's) across
// restarts, so that a restart keeps conversations on their replicas: read
// once when the model's state is created, restored when its first config
// starts, written periodically and when the last config using it stops.
// One Caddy per storage: instances sharing one would overwrite each
// other's.
package pinsnapshot

import (
	"context"
	"errors"
	"io/fs"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/fleet"
	"github.com/lmwarden/caddy-warden/selection"
)

// Storage is where snapshots are kept: Caddy's storage (certmagic.Storage)
// has these methods. Load reports a missing key with fs.ErrNotExist.
type Storage interface {
	Load(ctx context.Context, key string) ([]byte, error)
	Store(ctx context.Context, key string, value []byte) error
}

// storageTimeout bounds each read or write of a snapshot, so that a hung
// storage backend delays a start, a sweep or a stop by that much at most.
const storageTimeout = 10 * time.Second

// Status is a model's pin snapshot in the storage: the last write, and what
// became of the snapshot read at start.
type Status struct {
	Key             string    `json:"key"` // in Caddy's storage, by default under its data directory
	LastWritten     time.Time `json:"last_written,omitzero"`
	LastWritePins   int       `json:"last_write_pins"`
	LastWriteBytes  int       `json:"last_write_bytes"`
	LastWriteMillis float64   `json:"last_write_ms"`         // copy, encoding and storage
	WriteError      string    `json:"write_error,omitempty"` // of the last attempt
	LoadError       string    `json:"load_error,omitempty"`  // the snapshot at start was unreadable
	// Of the snapshot read at start: pins restored, and dropped by reason.
	Restored              int `json:"restored"`
	Dropped               int `json:"dropped"`
	DroppedExpired        int `json:"dropped_expired"`         // idle past session_ttl
	DroppedUnknownReplica int `json:"dropped_unknown_replica"` // a replica no longer configured
	DroppedOverCapacity   int `json:"dropped_over_capacity"`   // beyond max_sessions
	DroppedAlreadyPinned  int `json:"dropped_already_pinned"`  // placed by a request before the restore
}

// Snapshot is one model's pins in the storage.
type Snapshot struct {
	model string
	key   string

	writeMu sync.Mutex // one write at a time: the periodic and the final one

	mu      sync.Mutex
	pending []selection.Pin // read at creation, until the first config restores them
	written uint64          // the router's request count at the last write
	status  Status
}

// New is the snapshot of the named model.
func New(model string) *Snapshot {
	return &Snapshot{model: model, key: key(model)}
}

// key is the model's snapshot in the storage. The name is escaped into one
// path segment, so that no model name reaches outside warden/ (file storage
// joins keys to its directory).
func key(model string) string {
	seg := url.PathEscape(model)
	if seg == "." || seg == ".." {
		seg = strings.ReplaceAll(seg, ".", "%2E")
	}
	return path.Join("warden", seg, "pins")
}

// Load reads the snapshot for the first start. A missing one is a first
// run; an unreadable one is logged and ignored, as pins are an optimisation.
func (s *Snapshot) Load(storage Storage, logger *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), storageTimeout)
	defer cancel()
	data, err := storage.Load(ctx, s.key)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var pins []selection.Pin
	if err == nil {
		pins, err = fleet.DecodePins(data)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.status.LoadError = err.Error()
		logger.Warn("pin snapshot ignored: conversations are placed anew", zap.String("key", s.key), zap.Error(err))
		return
	}
	s.pending = pins
}

// Restore puts the pins Load read into the table, once, through the first
// config's view, which decides what is kept.
func (s *Snapshot) Restore(view *selection.View, now time.Time, logger *zap.Logger) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending == nil {
		return
	}
	st := view.Restore(s.pending, now)
	s.pending = nil
	s.status.Restored = st.Restored
	s.status.Dropped = st.Dropped()
	s.status.DroppedExpired = st.Expired
	s.status.DroppedUnknownReplica = st.UnknownReplica
	s.status.DroppedOverCapacity = st.OverCapacity
	s.status.DroppedAlreadyPinned = st.Present
	logger.Info("pins restored", zap.String("model", s.model), zap.Int("restored", st.Restored),
		zap.Int("expired", st.Expired), zap.Int("unknown_replica", st.UnknownReplica),
		zap.Int("over_capacity", st.OverCapacity), zap.Int("already_pinned", st.Present))
}

// Write stores the pins when a request was routed through view since the
// last write (an idle model's snapshot is already current, bar expiry,
// which Restore applies). It runs on the sweeper's goroutine or as a
// config stops, never on a request's.
func (s *Snapshot) Write(storage Storage, view *selection.View, pins func() []selection.Pin, now time.Time, logger *zap.Logger) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	requests := view.Status().Requests
	s.mu.Lock()
	idle := requests == s.written
	s.mu.Unlock()
	if idle {
		return
	}
	start := time.Now()
	table := pins()
	data := fleet.EncodePins(table)
	ctx, cancel := context.WithTimeout(context.Background(), storageTimeout)
	err := storage.Store(ctx, s.key, data)
	cancel()
	took := time.Since(start)

	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.status.WriteError = err.Error()
		logger.Warn("pin snapshot not written", zap.String("model", s.model), zap.String("key", s.key), zap.Error(err))
		return
	}
	s.written = requests
	s.status.WriteError = ""
	s.status.LastWritten = now
	s.status.LastWritePins = len(table)
	s.status.LastWriteBytes = len(data)
	s.status.LastWriteMillis = float64(took.Microseconds()) / 1000
	logger.Debug("pin snapshot written", zap.String("model", s.model), zap.Int("pins", len(table)),
		zap.Int("bytes", len(data)), zap.Duration("took", took))
}

// Status is the snapshot's state for the admin API.
func (s *Snapshot) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	st.Key = s.key
	return st
}
