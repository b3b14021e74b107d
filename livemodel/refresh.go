package livemodel

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lmwarden/caddy-warden/fleet"
	"github.com/lmwarden/caddy-warden/selection"
)

// Refreshes keep the caches of the conversations load control keeps for a
// person within their share (loadcontrol/refresh.go): every metrics
// interval, each idle one's last request goes again to its replica, for
// one token, so
// that the engine takes its blocks and frees them anew, last to be
// evicted. The requests go as the client sent them (its path and
// credentials), to the replica's address over plain HTTP, as /metrics is
// read; the bodies and credentials stay in memory and no longer than the
// conversation is kept.

// Prompt is a conversation's last request, made a refresh: its path and
// query, the headers to send (credentials, API version) and the body with
// one token to generate and no stream.
type Prompt struct {
	Path   string
	Header http.Header
	Body   []byte
}

const (
	// maxKeptPromptBytes bounds the bodies kept for refreshes, in all:
	// past it a turn's body is not kept.
	maxKeptPromptBytes = 64 << 20
	// keptPromptFor is how long a body is kept once its conversation is
	// no longer among those refreshed (as long as load control keeps an
	// idle conversation for a late return); a turn running meanwhile
	// keeps its conversation's body too.
	keptPromptFor = 5 * time.Minute
	// refreshTimeout bounds a refresh, its wait in the engine's queue
	// included.
	refreshTimeout = time.Minute
)

// refresher holds the prompts kept for refreshes and sends them.
type refresher struct {
	mu       sync.Mutex
	prompts  map[uint64]*keptPrompt
	bytes    int
	sent     atomic.Uint64 // refreshes answered with a success
	failed   atomic.Uint64 // refreshes that failed or were refused
	inFlight sync.WaitGroup
}

type keptPrompt struct {
	Prompt
	seen    time.Time // stored, or last refreshed
	running bool      // a refresh of it is under way
}

// KeepPrompt keeps p as the last request of key's conversation, for its
// refreshes while load control keeps it.
func (m *Model) KeepPrompt(key uint64, p Prompt, now time.Time) {
	r := &m.refresh
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.prompts == nil {
		r.prompts = map[uint64]*keptPrompt{}
	}
	old := r.prompts[key]
	grown := len(p.Body)
	if old != nil {
		grown -= len(old.Body)
	}
	if r.bytes+grown > maxKeptPromptBytes {
		return
	}
	r.bytes += grown
	kp := &keptPrompt{Prompt: p, seen: now}
	if old != nil {
		kp.running = old.running
	}
	r.prompts[key] = kp
}

// refreshInterval is the applied load's metrics interval (1 s by default),
// the pace at which warden follows its replicas.
func (m *Model) refreshInterval() time.Duration {
	if p := m.fleet.Applied(); p != nil {
		return p.MetricsInterval()
	}
	return fleet.SweepInterval
}

// Refreshes counts the refreshes answered with a success and those that
// were not.
func (m *Model) Refreshes() (sent, failed uint64) {
	return m.refresh.sent.Load(), m.refresh.failed.Load()
}

// refreshKept sends the last request of each conversation kept idle on its
// replica, unless a refresh of it is still under way, and forgets the
// bodies of conversations no longer kept.
func (m *Model) refreshKept(ctx context.Context, now time.Time) {
	var kept []selection.Kept
	if p := m.fleet.Applied(); p != nil {
		kept = p.View().KeptIdle(now)
	}
	r := &m.refresh
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range kept {
		kp := r.prompts[k.Key]
		if kp == nil {
			continue
		}
		kp.seen = now
		if kp.running {
			continue
		}
		kp.running = true
		r.inFlight.Go(func() {
			ok := m.send(ctx, k.Replica, kp.Prompt)
			r.mu.Lock()
			if cur := r.prompts[k.Key]; cur != nil {
				cur.running = false // kp, or the turn's that replaced it meanwhile
			}
			r.mu.Unlock()
			if ok {
				r.sent.Add(1)
			} else {
				r.failed.Add(1)
			}
		})
	}
	for key, kp := range r.prompts {
		if !kp.running && now.Sub(kp.seen) > keptPromptFor {
			r.bytes -= len(kp.Body)
			delete(r.prompts, key)
		}
	}
}

// send posts p to rep and reports whether it succeeded.
func (m *Model) send(ctx context.Context, rep selection.Replica, p Prompt) bool {
	ctx, cancel := context.WithTimeout(ctx, refreshTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+rep.Address+p.Path, bytes.NewReader(p.Body))
	if err != nil {
		return false
	}
	req.Header = p.Header.Clone()
	if rep.SetsRank {
		req.Header.Set(selection.RankHeader, strconv.Itoa(rep.Rank))
	}
	resp, err := (&http.Client{Transport: m.transport}).Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode < 300
}
