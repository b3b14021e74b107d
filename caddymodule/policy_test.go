package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lmwarden/caddy-warden/fleet"
	"github.com/lmwarden/caddy-warden/inflight"
	"github.com/lmwarden/caddy-warden/metricsfeed"
	"github.com/lmwarden/caddy-warden/sessionkey"
)

// In-process tests of Policy.Select: the policy routes with a real fleet
// runtime's view, fed with scrapes and health probes as the poller would,
// over a reverse_proxy upstream pool, on requests that carry Caddy's vars
// table as the HTTP server sets it up.

const (
	addrA = "127.0.0.1:7001"
	addrB = "127.0.0.1:7002"
)

// selectFixture is a policy over one config load of a model, on a clock
// that moves only when the test advances it.
type selectFixture struct {
	p     *Policy
	f     *fleet.Model
	plan  *fleet.Plan
	clock *testClock
	logs  *observer.ObservedLogs
}

// testClock is a clock that moves only when the test advances it.
type testClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []testTimer
}

type testTimer struct {
	at time.Time
	c  chan time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := testTimer{at: c.now.Add(d), c: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	c.fireLocked()
	return t.c
}

// advance moves the clock by d and fires the timers due.
func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.fireLocked()
}

// pending is how many timers wait to fire.
func (c *testClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

func (c *testClock) fireLocked() {
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
		} else {
			t.c <- c.now
		}
	}
	c.timers = kept
}

// newSelectFixture prepares and applies cfg and makes every server healthy
// with running requests per engine as given (idle when absent).
func newSelectFixture(t testing.TB, cfg *ModelConfig, running map[string][]int) *selectFixture {
	t.Helper()
	if err := cfg.validate("m"); err != nil {
		t.Fatal(err)
	}
	cfg.rules = cfg.newRules() // as provision makes them
	clock := &testClock{now: time.Now()}
	now := clock.Now()
	f := fleet.New("m", time.Second, now, nil)
	plan := f.Prepare(cfg.fleetSpec(nil))
	f.Apply(plan)
	// Two scrapes: the router takes load seen twice in a row as other
	// clients' traffic.
	for _, addr := range plan.Addresses() {
		engines := running[addr]
		if engines == nil {
			engines = []int{0}
			if cfg.Server != nil {
				engines = make([]int, cfg.Server.Ranks)
			}
		}
		f.ObserveHealth(addr, now, nil)
		f.ObserveScrape(addr, now, loadScrape(engines), nil)
		f.ObserveScrape(addr, now, loadScrape(engines), nil)
	}
	core, logs := observer.New(zapcore.WarnLevel)
	p := &Policy{Model: "m", cfg: cfg, view: plan.View(), clock: clock, logger: zap.New(core), warned: new(sync.Map)}
	for _, rs := range plan.View().Status().Replicas {
		if !rs.Healthy || !rs.Load.Known {
			t.Fatalf("replica %s not ready: healthy %v, load %+v", rs.ID, rs.Healthy, rs.Load)
		}
	}
	return &selectFixture{p: p, f: f, plan: plan, clock: clock, logs: logs}
}

// loadScrape is a scrape of one server whose engine i runs running[i]
// requests.
func loadScrape(running []int) metricsfeed.Scrape {
	var s metricsfeed.Scrape
	for i, n := range running {
		s.Engines = append(s.Engines, metricsfeed.EngineStats{Engine: i, Running: n, Present: metricsfeed.LoadFields})
	}
	return s
}

func pool(addrs ...string) reverseproxy.UpstreamPool {
	var out reverseproxy.UpstreamPool
	for _, a := range addrs {
		out = append(out, &reverseproxy.Upstream{Dial: a})
	}
	return out
}

// newProxyRequest is a request as Caddy's HTTP server hands it to the
// proxy: its context carries the vars table. The context ends with cancel
// or the test.
func newProxyRequest(t *testing.T, header ...string) (*http.Request, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), caddyhttp.VarsCtxKey, map[string]any{}))
	t.Cleanup(cancel)
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/messages", strings.NewReader(`{"messages":[]}`))
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	return r, cancel
}

