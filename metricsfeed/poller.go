package metricsfeed

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Poller defaults.
const (
	DefaultInterval = time.Second
	DefaultMaxBytes = 4 << 20
)

// PollerConfig configures a Poller. Zero values take the defaults.
type PollerConfig struct {
	// Interval between two polls of a target; default DefaultInterval.
	Interval time.Duration
	// Timeout of each /metrics and /health request; default 90% of Interval,
	// so that a slow server does not make rounds pile up.
	Timeout time.Duration
	// MaxBytes refuses larger /metrics bodies; default DefaultMaxBytes.
	MaxBytes int64
	// Client sends the requests; default http.DefaultClient.
	Client *http.Client

	// OnScrape, if set, is called after every /metrics attempt with the
	// parsed scrape or the error, and at = when the attempt finished. The
	// Poller keeps s: the callback must not modify it.
	OnScrape func(target string, at time.Time, s Scrape, err error)
	// OnHealth, if set, is called after every /health probe: err is nil for
	// status 200, a *StatusError for another status, or the transport error.
	OnHealth func(target string, at time.Time, err error)

	// Now reads the clock the reported times are taken on; default
	// time.Now.
	Now func() time.Time
}

// Status is what a Poller last learnt about one target.
type Status struct {
	Scrape    Scrape    // the last successful scrape
	ScrapedAt time.Time // when Scrape was taken; zero before the first success
	AttemptAt time.Time // when the last /metrics attempt finished
	Err       error     // error of the last /metrics attempt; nil if it succeeded
	HealthAt  time.Time // when the last /health probe finished
	HealthErr error     // error of the last /health probe; nil for status 200
}

// Poller polls /metrics and /health of a set of vLLM servers, each on its own
// goroutine so that one slow server never delays the others. Its methods are
// safe for concurrent use, including from the callbacks, which run on the
// polling goroutines.
type Poller struct {
	cfg PollerConfig

	mu      sync.Mutex
	targets []string
	workers map[string]*pollWorker
	status  map[string]*Status
	runCtx  context.Context // non-nil while Run is running
}

// pollWorker is the goroutine polling one target.
type pollWorker struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// ErrRunning is returned by Run when the Poller is already running.
var ErrRunning = errors.New("metricsfeed: poller already running")

// NewPoller returns a Poller for the given targets (see SetTargets).
func NewPoller(cfg PollerConfig, targets []string) *Poller {
	cfg.Interval, cfg.Timeout = pollTimes(cfg.Interval, cfg.Timeout)
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Poller{cfg: cfg, workers: map[string]*pollWorker{}, status: map[string]*Status{}}
	p.SetTargets(targets)
	return p
}

// pollTimes fills in the defaults of an interval and a timeout.
func pollTimes(interval, timeout time.Duration) (time.Duration, time.Duration) {
	if interval <= 0 {
		interval = DefaultInterval
	}
	if timeout <= 0 {
		timeout = interval * 9 / 10
	}
	return interval, timeout
}

// Config returns the configuration with its defaults filled in.
func (p *Poller) Config() PollerConfig {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg
}

// SetInterval changes the interval between polls, and the timeout (0: 90%
// of the interval), e.g. on a config reload; each target's next poll comes
// one new interval after its last began.
func (p *Poller) SetInterval(interval, timeout time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg.Interval, p.cfg.Timeout = pollTimes(interval, timeout)
}

// times is the interval and timeout in force.
func (p *Poller) times() (interval, timeout time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg.Interval, p.cfg.Timeout
}

// Run polls every target until ctx ends, then stops every polling goroutine
// and returns nil. Targets can change while it runs.
func (p *Poller) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.runCtx != nil {
		p.mu.Unlock()
		return ErrRunning
	}
	p.runCtx = ctx
	for _, target := range p.targets {
		p.startLocked(target)
	}
	p.mu.Unlock()

	<-ctx.Done()

	p.mu.Lock()
	p.runCtx = nil
	workers := p.workers
	p.workers = map[string]*pollWorker{}
	p.mu.Unlock()
	for _, w := range workers {
		w.cancel()
		<-w.done
	}
	return nil
}

