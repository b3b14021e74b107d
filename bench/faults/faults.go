// Package faults runs warden through the faults a trusted proxy must
// survive, under steady agent load on simulated replicas, and measures
// them: config reloads and runtime toggles, a replica killed and restarted,
// /metrics that is slow, garbage, huge, missing, NaN or negative, and
// /health failing while /metrics answers. For each it counts the requests
// sent and failed, the conversations whose pin was lost, and how long the
// replica took to take new conversations again (issue 6).
//
// Clients: closed-loop agentload sessions for realistic load, probe
// conversations that send a short turn every metrics interval (their pins
// are followed through every fault, and a failed turn is sent again, as an
// agent would), and a new one-turn conversation every interval (which
// shows where new conversations go).
package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/e2e"
	"github.com/lmwarden/caddy-warden/internal/caddyproc"
)

// Options of a fault run.
type Options struct {
	// Replicas is the number of simulated vLLM servers (default 3).
	Replicas int
	// Sessions is the number of closed-loop agent sessions (default 4).
	Sessions int
	// Probes is the number of probe conversations (default 6).
	Probes int
	// TimeScale is how much faster than real time the simulators run; every
	// time in warden's and Caddy's config is divided by it (default 10).
	TimeScale float64
	// Seed drives the workload and the simulators (default 1).
	Seed uint64
	// Short holds each fault for fewer intervals and skips three of the six
	// /metrics faults, so that a run fits in a test; it reports, without
	// holding them to a bound, how long requests took.
	Short bool
	// Instances is how many identically configured Caddy instances route
	// (default 1); with more, a front Caddy sends each request to one at
	// random, retrying another when it is down, and the run goes through
	// the cluster's faults (an instance killed, Redis killed) instead of
	// the replicas'. PinStore is what they share: e2e.PinStoreNone (or
	// empty) or e2e.PinStoreRedis (a private redis-server).
	Instances int
	PinStore  string
	// RedisOutage is how long (wall time) Redis stays down in the Redis
	// fault (default 10 s).
	RedisOutage time.Duration
	// CaddyBin and SimBin are prebuilt binaries of cmd/caddy and
	// bench/cmd/vllmsim; empty builds them into WorkDir.
	CaddyBin string
	SimBin   string
	// WorkDir receives the binaries; empty uses a temporary directory.
	WorkDir string
	// Log receives Caddy's and the simulators' output; nil discards it.
	Log io.Writer
	// Progress, if set, is told about each phase as it starts.
	Progress func(phase string)
}

func (o Options) withDefaults() Options {
	if o.Replicas == 0 {
		o.Replicas = 3
	}
	if o.Sessions == 0 {
		o.Sessions = 4
	}
	if o.Instances == 0 {
		o.Instances = 1
	}
	if o.PinStore == "" {
		o.PinStore = e2e.PinStoreNone
	}
	if o.Probes == 0 {
		o.Probes = 6
		if o.Instances > 1 {
			o.Probes = 12 // each instance sees a third of a conversation's turns
		}
	}
	if o.RedisOutage == 0 {
		o.RedisOutage = 10 * time.Second
	}
	if o.TimeScale == 0 {
		o.TimeScale = 10
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	return o
}

func (o Options) check() error {
	switch {
	case o.Replicas < 2:
		return errors.New("faults: at least 2 replicas, so that a failed one has somewhere to send its conversations")
	case o.Sessions < 1 || o.Probes < 1:
		return errors.New("faults: sessions and probes must be positive")
	case o.Instances < 1 || (o.PinStore != e2e.PinStoreNone && o.PinStore != e2e.PinStoreRedis):
		return errors.New("faults: at least one instance, and pin store none or redis")
	case o.TimeScale <= 0 || o.TimeScale > 50:
		return errors.New("faults: time scale must be in (0, 50]: faster, the host's scheduling noise is larger than an interval")
	}
	return nil
}

// metricsInterval is warden's metrics interval in wall time.
func (o Options) metricsInterval() time.Duration { return o.scaled(time.Second) }

// scaled turns a real-time duration into the run's wall time.
func (o Options) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) / o.TimeScale)
}

// holdIntervals is how many metrics intervals a fault lasts.
func (o Options) holdIntervals() int {
	if o.Short {
		return 8
	}
	return 20
}