// selected runs one request through Select and ends it; it returns the
// upstream's address ("" for nil) and the outcome var.
func (fx *selectFixture) selected(t *testing.T, pool reverseproxy.UpstreamPool, header ...string) (addr, outcome string) {
	t.Helper()
	r, cancel := newProxyRequest(t, header...)
	defer cancel()
	u := fx.p.Select(pool, r, nil)
	outcome, _ = caddyhttp.GetVar(r.Context(), varOutcome).(string)
	if u == nil {
		return "", outcome
	}
	return u.Dial, outcome
}

func (fx *selectFixture) inFlight() (total int64, byID map[string]int64) {
	st := fx.plan.View().Status()
	byID = map[string]int64{}
	for _, rs := range st.Replicas {
		byID[rs.ID] = rs.InFlight
	}
	return st.InFlight, byID
}

func TestSelectPinsASession(t *testing.T) {
	// a is busy with other clients' requests: a new session goes to b.
	fx := newSelectFixture(t, &ModelConfig{Replicas: []ReplicaConfig{{Address: addrA}, {Address: addrB}}},
		map[string][]int{addrA: {5}})
	pl := pool(addrA, addrB)
	addr, outcome := fx.selected(t, pl, "X-Claude-Code-Session-Id", "conv-1")
	if addr != addrB || outcome != "placed" {
		t.Fatalf("first turn: %q %q, want %s placed", addr, outcome, addrB)
	}
	for turn := range 5 {
		r, cancel := newProxyRequest(t, "X-Claude-Code-Session-Id", "conv-1")
		u := fx.p.Select(pl, r, nil)
		if u == nil || u.Dial != addrB {
			t.Fatalf("turn %d: upstream %v, want %s", turn, u, addrB)
		}
		ctx := r.Context()
		if got := caddyhttp.GetVar(ctx, varOutcome); got != "sticky" {
			t.Errorf("turn %d: outcome %v, want sticky", turn, got)
		}
		if got := caddyhttp.GetVar(ctx, varReplica); got != addrB {
			t.Errorf("turn %d: replica var %v, want %s", turn, got, addrB)
		}
		if got := caddyhttp.GetVar(ctx, varRank); got != nil {
			t.Errorf("turn %d: replicas mode set the rank var %v", turn, got)
		}
		if got := r.Header.Get(RankHeader); got != "" {
			t.Errorf("turn %d: replicas mode set %s: %s", turn, RankHeader, got)
		}
		cancel()
	}
	// Even once a is idle again: the pin holds.
	fx.f.ObserveScrape(addrA, fx.clock.Now(), loadScrape([]int{0}), nil)
	fx.f.ObserveScrape(addrA, fx.clock.Now(), loadScrape([]int{0}), nil)
	if addr, outcome := fx.selected(t, pl, "X-Claude-Code-Session-Id", "conv-1"); addr != addrB || outcome != "sticky" {
		t.Errorf("after a went idle: %q %q, want %s sticky", addr, outcome, addrB)
	}
}

// The first default session header present names the session, in the
// order X-Claude-Code-Session-Id, X-Session-Id, X-Session-Affinity, Session-Id.
func TestSelectDefaultHeaderOrder(t *testing.T) {
	fx := newSelectFixture(t, &ModelConfig{Replicas: []ReplicaConfig{{Address: addrA}, {Address: addrB}}}, nil)
	pl := pool(addrA, addrB)
	all := []string{
		"X-Claude-Code-Session-Id", "claude", "X-Session-Id", "session-id",
		"X-Session-Affinity", "affinity", "Session-Id", "plain",
	}
	for i := 0; i < len(all); i += 2 {
		r, _ := newProxyRequest(t, all[i:]...)
		fx.p.Select(pl, r, nil)
		held, ok := caddyhttp.GetVar(r.Context(), varInFlight).(*inflight.Request)
		if !ok || held.ID.Key != sessionkey.Hash(all[i+1]) {
			t.Errorf("with %v: key %+v, want %q", all[i:], held, all[i+1])
		}
	}
	// With X-Claude-Code-Session-Id and X-Session-Id, the session is the
	// former's: it is pinned, the latter's value is still a new session.
	home, outcome := fx.selected(t, pl, "X-Claude-Code-Session-Id", "order-1", "X-Session-Id", "other-1")
	if outcome != "placed" {
		t.Fatalf("first turn %q", outcome)
	}
	if addr, outcome := fx.selected(t, pl, "X-Claude-Code-Session-Id", "order-1"); addr != home || outcome != "sticky" {
		t.Errorf("same X-Claude-Code-Session-Id alone: %q %q, want %s sticky", addr, outcome, home)
	}
	if _, outcome := fx.selected(t, pl, "X-Session-Id", "other-1"); outcome != "placed" {
		t.Errorf("the X-Session-Id of the first turn was not a new session: %q", outcome)
	}
}

