package metricsfeed

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/testrun"
)

// observation is one callback of a Poller.
type observation struct {
	target string
	health bool // an OnHealth call, else OnScrape
	scrape Scrape
	err    error
}

// recorder collects a Poller's callbacks.
type recorder struct {
	mu   sync.Mutex
	seen []observation
	ch   chan observation
}

func newRecorder() *recorder { return &recorder{ch: make(chan observation, 1000)} }

func (r *recorder) config(cfg PollerConfig) PollerConfig {
	cfg.OnScrape = func(target string, _ time.Time, s Scrape, err error) {
		r.record(observation{target: target, scrape: s, err: err})
	}
	cfg.OnHealth = func(target string, _ time.Time, err error) {
		r.record(observation{target: target, health: true, err: err})
	}
	return cfg
}

func (r *recorder) record(o observation) {
	r.mu.Lock()
	r.seen = append(r.seen, o)
	r.mu.Unlock()
	select {
	case r.ch <- o:
	default:
	}
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

func (r *recorder) since(n int) []observation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]observation(nil), r.seen[n:]...)
}

// await returns the first observation matching want, failing after 5 s.
func (r *recorder) await(t *testing.T, what string, want func(observation) bool) observation {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case o := <-r.ch:
			if want(o) {
				return o
			}
		case <-deadline:
			t.Fatalf("no %s within 5s", what)
		}
	}
}

// startPoller runs p until the test ends and returns a function that stops
// it and waits for Run to return.
func startPoller(t *testing.T, p *Poller) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Run did not return within 5s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func TestPollerReportsScrapesAndHealth(t *testing.T) {
	f := newFakeVLLM(t)
	f.running.Store(7)
	rec := newRecorder()
	p := NewPoller(rec.config(PollerConfig{Interval: 20 * time.Millisecond, Client: f.srv.Client()}), []string{f.srv.URL})
	startPoller(t, p)

	o := rec.await(t, "scrape", func(o observation) bool { return !o.health })
	if o.err != nil || o.target != f.srv.URL || o.scrape.Engines[0].Running != 7 {
		t.Fatalf("first scrape: %+v %v", o, o.err)
	}
	rec.await(t, "ok health", func(o observation) bool { return o.health && o.err == nil })

	f.healthStatus.Store(http.StatusServiceUnavailable)
	f.running.Store(9)
	o = rec.await(t, "503 health", func(o observation) bool { return o.health && o.err != nil })
	var status *StatusError
	if !errors.As(o.err, &status) || status.Code != 503 {
		t.Errorf("health error %v, want status 503", o.err)
	}
	rec.await(t, "new scrape", func(o observation) bool { return !o.health && o.err == nil && o.scrape.Engines[0].Running == 9 })

	st, ok := p.Status(f.srv.URL)
	if !ok || st.Err != nil || st.ScrapedAt.IsZero() || st.HealthErr == nil {
		t.Errorf("Status = %+v, %v; want a successful scrape and a failed health probe", st, ok)
	}
}

func TestPollerTimeoutKeepsLastGoodScrape(t *testing.T) {
	f := newFakeVLLM(t)
	rec := newRecorder()
	p := NewPoller(rec.config(PollerConfig{Interval: 50 * time.Millisecond, Timeout: 30 * time.Millisecond, Client: f.srv.Client()}), []string{f.srv.URL})
	startPoller(t, p)
	rec.await(t, "good scrape", func(o observation) bool { return !o.health && o.err == nil })

	f.metricsDelay.Store(int64(time.Second))
	o := rec.await(t, "timed-out scrape", func(o observation) bool { return !o.health && o.err != nil })
	if !errors.Is(o.err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want a deadline error", o.err)
	}
	st, _ := p.Status(f.srv.URL)
	if st.Err == nil || st.ScrapedAt.IsZero() || len(st.Scrape.Engines) != 1 || !st.AttemptAt.After(st.ScrapedAt) {
		t.Errorf("Status after a timeout = %+v; want the error and the last good scrape", st)
	}
}

func TestPollerReplacesTargets(t *testing.T) {
	a, b := newFakeVLLM(t), newFakeVLLM(t)
	rec := newRecorder()
	p := NewPoller(rec.config(PollerConfig{Interval: 20 * time.Millisecond}), []string{a.srv.URL})
	startPoller(t, p)
	rec.await(t, "scrape of A", func(o observation) bool { return o.target == a.srv.URL })

	p.SetTargets([]string{b.srv.URL, b.srv.URL})
	mark := rec.count()
	hitsOfA := a.metricsHits.Load()
	rec.await(t, "scrape of B", func(o observation) bool { return o.target == b.srv.URL && !o.health })
	// Several rounds of B pass before and after the mark.
	scrapesOfB := func(from int) func() bool {
		return func() bool {
			n := 0
			for _, o := range rec.since(from) {
				if o.target == b.srv.URL && !o.health {
					n++
				}
			}
			return n >= 5
		}
	}
	testrun.Eventually(t, 10*time.Second, "five scrapes of B", scrapesOfB(mark))
	settled := rec.count()
	testrun.Eventually(t, 10*time.Second, "five more scrapes of B", scrapesOfB(settled))

	// At most the round in flight during SetTargets reports A (a scrape and a
	// health probe); a live poller would have reported it about ten times.
	countA := func(obs []observation) (n int) {
		for _, o := range obs {
			if o.target == a.srv.URL {
				n++
			}
		}
		return n
	}
	if n := countA(rec.since(mark)); n > 2 {
		t.Errorf("%d callbacks for removed target A", n)
	}
	if n := countA(rec.since(settled)); n > 0 {
		t.Errorf("%d callbacks for removed target A long after its removal", n)
	}
	// A request cancelled by SetTargets may still reach A's handler.
	if extra := a.metricsHits.Load() - hitsOfA; extra > 1 {
		t.Errorf("A was polled %d more times after its removal", extra)
	}
	if _, ok := p.Status(a.srv.URL); ok {
		t.Error("Status of removed target A still kept")
	}
	if got := p.Targets(); len(got) != 1 || got[0] != b.srv.URL {
		t.Errorf("Targets() = %v, want [B] once", got)
	}
}