// Run starts the simulated replicas and Caddy, puts them under load, goes
// through every fault and returns the table. The table's Violations say
// which expectations were missed; an error means the run itself could not
// be carried out.
func Run(ctx context.Context, o Options) (Table, error) {
	o = o.withDefaults()
	table := Table{Options: o, MetricsInterval: o.metricsInterval()}
	if err := o.check(); err != nil {
		return table, err
	}
	h, err := start(ctx, o)
	if err != nil {
		return table, err
	}
	defer h.close()

	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	gen, err := agentload.NewGenerator(h.workload)
	if err != nil {
		return table, err
	}
	h.load.start(loadCtx, gen, o.Sessions, o.Probes)
	defer h.load.wait()
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go h.admin.run(watchCtx, h.interval/2)

	if err := h.warmUp(ctx); err != nil {
		return table, err
	}
	for _, phase := range h.phases() {
		row, err := phase(ctx)
		if err != nil {
			return table, err
		}
		table.Rows = append(table.Rows, row)
	}
	stopLoad()
	h.load.wait()
	if err := h.caddy.Do(http.MethodGet, "/warden/models/m", nil, nil); err != nil {
		return table, fmt.Errorf("caddy after the run: %v", err)
	}
	return table, nil
}

// phases lists the faults of the run. One Caddy goes through reloads, a
// killed replica, the /metrics and /health faults, then a graceful restart;
// several go through an instance killed; with Redis, Redis is killed first.
func (h *harness) phases() []func(context.Context) (Row, error) {
	var phases []func(context.Context) (Row, error)
	if h.o.PinStore == e2e.PinStoreRedis {
		phases = append(phases, h.redisOutage)
	}
	if h.o.Instances > 1 {
		return append(phases, h.instanceKill)
	}
	// Each replica fault takes the next replica, so that every replica holds
	// conversations whose pins are at stake.
	phases = append(phases, h.reloads, h.kill)
	faults := h.o.metricsFaults()
	for i, fault := range faults {
		phases = append(phases, func(ctx context.Context) (Row, error) { return h.metricsFault(ctx, fault, i%h.o.Replicas) })
	}
	phases = append(phases, func(ctx context.Context) (Row, error) { return h.healthFault(ctx, len(faults)%h.o.Replicas) })
	return append(phases, h.gracefulRestart)
}

// harness is a running fleet: simulators, Caddy and the load.
type harness struct {
	o        Options
	interval time.Duration
	workload agentload.Config
	sims     []*e2e.Sim
	// cluster is the Caddy side; caddy is its first instance, which the
	// admin watch polls and the reload phase reloads, and config that
	// instance's.
	cluster *e2e.Cluster
	caddy   *caddyproc.Process
	config  caddyConfig
	logs    *logWatch
	admin   *adminWatch
	load    *load
	tmpDir  string // removed at close, when Run made it
	// affinityOff are the spans during which affinity was off: requests
	// then are placed by load and say nothing of their conversation's pin.
	affinityOff []window
	// restarts are the replicas killed and restarted so far.
	restarts []restart
}

// pinRules are the expected moves of the phase whose fault is given.
func (h *harness) pinRules(fault pinFault) pinRules {
	return pinRules{fault: fault, affinityOff: h.affinityOff, restarts: h.restarts}
}