func TestSelectRanksSetsTheRank(t *testing.T) {
	// Ranks 0, 1 and 3 are busy: a new session goes to rank 2.
	fx := newSelectFixture(t, &ModelConfig{Server: &ServerConfig{Address: addrA, Ranks: 4}},
		map[string][]int{addrA: {3, 3, 0, 3}})
	pl := pool(addrA)
	for turn, want := range []string{"placed", "sticky", "sticky"} {
		r, cancel := newProxyRequest(t, "X-Claude-Code-Session-Id", "ranked")
		u := fx.p.Select(pl, r, nil)
		ctx := r.Context()
		if u == nil || u.Dial != addrA {
			t.Fatalf("turn %d: upstream %v", turn, u)
		}
		if got := r.Header.Get(RankHeader); got != "2" {
			t.Errorf("turn %d: %s %q, want 2", turn, RankHeader, got)
		}
		if got := caddyhttp.GetVar(ctx, varRank); got != "2" {
			t.Errorf("turn %d: var %s %v, want 2", turn, varRank, got)
		}
		if got := caddyhttp.GetVar(ctx, varReplica); got != addrA+"#2" {
			t.Errorf("turn %d: var %s %v, want %s#2", turn, varReplica, got, addrA)
		}
		if got := caddyhttp.GetVar(ctx, varOutcome); got != want {
			t.Errorf("turn %d: outcome %v, want %s", turn, got, want)
		}
		cancel()
	}
}

// With client_pinning off (the default) neither header a client may choose
// its replica with reaches the backend, and neither is honoured.
func TestSelectClientPinningOffStrips(t *testing.T) {
	t.Run("replicas", func(t *testing.T) {
		fx := newSelectFixture(t, &ModelConfig{Replicas: []ReplicaConfig{{Address: addrA}, {Address: addrB}}},
			map[string][]int{addrA: {5}})
		r, _ := newProxyRequest(t, "X-Claude-Code-Session-Id", "s", ReplicaHeader, addrA, RankHeader, "1")
		u := fx.p.Select(pool(addrA, addrB), r, nil)
		if u == nil || u.Dial != addrB {
			t.Errorf("upstream %v: the client's choice of %s was honoured", u, addrA)
		}
		for _, h := range []string{ReplicaHeader, RankHeader} {
			if v, ok := r.Header[http.CanonicalHeaderKey(h)]; ok {
				t.Errorf("%s left on the request: %q", h, v)
			}
		}
		if got := caddyhttp.GetVar(r.Context(), varOutcome); got != "placed" {
			t.Errorf("outcome %v, want placed", got)
		}
	})
	t.Run("ranks", func(t *testing.T) {
		fx := newSelectFixture(t, &ModelConfig{Server: &ServerConfig{Address: addrA, Ranks: 2}},
			map[string][]int{addrA: {4, 0}})
		r, _ := newProxyRequest(t, "X-Claude-Code-Session-Id", "s", ReplicaHeader, addrA+"#0", RankHeader, "0")
		fx.p.Select(pool(addrA), r, nil)
		if got := r.Header.Get(RankHeader); got != "1" {
			t.Errorf("%s %q: want warden's choice 1, not the client's 0", RankHeader, got)
		}
		if _, ok := r.Header[ReplicaHeader]; ok {
			t.Errorf("%s left on the request", ReplicaHeader)
		}
		if got := caddyhttp.GetVar(r.Context(), varOutcome); got != "placed" {
			t.Errorf("outcome %v, want placed", got)
		}
	})
}

