package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/e2e"
)

// recorder keeps every request's record, from all clients.
type recorder struct {
	mu   sync.Mutex
	reqs []request
}

func (rec *recorder) add(r request) {
	rec.mu.Lock()
	rec.reqs = append(rec.reqs, r)
	rec.mu.Unlock()
}

func (rec *recorder) snapshot() []request {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return slices.Clone(rec.reqs)
}

// fromResult records an agentload request.
func fromResult(res agentload.Result) request {
	return request{
		conv:     res.SessionID,
		origin:   fromAgent,
		start:    res.Start,
		end:      res.End,
		engine:   res.Engine,
		instance: res.Header.Get(e2e.InstanceHeader),
		outcome:  res.Header.Get(outcomeHeader),
		status:   res.Status,
		ok:       res.OK(),
		cut:      res.Cut,
		err:      errText(res.Err),
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// keptAliveRetry resends a request, at most twice, when it failed on a
// connection it got, without any response: the server closed the
// connection as the request went out (a kept-alive one, or one the old
// config's server had just accepted). Caddy closes the old config's
// connections on every reload, and a POST cannot tell whether it was
// received, so Go's client does not resend it itself; the Anthropic SDK
// that Claude Code uses does (connection errors are retried twice),
// after a backoff of at least 0.375 s, then 0.75 s (0.5 s doubling, less
// its jitter of up to a quarter). Resending at once instead could pick
// another of the connections the same reload closed, before the transport
// has noticed, and fail where the SDK would not. Resends are counted, by
// time.
type keptAliveRetry struct {
	base http.RoundTripper
	// backoff is the wait before the first resend, doubled for the next:
	// the SDK's shortest, scaled like every time of the run.
	backoff time.Duration

	mu sync.Mutex
	at []time.Time
}

// maxResends is the Anthropic SDK's default max_retries.
const maxResends = 2

// sdkRetryBackoff is the Anthropic SDK's shortest wait before its first
// retry: 0.5 s less a jitter of up to a quarter.
const sdkRetryBackoff = 375 * time.Millisecond

// RoundTrip sends req, and again if its connection broke before a response.
func (k *keptAliveRetry) RoundTrip(req *http.Request) (*http.Response, error) {
	for resends := 0; ; resends++ {
		var connected bool // a refused dial (Caddy down) is left to the caller, as a failure
		trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { connected = true }}
		resp, err := k.base.RoundTrip(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
		if err == nil || !connected || resends == maxResends || req.GetBody == nil || req.Context().Err() != nil {
			if err != nil && resends > 0 {
				err = fmt.Errorf("%w (after %d resends)", err, resends) // shows in the failure notes
			}
			return resp, err
		}
		body, bodyErr := req.GetBody()
		if bodyErr != nil {
			return nil, err
		}
		select {
		case <-time.After(k.backoff << resends):
		case <-req.Context().Done():
			return nil, err
		}
		k.mu.Lock()
		k.at = append(k.at, time.Now())
		k.mu.Unlock()
		req = req.Clone(req.Context())
		req.Body = body
	}
}

// resends counts the resends in a window.
func (k *keptAliveRetry) resends(w window) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, t := range k.at {
		if w.contains(t) {
			n++
		}
	}
	return n
}

// load is the steady traffic of a run: closed-loop agent sessions, probe
// conversations that send a short turn every interval (their pins are
// followed through each fault, and a failed turn is sent again, as an agent
// would), and one new one-turn conversation per interval (which shows where
// new conversations go).
type load struct {
	base     string // Caddy's site, "http://host:port"
	model    string
	header   string // the session header
	interval time.Duration
	client   *http.Client // its transport is retry
	retry    *keptAliveRetry
	rec      *recorder

	wg sync.WaitGroup
}

// start runs the load until ctx ends; wait waits for it.
func (l *load) start(ctx context.Context, gen *agentload.Generator, sessions, probes int) {
	runner := &agentload.Runner{
		Generator: gen,
		BaseURL:   l.base,
		Sessions:  sessions,
		Duration:  24 * time.Hour, // until ctx ends
		Client:    l.client,
		OnResult:  func(res agentload.Result) { l.rec.add(fromResult(res)) },
	}
	l.wg.Go(func() { _, _ = runner.Run(ctx) })
	for i := range probes {
		l.wg.Go(func() { l.probe(ctx, fmt.Sprintf("probe-%02d", i)) })
	}
	l.wg.Go(func() { l.newcomers(ctx) })
}

func (l *load) wait() { l.wg.Wait() }

// probe sends a turn of one conversation every interval.
func (l *load) probe(ctx context.Context, conv string) {
	for turn := 0; ctx.Err() == nil; turn++ {
		l.send(ctx, conv, fromProbe, turn)
		sleep(ctx, l.interval)
	}
}

// newcomers starts a new conversation every interval.
func (l *load) newcomers(ctx context.Context) {
	tick := time.NewTicker(l.interval)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		wg.Go(func() { l.send(ctx, fmt.Sprintf("new-%05d", n), fromNewcomer, 0) })
	}
}

// probeMaxTokens keeps probe turns short: they measure routing, not load.
const probeMaxTokens = 16

// send makes one streaming request and records it.
func (l *load) send(ctx context.Context, conv string, o origin, turn int) {
	r := request{conv: conv, origin: o, start: time.Now()}
	defer func() {
		r.end = time.Now()
		r.cut = !r.ok && ctx.Err() != nil
		l.rec.add(r)
	}()
	body, _ := json.Marshal(map[string]any{
		"model":      l.model,
		"max_tokens": probeMaxTokens,
		"stream":     true,
		"messages":   []map[string]string{{"role": "user", "content": fmt.Sprintf("%s turn %d: are you there?", conv, turn)}},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.base+"/v1/messages?beta=true", bytes.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(l.header, conv)
	resp, err := l.client.Do(req)
	if err != nil {
		r.err = err.Error()
		return
	}
	defer resp.Body.Close()
	r.status, r.engine = resp.StatusCode, resp.Header.Get(agentload.EngineHeader)
	r.instance, r.outcome = resp.Header.Get(e2e.InstanceHeader), resp.Header.Get(outcomeHeader)
	stream, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		r.err = err.Error()
	case resp.StatusCode != http.StatusOK:
		r.err = "status " + resp.Status
	case !strings.Contains(string(stream), "message_stop"):
		r.err = "stream ended before message_stop"
	default:
		r.ok = true
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