func TestPollerStopsCleanly(t *testing.T) {
	f := newFakeVLLM(t)
	f.metricsDelay.Store(int64(10 * time.Second)) // a poll is in flight when we stop
	transport := &http.Transport{}
	client := &http.Client{Transport: transport}
	baseline := runtime.NumGoroutine()

	rec := newRecorder()
	p := NewPoller(rec.config(PollerConfig{Interval: 20 * time.Millisecond, Timeout: 5 * time.Second, Client: client}), []string{f.srv.URL})
	stop := startPoller(t, p)
	testrun.Eventually(t, 10*time.Second, "a poll in flight", func() bool { return f.metricsHits.Load() > 0 })

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := p.Run(ctx); err != ErrRunning {
		t.Errorf("second Run = %v, want ErrRunning", err)
	}

	start := time.Now()
	stop()
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Errorf("Run took %v to return with a poll in flight", elapsed)
	}
	mark := rec.count()
	transport.CloseIdleConnections()
	testrun.Eventually(t, 3*time.Second, "the poller's goroutines gone", func() bool { return runtime.NumGoroutine() <= baseline })
	// Every goroutine that could call back has ended since Run returned.
	if extra := rec.since(mark); len(extra) > 0 {
		t.Errorf("callbacks after Run returned: %+v", extra)
	}
}

// A config reload may change the interval: the targets already polled
// follow it from their next poll on.
func TestPollerFollowsANewInterval(t *testing.T) {
	f := newFakeVLLM(t)
	rec := newRecorder()
	p := NewPoller(rec.config(PollerConfig{Interval: 200 * time.Millisecond, Client: f.srv.Client()}), []string{f.srv.URL})
	startPoller(t, p)
	rec.await(t, "first scrape", func(o observation) bool { return !o.health })
	p.SetInterval(10*time.Millisecond, 0)
	if got := p.Config(); got.Interval != 10*time.Millisecond || got.Timeout != 9*time.Millisecond {
		t.Errorf("interval %v, timeout %v; want 10ms and 9ms", got.Interval, got.Timeout)
	}
	rec.await(t, "second scrape", func(o observation) bool { return !o.health }) // up to 200 ms: the old interval's
	start := time.Now()
	for range 10 {
		rec.await(t, "scrape", func(o observation) bool { return !o.health })
	}
	if took := time.Since(start); took > time.Second { // 2 s at the old interval
		t.Errorf("10 scrapes at 10 ms took %v", took)
	}
}

// An attempt that ends far past its deadline was held up by this process
// (stalled on a starved machine: here its clock jumps an hour while the
// first scrape waits), not by the server: its timeout is not reported as
// the server's failure, and the next attempt decides.
func TestPollerDropsAnAttemptThatOutlivedItsDeadline(t *testing.T) {
	var jump atomic.Int64 // added to the clock once the stall began
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" && requests.Add(1) == 1 {
			jump.Store(int64(time.Hour))
			<-r.Context().Done() // the client's timeout ends it
			return
		}
		fmt.Fprintln(w, `vllm:num_requests_running{engine="0"} 1`)
	}))
	defer srv.Close()
	rec := newRecorder()
	cfg := rec.config(PollerConfig{Interval: 100 * time.Millisecond, Timeout: 50 * time.Millisecond, Client: srv.Client()})
	cfg.Now = func() time.Time { return time.Now().Add(time.Duration(jump.Load())) }
	startPoller(t, NewPoller(cfg, []string{srv.URL}))
	if o := rec.await(t, "a scrape", func(o observation) bool { return !o.health }); o.err != nil {
		t.Errorf("the stalled attempt was reported: %v", o.err)
	}
}

// A stall drops only the failures it caused: the scrape that answered in
// the same attempt is reported.
func TestPollerReportsTheAnswersOfAStalledAttempt(t *testing.T) {
	var jump atomic.Int64
	jumped := make(chan struct{})
	var probes, scrapes atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/health" && probes.Add(1) == 1:
			jump.Store(int64(time.Hour))
			close(jumped)
			<-r.Context().Done() // the client's timeout ends it
		case r.URL.Path == "/metrics":
			<-jumped // answered after the stall began
			fmt.Fprintf(w, "vllm:num_requests_running{engine=\"0\"} %d\n", scrapes.Add(1))
		}
	}))
	defer srv.Close()
	rec := newRecorder()
	cfg := rec.config(PollerConfig{Interval: 100 * time.Millisecond, Timeout: 50 * time.Millisecond, Client: srv.Client()})
	cfg.Now = func() time.Time { return time.Now().Add(time.Duration(jump.Load())) }
	startPoller(t, NewPoller(cfg, []string{srv.URL}))
	first := rec.await(t, "a report", func(observation) bool { return true })
	if first.health || first.err != nil || first.scrape.Engines[0].Running != 1 {
		t.Errorf("first report %+v (health %v): want the first attempt's scrape", first, first.health)
	}
	if o := rec.await(t, "a health report", func(o observation) bool { return o.health }); o.err != nil {
		t.Errorf("the stalled probe's timeout was reported: %v", o.err)
	}
}
