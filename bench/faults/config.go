package faults

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/lmwarden/caddy-warden/bench/e2e"
	"github.com/lmwarden/caddy-warden/internal/caddyproc"
)

// maxNumSeqs is the simulators' and warden's max_num_seqs.
const maxNumSeqs = 32

// retrySettings are the reverse_proxy retry options examples/Caddyfile.retries
// recommends, in real time; a run divides the durations by its time scale.
var retrySettings = struct {
	retries        int
	tryDuration    time.Duration
	tryInterval    time.Duration
	failDuration   time.Duration
	requestBuffers string // lets a POST that reached a dying replica be sent again
}{retries: 2, tryDuration: 5 * time.Second, tryInterval: 250 * time.Millisecond, failDuration: 10 * time.Second, requestBuffers: "4MB"}

// caddyConfig writes the run's Caddyfile.
type caddyConfig struct {
	admin    string
	site     string
	replicas []string
	scale    float64
	// global goes inside the global warden block (a pin store), site
	// inside the site block (the instance's name header).
	global string
	site2  string
}

// forInstance is the config of one instance of a cluster.
func (c caddyConfig) forInstance(cl *e2e.Cluster, inst *e2e.Instance) caddyConfig {
	c.admin, c.site, c.global, c.site2 = inst.Admin, inst.Site, cl.Global(), inst.SiteDirectives()
	return c
}

// outcomeHeader carries warden's routing outcome (sticky, spilled, ...) of
// each request back to the load, so that a spill, which leaves the pin in
// place, is not read as a lost pin.
const outcomeHeader = "X-Warden-Outcome"

// caddyfile is the config with a spill_threshold ("auto" or a number).
// Caddy's times are divided by the time scale, like the simulators', and so
// are warden's (e2e.ScaledModelFields, set in its JSON).
func (c caddyConfig) caddyfile(spill string) string {
	scaled := func(d time.Duration) string { return time.Duration(float64(d) / c.scale).String() }
	replicas := strings.Join(c.replicas, " ")
	return fmt.Sprintf(`{
	admin %s
	warden {
%s		model m {
			replicas %s
			max_num_seqs %d
			spill_threshold %s
		}
	}
}
http://%s {
%s	reverse_proxy %s {
		lb_policy warden m
		header_down %s {http.vars.warden.outcome}
		lb_retries %d
		lb_try_duration %s
		lb_try_interval %s
		fail_duration %s
		lb_retry_match {
			method POST
		}
		request_buffers %s
	}
}
`, c.admin, c.global, replicas, maxNumSeqs, spill,
		c.site, c.site2, replicas, outcomeHeader, retrySettings.retries, scaled(retrySettings.tryDuration), scaled(retrySettings.tryInterval),
		scaled(retrySettings.failDuration), retrySettings.requestBuffers)
}

// modelStatus is the part of warden's admin JSON (GET /warden/models/m)
// the run reads.
type modelStatus struct {
	Affinity       bool            `json:"affinity"`
	SpillThreshold int             `json:"spill_threshold"`
	SpillAuto      bool            `json:"spill_threshold_auto"`
	Requests       uint64          `json:"requests"`
	Since          time.Time       `json:"since"`
	Replicas       []replicaStatus `json:"replicas"`
	PinSnapshot    struct {
		Restored       int `json:"restored"`
		Dropped        int `json:"dropped"`
		AlreadyPinned  int `json:"dropped_already_pinned"`
		UnknownReplica int `json:"dropped_unknown_replica"`
	} `json:"pin_snapshot"`
}

type replicaStatus struct {
	ID        string `json:"id"`
	Address   string `json:"address"`
	Healthy   bool   `json:"healthy"`
	Placed    uint64 `json:"placed"`
	Replaced  uint64 `json:"replaced"`
	SpilledIn uint64 `json:"spilled_in"`
}

func (st modelStatus) replica(address string) (replicaStatus, bool) {
	for _, r := range st.Replicas {
		if r.Address == address {
			return r, true
		}
	}
	return replicaStatus{}, false
}

func (st modelStatus) spills() (n uint64) {
	for _, r := range st.Replicas {
		n += r.SpilledIn
	}
	return n
}

// adminSample is the admin JSON at a moment.
type adminSample struct {
	at time.Time
	st modelStatus
}

// adminWatch polls the admin JSON and checks that the counters continue:
// requests never decrease and since never changes.
type adminWatch struct {
	mu    sync.Mutex
	caddy *caddyproc.Process
	// restarting is set while Caddy restarts (samples are dropped), fresh
	// once it has: the next sample starts the counters afresh instead of
	// continuing them.
	restarting, fresh bool
	samples           []adminSample
	errors            []adminError
	violations        []adminError
}

// adminError is a failed poll or a broken counter, and when it happened.
type adminError struct {
	at  time.Time
	err string
}

func (a *adminWatch) run(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		a.poll()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// restart tells the watch that Caddy is about to restart: its counters
// start again from the next sample, read from the new process once started
// says so (it listens on the same admin address).
func (a *adminWatch) restart() {
	a.mu.Lock()
	a.restarting = true
	a.mu.Unlock()
}

func (a *adminWatch) started(p *caddyproc.Process) {
	a.mu.Lock()
	a.caddy, a.restarting, a.fresh = p, false, true
	a.mu.Unlock()
}

func (a *adminWatch) poll() {
	a.mu.Lock()
	caddy := a.caddy
	a.mu.Unlock()
	var st modelStatus
	err := caddy.Do(http.MethodGet, "/warden/models/m", nil, &st)
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.errors = append(a.errors, adminError{now, err.Error()})
		return
	}
	switch n := len(a.samples); {
	case a.restarting:
		return
	case a.fresh:
		a.fresh = false
	case n > 0:
		prev := a.samples[n-1].st
		if st.Requests < prev.Requests {
			a.violations = append(a.violations, adminError{now, fmt.Sprintf("admin JSON requests went back from %d to %d", prev.Requests, st.Requests)})
		}
		if !st.Since.Equal(prev.Since) {
			a.violations = append(a.violations, adminError{now, fmt.Sprintf("admin JSON since changed from %v to %v", prev.Since, st.Since)})
		}
	}
	a.samples = append(a.samples, adminSample{now, st})
}

// latest returns the last sample.
func (a *adminWatch) latest() (modelStatus, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.samples) == 0 {
		return modelStatus{}, false
	}
	return a.samples[len(a.samples)-1].st, true
}

// in returns the samples, poll errors and counter violations of a window.
func (a *adminWatch) in(w window) (samples []adminSample, errs, violations []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.samples {
		if w.contains(s.at) {
			samples = append(samples, s)
		}
	}
	for _, e := range a.errors {
		if w.contains(e.at) {
			errs = append(errs, e.err)
		}
	}
	for _, v := range a.violations {
		if w.contains(v.at) {
			violations = append(violations, v.err)
		}
	}
	return samples, errs, violations
}

// firstSample returns the time of the first sample of a window in which the
// replica's health was as wanted.
func firstSample(samples []adminSample, address string, healthy bool) (time.Time, bool) {
	for _, s := range samples {
		if r, ok := s.st.replica(address); ok && r.Healthy == healthy {
			return s.at, true
		}
	}
	return time.Time{}, false
}