// SetTargets replaces the polled targets, e.g. on a config reload. A target
// is a base URL ("http://127.0.0.1:8001") or a bare "host:port". Targets kept
// from the previous set keep their goroutine and Status; removed ones are
// stopped and forgotten. SetTargets does not wait for their goroutines, so it
// may be called with locks held that the callbacks take; a callback already
// past its last check may still report a removed target once, which callers
// should ignore.
func (p *Poller) SetTargets(targets []string) {
	targets = dedupe(targets)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.targets = targets
	for target, w := range p.workers {
		if !slices.Contains(targets, target) {
			w.cancel()
			delete(p.workers, target)
		}
	}
	for target := range p.status {
		if !slices.Contains(targets, target) {
			delete(p.status, target)
		}
	}
	if p.runCtx != nil {
		for _, target := range targets {
			if p.workers[target] == nil {
				p.startLocked(target)
			}
		}
	}
}

// Targets returns the current targets.
func (p *Poller) Targets() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.targets)
}

// Status returns what was last learnt about a target; false if the target is
// not polled or no attempt has finished yet.
func (p *Poller) Status(target string) (Status, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.status[target]
	if st == nil {
		return Status{}, false
	}
	copied := *st
	copied.Scrape.Engines = slices.Clone(st.Scrape.Engines)
	return copied, true
}

// MetricsURL is the /metrics URL of a target.
func MetricsURL(target string) string { return baseURL(target) + "/metrics" }

// HealthURL is the /health URL of a target.
func HealthURL(target string) string { return baseURL(target) + "/health" }

func baseURL(target string) string {
	target = strings.TrimRight(target, "/")
	if !strings.Contains(target, "://") {
		target = "http://" + target
	}
	return target
}

// stalled reports whether a request that began and ended then, bounded by
// timeout, ended far past its own deadline: this process was stalled (a
// starved machine) while it ran, and its failure says nothing of the
// server (its timeout fired late, or the answer waited to be read). Such a
// failure is not reported; the next attempt, due at once, decides. An
// answer is always reported.
func stalled(began, ended time.Time, timeout time.Duration) bool {
	return ended.Sub(began) > 2*timeout
}

func dedupe(targets []string) []string {
	unique := make([]string, 0, len(targets))
	for _, t := range targets {
		if !slices.Contains(unique, t) {
			unique = append(unique, t)
		}
	}
	return unique
}

func (p *Poller) startLocked(target string) {
	ctx, cancel := context.WithCancel(p.runCtx)
	w := &pollWorker{cancel: cancel, done: make(chan struct{})}
	p.workers[target] = w
	go p.pollLoop(ctx, target, w)
}

func (p *Poller) pollLoop(ctx context.Context, target string, w *pollWorker) {
	defer close(w.done)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		began := time.Now()
		p.pollOnce(ctx, target, w)
		interval, _ := p.times()
		timer.Reset(time.Until(began.Add(interval)))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
	}
}

// pollOnce fetches /metrics and probes /health concurrently, then records
// and reports both.
func (p *Poller) pollOnce(ctx context.Context, target string, w *pollWorker) {
	_, timeout := p.times()
	reqCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	began := p.cfg.Now()
	var healthErr error
	var healthAt time.Time
	healthDone := make(chan struct{})
	go func() {
		defer close(healthDone)
		healthErr = ProbeHealth(reqCtx, p.cfg.Client, HealthURL(target))
		healthAt = p.cfg.Now()
	}()
	scrape, err := Fetch(reqCtx, p.cfg.Client, MetricsURL(target), p.cfg.MaxBytes)
	scrapedAt := p.cfg.Now()
	<-healthDone

	if ctx.Err() != nil {
		return // stopped: the errors are our own cancellation, not the server's
	}
	reportScrape := err == nil || !stalled(began, scrapedAt, timeout)
	reportHealth := healthErr == nil || !stalled(began, healthAt, timeout)
	p.mu.Lock()
	if p.workers[target] != w {
		p.mu.Unlock()
		return
	}
	st := p.status[target]
	if st == nil {
		st = &Status{}
		p.status[target] = st
	}
	if reportScrape {
		st.AttemptAt, st.Err = scrapedAt, err
		if err == nil {
			st.Scrape, st.ScrapedAt = scrape, scrapedAt
		}
	}
	if reportHealth {
		st.HealthAt, st.HealthErr = healthAt, healthErr
	}
	p.mu.Unlock()

	if reportScrape && p.cfg.OnScrape != nil {
		p.cfg.OnScrape(target, scrapedAt, scrape, err)
	}
	if reportHealth && p.cfg.OnHealth != nil {
		p.cfg.OnHealth(target, healthAt, healthErr)
	}
}