func TestSelectClientPinningOn(t *testing.T) {
	t.Run("ranks: a rank in range is honoured", func(t *testing.T) {
		fx := newSelectFixture(t, &ModelConfig{Server: &ServerConfig{Address: addrA, Ranks: 4}, ClientPinning: true},
			map[string][]int{addrA: {0, 9, 0, 0}})
		for turn := range 2 {
			r, cancel := newProxyRequest(t, "X-Claude-Code-Session-Id", "s", RankHeader, "1")
			fx.p.Select(pool(addrA), r, nil)
			ctx := r.Context()
			if got := r.Header.Get(RankHeader); got != "1" {
				t.Errorf("turn %d: %s %q, want the client's 1", turn, RankHeader, got)
			}
			if got := caddyhttp.GetVar(ctx, varRank); got != "1" {
				t.Errorf("turn %d: var rank %v", turn, got)
			}
			if got := caddyhttp.GetVar(ctx, varOutcome); got != "client_pinned" {
				t.Errorf("turn %d: outcome %v, want client_pinned", turn, got)
			}
			cancel()
		}
	})
	for _, bad := range []string{"4", "-1", "one", "1.0"} {
		t.Run("ranks: rank "+bad+" is replaced", func(t *testing.T) {
			fx := newSelectFixture(t, &ModelConfig{Server: &ServerConfig{Address: addrA, Ranks: 4}, ClientPinning: true},
				map[string][]int{addrA: {3, 3, 3, 0}})
			r, _ := newProxyRequest(t, "X-Claude-Code-Session-Id", "s", RankHeader, bad)
			fx.p.Select(pool(addrA), r, nil)
			if got := r.Header.Get(RankHeader); got != "3" {
				t.Errorf("%s %q: want warden's choice 3", RankHeader, got)
			}
			if got := caddyhttp.GetVar(r.Context(), varOutcome); got != "placed" {
				t.Errorf("outcome %v, want placed", got)
			}
		})
	}
	t.Run("ranks: without a rank warden chooses", func(t *testing.T) {
		fx := newSelectFixture(t, &ModelConfig{Server: &ServerConfig{Address: addrA, Ranks: 2}, ClientPinning: true},
			map[string][]int{addrA: {3, 0}})
		r, _ := newProxyRequest(t, "X-Claude-Code-Session-Id", "s")
		fx.p.Select(pool(addrA), r, nil)
		if got := r.Header.Get(RankHeader); got != "1" {
			t.Errorf("%s %q, want 1", RankHeader, got)
		}
	})
	t.Run("replicas: a replica ID is honoured and the header removed", func(t *testing.T) {
		fx := newSelectFixture(t, &ModelConfig{Replicas: []ReplicaConfig{{Address: addrA}, {Address: addrB}}, ClientPinning: true},
			map[string][]int{addrA: {5}})
		r, _ := newProxyRequest(t, "X-Claude-Code-Session-Id", "s", ReplicaHeader, addrA)
		u := fx.p.Select(pool(addrA, addrB), r, nil)
		if u == nil || u.Dial != addrA {
			t.Errorf("upstream %v, want the client's %s", u, addrA)
		}
		if got := caddyhttp.GetVar(r.Context(), varOutcome); got != "client_pinned" {
			t.Errorf("outcome %v, want client_pinned", got)
		}
		if _, ok := r.Header[ReplicaHeader]; ok {
			t.Errorf("%s left on the request", ReplicaHeader)
		}
	})
	t.Run("replicas: an unknown replica ID is ignored", func(t *testing.T) {
		fx := newSelectFixture(t, &ModelConfig{Replicas: []ReplicaConfig{{Address: addrA}, {Address: addrB}}, ClientPinning: true},
			map[string][]int{addrA: {5}})
		addr, outcome := fx.selected(t, pool(addrA, addrB), "X-Claude-Code-Session-Id", "s", ReplicaHeader, "127.0.0.1:1")
		if addr != addrB || outcome != "placed" {
			t.Errorf("%q %q, want %s placed", addr, outcome, addrB)
		}
	})
}