func start(ctx context.Context, o Options) (*harness, error) {
	h := &harness{o: o, interval: o.metricsInterval(), workload: agentload.DefaultConfig()}
	h.workload.Seed = int64(o.Seed)
	if err := h.binaries(ctx); err != nil {
		h.close()
		return nil, err
	}
	var err error
	h.sims, err = e2e.StartSims(ctx, h.o.SimBin, e2e.Options{
		Topology: e2e.TopologyServers, Replicas: o.Replicas, MaxNumSeqs: maxNumSeqs,
		TimeScale: o.TimeScale, Seed: o.Seed, Log: o.Log,
	})
	if err != nil {
		h.close()
		return nil, err
	}
	h.config = caddyConfig{scale: o.TimeScale}
	for _, s := range h.sims {
		h.config.replicas = append(h.config.replicas, s.Addr)
	}
	h.logs = newLogWatch(o.Log)
	// Warden's health lines are read from one Caddy's log; several write
	// their output straight to o.Log.
	var caddyLog io.Writer = h.logs
	if o.Instances > 1 {
		caddyLog = o.Log
	}
	if err := h.tempDir(); err != nil {
		h.close()
		return nil, err
	}
	h.cluster, err = e2e.StartCluster(ctx, e2e.ClusterOptions{
		Instances: o.Instances, PinStore: o.PinStore, Bin: h.o.CaddyBin, DataDir: h.tmpDir, Log: caddyLog,
		ModelFields: e2e.ScaledModelFields(o.TimeScale),
		Front: e2e.FrontSettings{
			TryDuration:  o.scaled(retrySettings.tryDuration),
			TryInterval:  o.scaled(retrySettings.tryInterval),
			FailDuration: o.scaled(retrySettings.failDuration),
		},
	}, func(c *e2e.Cluster, inst *e2e.Instance) string {
		return h.config.forInstance(c, inst).caddyfile("auto")
	})
	if err != nil {
		h.close()
		return nil, err
	}
	h.caddy = h.cluster.Instances[0].Proc
	h.config = h.config.forInstance(h.cluster, h.cluster.Instances[0])
	site := h.cluster.Site
	h.admin = &adminWatch{caddy: h.caddy}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.Proxy = nil
	transport.MaxIdleConnsPerHost = 4 * (o.Sessions + o.Probes)
	retry := &keptAliveRetry{base: transport, backoff: o.scaled(sdkRetryBackoff)}
	h.load = &load{
		base:     "http://" + site,
		model:    h.workload.Model,
		header:   h.workload.SessionHeader,
		interval: h.interval,
		client:   &http.Client{Transport: retry, Timeout: time.Minute},
		retry:    retry,
		rec:      &recorder{},
	}
	return h, nil
}

// tempDir makes the run's temporary directory (Caddy's storage, the
// binaries without a WorkDir), removed at close.
func (h *harness) tempDir() error {
	if h.tmpDir != "" {
		return nil
	}
	dir, err := os.MkdirTemp(h.o.WorkDir, "warden-faults-")
	h.tmpDir = dir
	return err
}

// binaries builds whichever binary was not given.
func (h *harness) binaries(ctx context.Context) error {
	if h.o.CaddyBin != "" && h.o.SimBin != "" {
		return nil
	}
	dir := h.o.WorkDir
	if dir == "" {
		if err := h.tempDir(); err != nil {
			return err
		}
		dir = h.tmpDir
	}
	caddyBin, simBin, err := e2e.BuildBinaries(ctx, dir)
	if err != nil {
		return err
	}
	h.o.CaddyBin, h.o.SimBin = caddyBin, simBin
	return nil
}

func (h *harness) close() {
	h.cluster.Stop()
	e2e.StopSims(h.sims)
	if h.tmpDir != "" {
		os.RemoveAll(h.tmpDir)
	}
}

func (h *harness) progress(format string, args ...any) {
	if h.o.Progress != nil {
		h.o.Progress(fmt.Sprintf(format, args...))
	}
}

// warmUp waits until every replica is healthy in warden and every probe
// conversation has been served, then lets the load settle.
func (h *harness) warmUp(ctx context.Context) error {
	h.progress("warm-up")
	err := h.until(ctx, 60*time.Second, "every replica healthy and every probe served", func() bool {
		st, ok := h.admin.latest()
		if !ok || len(st.Replicas) != h.o.Replicas {
			return false
		}
		for _, r := range st.Replicas {
			if !r.Healthy {
				return false
			}
		}
		served := map[string]bool{}
		for _, r := range h.load.rec.snapshot() {
			if r.origin == fromProbe && r.ok {
				served[r.conv] = true
			}
		}
		return len(served) == h.o.Probes
	})
	if err != nil {
		return err
	}
	sleep(ctx, 10*h.interval)
	return ctx.Err()
}

// until polls cond every few milliseconds until it holds, within limit.
func (h *harness) until(ctx context.Context, limit time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("faults: timed out after %v waiting for %s", limit, what)
		}
		sleep(ctx, 5*time.Millisecond)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// server is the simulator ID ("r1") of replica i, as its engine header names it.
func server(i int) string { return fmt.Sprintf("r%d", i) }

// setSimFaults posts fault switches to a simulator's /sim/faults; nil
// clears them all.
func (h *harness) setSimFaults(ctx context.Context, i int, switches map[string]any) error {
	method, body := http.MethodDelete, []byte(nil)
	if switches != nil {
		method = http.MethodPost
		var err error
		if body, err = json.Marshal(switches); err != nil {
			return err
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+h.sims[i].Addr+"/sim/faults", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("faults: setting %s's fault switches: %v", server(i), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("faults: %s refused fault switches %s: %s", server(i), body, msg)
	}
	return nil
}
