package livemodel

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lmwarden/caddy-warden/fleet"
	"github.com/lmwarden/caddy-warden/selection"
)

// Refreshes keep the caches of the conversations load control keeps for a
// person within their share (loadcontrol/refresh.go): every metrics
// interval, each idle one's last request goes again to its replica, for
// one token, so that the engine takes its blocks and frees them anew, last
// to be evicted. The requests go as the client sent them (its path and
// credentials), to the replica's address over plain HTTP, as /metrics is
// read; the bodies and credentials stay in memory, keptPromptFor past the
// conversation's last refresh.

// Prompt is a conversation's last request: its path and query, the headers
// a refresh sends (credentials, API version) and its body as the client
// sent it, which the first refresh rewrites (refreshBody).
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
	// no longer among those refreshed, or since its turn was admitted (as
	// long as load control keeps an idle conversation for a late return).
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
	// rewritten: Body is the refresh's (refreshBody), since the first one.
	// Body changes only then, under the lock, by the one refresh running.
	rewritten bool
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
		r.inFlight.Go(func() { m.refreshOne(ctx, k.Key, k.Replica, kp) })
	}
	for key, kp := range r.prompts {
		if !kp.running && now.Sub(kp.seen) > keptPromptFor {
			r.forget(key)
		}
	}
}

// refreshOne sends kp, key's prompt, to rep, whose refresh it runs (its
// running set); a refresh refused as it is will be refused again, and its
// prompt is forgotten.
func (m *Model) refreshOne(ctx context.Context, key uint64, rep selection.Replica, kp *keptPrompt) {
	r := &m.refresh
	body, ok := kp.Body, kp.rewritten
	if !ok {
		body, ok = refreshBody(kp.Path, kp.Body)
	}
	status := http.StatusBadRequest // no JSON object: nothing to send
	if ok {
		status = m.send(ctx, rep, kp.Path, kp.Header, body)
	}
	if status >= 200 && status < 300 {
		r.sent.Add(1)
	} else {
		r.failed.Add(1)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := r.prompts[key]
	if cur != nil {
		cur.running = false // kp, or the turn's that replaced it meanwhile
	}
	switch {
	case cur != kp:
	case status >= 400 && status < 500:
		r.forget(key)
	case !kp.rewritten:
		r.bytes += len(body) - len(kp.Body)
		kp.Body, kp.rewritten = body, true
	}
}

// forget drops key's prompt (r.mu held).
func (r *refresher) forget(key uint64) {
	if kp := r.prompts[key]; kp != nil {
		r.bytes -= len(kp.Body)
		delete(r.prompts, key)
	}
}

// send posts a refresh to rep and returns the answer's status, 0 when
// there was none.
func (m *Model) send(ctx context.Context, rep selection.Replica, path string, header http.Header, body []byte) int {
	ctx, cancel := context.WithTimeout(ctx, refreshTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+rep.Address+path, bytes.NewReader(body))
	if err != nil {
		return 0
	}
	req.Header = header.Clone()
	if rep.SetsRank {
		req.Header.Set(selection.RankHeader, strconv.Itoa(rep.Rank))
	}
	resp, err := (&http.Client{Transport: m.transport}).Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode
}

// dropFromRefresh are request fields a refresh leaves out: more than one
// answer (n), a stream's options, a response in the background, a minimum
// answer longer than one token, the prompt's log-probabilities (vLLM
// computes the whole prompt for them, past its cache) and a transfer from
// another engine's cache that has happened.
var dropFromRefresh = []string{"n", "stream_options", "background", "min_tokens", "prompt_logprobs", "kv_transfer_params"}

// refreshBody is a request's body made to generate one token, without a
// stream: the same prompt, so that the engine finds it cached and frees
// its blocks anew. The Responses API bounds its output with
// max_output_tokens and stores no response, the others take max_tokens
// (or max_completion_tokens).
func refreshBody(path string, body []byte) ([]byte, bool) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil || fields == nil {
		return nil, false
	}
	one := json.RawMessage("1")
	if strings.HasSuffix(path, "/responses") {
		fields["max_output_tokens"] = one
		fields["store"] = json.RawMessage("false")
	} else {
		fields["max_tokens"] = one
		if _, ok := fields["max_completion_tokens"]; ok {
			fields["max_completion_tokens"] = one
		}
	}
	fields["stream"] = json.RawMessage("false")
	for _, name := range dropFromRefresh {
		delete(fields, name)
	}
	out, err := json.Marshal(fields)
	return out, err == nil
}