// Affinity off with internal data parallelism hands the choice of rank to
// vLLM: no rank header, nothing counted in flight.
// Even a client's rank with client_pinning on is removed: vLLM decides.
func TestSelectRanksAffinityOffDelegates(t *testing.T) {
	off := false
	fx := newSelectFixture(t, &ModelConfig{Server: &ServerConfig{Address: addrA, Ranks: 4}, Affinity: &off}, nil)
	// Without client pinning a client's rank is dropped and vLLM decides.
	r, cancel := newProxyRequest(t, "X-Claude-Code-Session-Id", "s", RankHeader, "2")
	u := fx.p.Select(pool(addrA), r, nil)
	ctx := r.Context()
	if u == nil || u.Dial != addrA {
		t.Fatalf("upstream %v, want the server %s", u, addrA)
	}
	if v, ok := r.Header[http.CanonicalHeaderKey(RankHeader)]; ok {
		t.Errorf("%s on the request: %q", RankHeader, v)
	}
	if got := caddyhttp.GetVar(ctx, varOutcome); got != "delegated" {
		t.Errorf("outcome %v, want delegated", got)
	}
	if got := caddyhttp.GetVar(ctx, varRank); got != nil {
		t.Errorf("var rank %v", got)
	}
	if total, _ := fx.inFlight(); total != 0 {
		t.Errorf("%d in flight for a delegated request", total)
	}
	cancel()
	// With client pinning the client's rank is honoured, as with affinity on.
	fx.p.cfg.ClientPinning = true
	r, cancel = newProxyRequest(t, "X-Claude-Code-Session-Id", "s", RankHeader, "2")
	defer cancel()
	if u := fx.p.Select(pool(addrA), r, nil); u == nil || r.Header.Get(RankHeader) != "2" ||
		caddyhttp.GetVar(r.Context(), varOutcome) != "client_pinned" {
		t.Errorf("client_pinning on, affinity off: upstream %v, rank %q, outcome %v; want rank 2, client_pinned",
			u, r.Header.Get(RankHeader), caddyhttp.GetVar(r.Context(), varOutcome))
	}
	// The server is no upstream of the pool: nothing to return, and a
	// warning.
	fx.p.cfg.ClientPinning = false
	r, _ = newProxyRequest(t)
	if u := fx.p.Select(pool(addrB), r, nil); u != nil {
		t.Errorf("upstream %v from a pool without the server", u)
	}
	if n := fx.logs.FilterMessageSnippet("not an upstream of this reverse_proxy").Len(); n != 1 {
		t.Errorf("%d warnings of the missing server, want 1", n)
	}
}

// Caddy calls Select again on the same request for each retry: the retry
// gives back the failed try's in-flight count, and the request's end gives
// back the last.
func TestSelectRetryAndEndRelease(t *testing.T) {
	fx := newSelectFixture(t, &ModelConfig{Replicas: []ReplicaConfig{{Address: addrA}, {Address: addrB}}},
		map[string][]int{addrA: {5}})
	pl := pool(addrA, addrB)
	r, cancel := newProxyRequest(t, "X-Claude-Code-Session-Id", "retry")
	if u := fx.p.Select(pl, r, nil); u == nil || u.Dial != addrB {
		t.Fatalf("first try: %v, want %s", u, addrB)
	}
	held := caddyhttp.GetVar(r.Context(), varInFlight)
	if total, by := fx.inFlight(); total != 1 || by[addrB] != 1 {
		t.Fatalf("after the first try: %d in flight %v, want 1 on b", total, by)
	}

	// The same replica again (a retry after a response error).
	if u := fx.p.Select(pl, r, nil); u == nil || u.Dial != addrB {
		t.Fatalf("second try: %v, want %s", u, addrB)
	}
	if total, by := fx.inFlight(); total != 1 || by[addrB] != 1 {
		t.Errorf("after a retry on the same replica: %d in flight %v, want 1 on b", total, by)
	}

	// b fails its health check: the retry moves the session to a.
	fx.f.ObserveHealth(addrB, fx.clock.Now(), errors.New("503"))
	if u := fx.p.Select(pl, r, nil); u == nil || u.Dial != addrA {
		t.Fatalf("third try: %v, want %s", u, addrA)
	}
	if got := caddyhttp.GetVar(r.Context(), varOutcome); got != "replaced" {
		t.Errorf("third try: outcome %v, want replaced", got)
	}
	if total, by := fx.inFlight(); total != 1 || by[addrA] != 1 || by[addrB] != 0 {
		t.Errorf("after a retry on another replica: %d in flight %v, want 1 on a", total, by)
	}
	if again := caddyhttp.GetVar(r.Context(), varInFlight); again != held {
		t.Error("a retry replaced the request's in-flight record")
	}

	cancel()
	waitFor(t, "nothing in flight after the request's end", func() bool {
		total, _ := fx.inFlight()
		return total == 0
	})
}

// Many requests at once, each ended: nothing stays in flight.
func TestSelectConcurrentRequestsRelease(t *testing.T) {
	fx := newSelectFixture(t, &ModelConfig{Replicas: []ReplicaConfig{{Address: addrA}, {Address: addrB}}}, nil)
	pl := pool(addrA, addrB)
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			r, cancel := newProxyRequest(t, "X-Claude-Code-Session-Id", []string{"x", "y", "z", ""}[i%4])
			defer cancel()
			for range 1 + i%3 { // retries
				if fx.p.Select(pl, r, nil) == nil {
					t.Error("no upstream")
				}
			}
		})
	}
	wg.Wait()
	waitFor(t, "nothing in flight after every request ended", func() bool {
		total, _ := fx.inFlight()
		return total == 0
	})
}

