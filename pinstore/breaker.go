package pinstore

import (
	"sync"
	"sync/atomic"
	"time"
)

// The breaker keeps a sick Redis off the request path. It opens on the
// first timeout (a timed-out call already cost a request Config.Timeout;
// the next would too) or on the second consecutive error (a single refused
// or reset connection is often just a stale pooled connection after a Redis
// restart). While open, Claim and Repin return at once without a call;
// only Run's PING probe, every probeInterval, closes it again.
const (
	errorsToOpen  = 2
	probeInterval = 500 * time.Millisecond
)

type breaker struct {
	open atomic.Bool // read on every Claim and Repin without the lock

	mu        sync.Mutex
	fails     int       // consecutive failed calls
	lastOK    bool      // the last call answered
	lastError string    // sanitised; kept after recovery for the admin
	downSince time.Time // when it opened; zero while closed
}

// success records a call that answered. It does not close an open breaker
// (a call that started before it opened may end after): the probe does.
func (b *breaker) success() {
	b.mu.Lock()
	b.fails, b.lastOK = 0, true
	b.mu.Unlock()
}

// failure records a failed call and reports whether it opened the breaker.
func (b *breaker) failure(msg string, timeout bool) (opened bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fails++
	b.lastOK, b.lastError = false, msg
	if b.open.Load() || (!timeout && b.fails < errorsToOpen) {
		return false
	}
	b.downSince = time.Now()
	b.open.Store(true)
	return true
}

// closeAfterProbe closes the breaker after a probe answered and returns how
// long it was open (0 if it was closed).
func (b *breaker) closeAfterProbe() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fails, b.lastOK = 0, true
	if !b.open.Load() {
		return 0
	}
	d := time.Since(b.downSince)
	b.downSince = time.Time{}
	b.open.Store(false)
	return d
}

func (b *breaker) state() (up bool, lastError string, downSince time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.open.Load() && b.lastOK, b.lastError, b.downSince
}