// A client may leave while its request is routed, or before Caddy's retry
// (Caddy waits try_interval on its own context, not the request's): the
// request's end has run then, so a retry gets no upstream and a decision
// taken alongside the end is given back at once.
func TestSelectAfterItsClientLeftKeepsNothing(t *testing.T) {
	fx := newSelectFixture(t, &ModelConfig{Replicas: []ReplicaConfig{{Address: addrA}, {Address: addrB}}}, nil)
	pl := pool(addrA, addrB)
	idle := func() bool { total, _ := fx.inFlight(); return total == 0 }
	r, cancel := newProxyRequest(t, "X-Claude-Code-Session-Id", "gone")
	if fx.p.Select(pl, r, nil) == nil {
		t.Fatal("first try: no upstream")
	}
	cancel()
	waitFor(t, "the request's end", idle)
	if u := fx.p.Select(pl, r, nil); u != nil {
		t.Errorf("a retry after its client left went to %s", u.Dial)
	}
	if total, by := fx.inFlight(); total != 0 {
		t.Errorf("a retry after its client left: %d in flight %v", total, by)
	}

	for i := range 20000 { // the end races each Select; about 1 in 4,000 lost before the fix
		r, cancel := newProxyRequest(t, "X-Claude-Code-Session-Id", fmt.Sprint("s", i%50))
		cancel()
		fx.p.Select(pl, r, nil)
	}
	waitFor(t, "every request's end", idle)
}

// The vars a log or header_up may read: the in-flight record renders as
// nothing, and no var holds the raw session key.
func TestSelectVarsHideTheSessionKey(t *testing.T) {
	const secret = "raw-session-key-3b9f"
	fx := newSelectFixture(t, &ModelConfig{Server: &ServerConfig{Address: addrA, Ranks: 2}}, nil)
	r, _ := newProxyRequest(t, "X-Claude-Code-Session-Id", secret)
	repl := caddyhttp.NewTestReplacer(r)
	if fx.p.Select(pool(addrA), r, nil) == nil {
		t.Fatal("no upstream")
	}
	got := repl.ReplaceAll("[{http.vars.warden.in_flight}][{http.vars.warden.outcome}][{http.vars.warden.replica}][{http.vars.warden.rank}]", "-")
	if want := "[-][placed][" + caddyhttp.GetVar(r.Context(), varReplica).(string) + "][" + r.Header.Get(RankHeader) + "]"; got != want {
		t.Errorf("placeholders render %q, want %q", got, want)
	}
	if got := repl.ReplaceKnown("{http.vars.warden.in_flight}", ""); got != "" {
		t.Errorf("in_flight renders %q", got)
	}
	vars := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	for name, v := range vars {
		if s := caddy.ToString(v); strings.Contains(s, secret) {
			t.Errorf("var %s renders the session key: %q", name, s)
		}
	}
}

// A pool that lacks the chosen replica's address (reverse_proxy lists
// other upstreams than the warden model): no upstream, no panic, and one
// warning per address.
func TestSelectPoolWithoutTheReplica(t *testing.T) {
	fx := newSelectFixture(t, &ModelConfig{Replicas: []ReplicaConfig{{Address: addrA}}}, nil)
	for range 3 {
		if addr, _ := fx.selected(t, pool(addrB), "X-Claude-Code-Session-Id", "lost"); addr != "" {
			t.Fatalf("upstream %s from a pool without %s", addr, addrA)
		}
		if addr, _ := fx.selected(t, nil); addr != "" {
			t.Fatalf("upstream %s from an empty pool", addr)
		}
	}
	if total, by := fx.inFlight(); total != 0 {
		t.Errorf("%d in flight %v after requests that had no upstream", total, by)
	}
	warnings := fx.logs.FilterMessageSnippet("not an upstream of this reverse_proxy").All()
	if len(warnings) != 1 || warnings[0].ContextMap()["replica"] != addrA {
		t.Errorf("warnings %v, want one naming %s", warnings, addrA)
	}
}
