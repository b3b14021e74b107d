// Package e2e runs the seed's experiment for real: simulated vLLM servers
// (bench/cmd/vllmsim) behind Caddy built from the root module's cmd/caddy,
// loaded by the agent workload over HTTP, one routing policy after another
// without restarting the replicas, as the seed switched affinity off and on.
package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/lab"
	"github.com/lmwarden/caddy-warden/bench/report"
	"github.com/lmwarden/caddy-warden/internal/caddyproc"
	"github.com/lmwarden/caddy-warden/loadcontrol"
	"github.com/lmwarden/caddy-warden/metricsfeed"
)

// Topologies.
const (
	TopologyServers = "servers" // one vllmsim per replica
	TopologyRanks   = "ranks"   // one vllmsim with --data-parallel-size
)

// Options of a run. Durations are simulated time: the simulator runs
// TimeScale times faster than the wall clock, and every client-side time is
// scaled back, so the figures read as on the real machine.
type Options struct {
	Topology   string
	Replicas   int
	MaxNumSeqs int
	Sessions   []int
	// Warmup runs the load before each measured Duration, so that sessions
	// are staggered as in a steady state.
	Warmup    time.Duration
	Duration  time.Duration
	TimeScale float64
	// BlockSize is the simulated engines' KV block size, for the hit bound.
	BlockSize int
	Policies  []string
	Seed      uint64
	Workload  agentload.Config
	// Fresh restarts the replicas before each policy's series; by default
	// they keep their caches, as in the seed's run.
	Fresh bool
	// Instances is how many identically configured Caddy instances route
	// (0 or 1: one, as before); with more, a front Caddy sends each request
	// to one of them at random. PinStore is what they share: PinStoreNone
	// (or empty) or PinStoreRedis.
	Instances int
	PinStore  string
	// CompactionInterval is warden's compaction_interval in simulated time
	// (divided by the time scale like its other times); 0 leaves the
	// product's default, one minute.
	CompactionInterval time.Duration
	// SimArgs are extra vllmsim flags (profile overrides).
	SimArgs []string
	// WorkDir receives the binaries and the admin JSON snapshots.
	WorkDir string
	// Log receives the children's output; nil discards it.
	Log io.Writer
	// Progress, when set, is told about each level as it starts and ends.
	Progress func(policy string, sessions int, done bool)
}

// Policies a run can compare, by topology. In ranks mode "off" and "vllm"
// both leave the engine to vLLM's balancer (off through warden, which then
// sets no rank; vllm without warden). The variants of warden (wardenVariants)
// apply to both and are not run by default.
var policiesFor = map[string][]string{
	TopologyServers: {"warden", "off", "header", "least_conn", "round_robin"},
	TopologyRanks:   {"warden", "off", "vllm"},
}

// wardenVariants are warden with one model option changed, by policy name:
// "warden-nosubagents" pins a session's sub-agents with the session (one
// pin per session, as before sub-agents were told apart),
// "warden-compaction" places a conversation anew after a compaction hint
// (off by default: a compacted conversation keeps its pin),
// "warden-nofingerprint" keys no header-less conversation,
// "warden-admission" turns load control on, "warden-admission-farm" with
// the farm preset (lab.PolicyAdmissionFarm), their times scaled like the
// replicas', "warden-events" following the replicas' KV cache events
// (lab.PolicyWardenEvents). Every warden runs behind warden_stop_reason,
// which load control reads the replies' ends with.
var wardenVariants = map[string]func(scaled func(time.Duration) string) variant{
	"warden-nosubagents":   fields(map[string]any{"subagents": false}),
	"warden-compaction":    fields(map[string]any{"compaction": true}),
	"warden-nofingerprint": line("fingerprint off"),
	"warden-admission": func(scaled func(time.Duration) string) variant {
		return variant{line: "load_control on", fields: loadControlTimes(scaled)}
	},
	"warden-admission-farm": func(scaled func(time.Duration) string) variant {
		times := loadControlTimes(scaled)
		times["load_control.stagger"] = scaled(lab.FarmStagger)
		return variant{line: "load_control farm", fields: times}
	},
	lab.PolicyWardenEvents: line(""), // its replicas' lines follow their KV cache events
}

// variant is what a variant adds to model m: a Caddyfile line, and JSON
// fields a Caddyfile does not offer.
type variant struct {
	line   string
	fields map[string]any
}

// loadControlTimes are load control's times, scaled.
func loadControlTimes(scaled func(time.Duration) string) map[string]any {
	return map[string]any{
		"load_control.linger":   scaled(loadcontrol.DefaultLinger),
		"load_control.max_wait": scaled(loadcontrol.DefaultWait),
	}
}

func line(option string) func(func(time.Duration) string) variant {
	return func(func(time.Duration) string) variant { return variant{line: option} }
}

func fields(f map[string]any) func(func(time.Duration) string) variant {
	return func(func(time.Duration) string) variant { return variant{fields: f} }
}

// DefaultPolicies are the policies a topology compares.
func DefaultPolicies(topology string) []string {
	return slices.Clone(policiesFor[topology])
}

// Policies lists every policy a topology accepts: its defaults, then
// warden's variants.
func Policies(topology string) []string {
	out := DefaultPolicies(topology)
	if len(out) == 0 {
		return nil
	}
	return append(out, slices.Sorted(maps.Keys(wardenVariants))...)
}

func (o *Options) check() error {
	allowed := Policies(o.Topology)
	if allowed == nil {
		return fmt.Errorf("unknown topology %q: servers or ranks", o.Topology)
	}
	for _, p := range o.Policies {
		if !slices.Contains(allowed, p) {
			return fmt.Errorf("policy %q does not apply to topology %s (possible: %s)", p, o.Topology, strings.Join(allowed, ", "))
		}
	}
	if err := (ClusterOptions{Instances: o.instances(), PinStore: o.PinStore}).check(); err != nil {
		return err
	}
	if o.Replicas < 1 || o.TimeScale <= 0 || o.Duration <= 0 || o.Warmup < 0 || o.BlockSize < 1 || len(o.Sessions) == 0 || o.CompactionInterval < 0 {
		return errors.New("replicas, time scale, duration, block size and sessions must be positive, warm-up and compaction interval not negative")
	}
	return o.Workload.Validate()
}

func (o Options) instances() int { return max(o.Instances, 1) }

func (o Options) pinStore() string {
	if o.PinStore == "" {
		return PinStoreNone
	}
	return o.PinStore
}

// Run measures every policy at every level and returns one row each.
func Run(ctx context.Context, o Options) ([]report.Row, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	dir, err := o.mkWorkDir()
	if err != nil {
		return nil, err
	}
	caddyBin, simBin, err := BuildBinaries(ctx, dir)
	if err != nil {
		return nil, err
	}
	// Each run's instances get fresh storage: a pin snapshot left by an
	// earlier run in the same work directory must not place this one's
	// conversations.
	storage, err := os.MkdirTemp(dir, "storage-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(storage)
	var rows []report.Row
	var sims []*Sim

	defer func() { StopSims(sims) }()
	var cluster *Cluster
	defer func() { cluster.Stop() }()
	for i, policy := range o.Policies {
		// Each policy gets its own Caddy: warden keeps its sessions across
		// a reload, and the levels' conversations carry the same IDs under
		// every policy, so a reloaded Caddy would meet the next policy's
		// conversations as the last one's returning, long after their turns.
		cluster.Stop()
		cluster = nil
		if sims == nil || (o.Fresh && i > 0) {
			StopSims(sims)
			if sims, err = StartSims(ctx, simBin, o); err != nil {
				return rows, err
			}
		}
		config := func(c *Cluster, inst *Instance) string { return caddyfile(o, policy, sims, c, inst) }
		co := ClusterOptions{Instances: o.instances(), PinStore: o.PinStore, Bin: caddyBin, Log: o.Log, ModelFields: modelFields(o, policy)}
		if co.DataDir, err = os.MkdirTemp(storage, "fleet-"); err != nil {
			return rows, err
		}
		if cluster, err = StartCluster(ctx, co, config); err != nil {
			return rows, err
		}
		if usesWarden(policy) {
			if err := cluster.Do(http.MethodPost, "/warden/models/m/affinity", map[string]bool{"enabled": policy != "off"}); err != nil {
				return rows, err
			}
		}
		for _, n := range o.Sessions {
			if o.Progress != nil {
				o.Progress(policy, n, false)
			}
			row, err := runLevel(ctx, o, policy, n, "http://"+cluster.Site, sims)
			if err != nil {
				return rows, fmt.Errorf("%s at %d sessions: %v", policy, n, err)
			}
			rows = append(rows, row)
			if usesWarden(policy) {
				for _, inst := range cluster.Instances {
					name := fmt.Sprintf("admin-%s-%d.json", policy, n)
					if len(cluster.Instances) > 1 {
						name = fmt.Sprintf("admin-%s-x%d-%s-%d-%s.json", policy, o.instances(), o.pinStore(), n, inst.Name)
					}
					if err := saveAdminJSON(inst.Proc, filepath.Join(dir, name)); err != nil {
						return rows, err
					}
				}
			}
			if o.Progress != nil {
				o.Progress(policy, n, true)
			}
		}
	}
	return rows, nil
}

func usesWarden(policy string) bool {
	_, variant := wardenVariants[policy]
	return policy == "warden" || policy == "off" || variant
}

// caddyfile is an instance's Caddyfile for a policy; modelFields are the
// JSON fields of its model that a Caddyfile does not offer.
func caddyfile(o Options, policy string, sims []*Sim, c *Cluster, inst *Instance) string {
	var upstreams []string
	for _, s := range sims {
		upstreams = append(upstreams, s.Addr)
	}
	model := "replicas " + strings.Join(upstreams, " ")
	switch {
	case o.Topology == TopologyRanks && policy == lab.PolicyWardenEvents:
		model = fmt.Sprintf("server %s ranks %d {\n\t\t\t\tkv_events %s %s\n\t\t\t}", upstreams[0], o.Replicas, sims[0].KVEvents, kvEventsTopic)
	case o.Topology == TopologyRanks:
		model = fmt.Sprintf("server %s ranks %d", upstreams[0], o.Replicas)
	case policy == lab.PolicyWardenEvents:
		var lines []string
		for _, s := range sims {
			lines = append(lines, fmt.Sprintf("replica %s {\n\t\t\t\tkv_events %s %s\n\t\t\t}", s.Addr, s.KVEvents, kvEventsTopic))
		}
		model = strings.Join(lines, "\n\t\t\t")
	}
	options := ""
	if v := wardenVariants[policy]; v != nil && v(o.scaled).line != "" {
		options = "\t\t\t" + v(o.scaled).line + "\n"
	}
	global := fmt.Sprintf(`	warden {
%s		model m {
			%s
			max_num_seqs %d
%s		}
	}
`, c.Global(), model, o.MaxNumSeqs, options)
	lbPolicy, site := policy, inst.SiteDirectives()
	if usesWarden(policy) {
		lbPolicy = "warden"
		site += "\twarden_stop_reason\n"
	}
	lb := map[string]string{
		"warden":      "lb_policy warden m",
		"off":         "lb_policy warden m",
		"header":      "lb_policy header " + o.Workload.SessionHeader,
		"least_conn":  "lb_policy least_conn",
		"round_robin": "lb_policy round_robin",
		"vllm":        "", // one upstream: vLLM's own balancer picks the engine
	}[lbPolicy]
	return fmt.Sprintf(`{
	admin %s
	default_bind 127.0.0.1
	log {
		level ERROR
	}
%s}
http://%s {
%s	reverse_proxy %s {
		%s
	}
}
`, inst.Admin, global, inst.Site, site, strings.Join(upstreams, " "), lb)
}

// modelFields are model m's JSON fields for a policy: warden's times
// divided by the time scale like the replicas' (ScaledModelFields, and the
// compaction interval), and the variant's own.
func modelFields(o Options, policy string) map[string]any {
	if !usesWarden(policy) {
		return nil
	}
	out := ScaledModelFields(o.TimeScale)
	out["compaction_interval"] = o.scaled(cmp.Or(o.CompactionInterval, time.Minute))
	if v := wardenVariants[policy]; v != nil {
		maps.Copy(out, v(o.scaled).fields)
	}
	return out
}

// ScaledModelFields are warden's times in a run whose simulated time runs
// scale times faster than the wall clock: how often replicas are polled,
// how long a conversation counts as load and is remembered, divided by the
// scale like the replicas' own times.
func ScaledModelFields(scale float64) map[string]any {
	scaled := func(d time.Duration) string { return time.Duration(float64(d) / scale).String() }
	return map[string]any{
		"metrics_interval": scaled(time.Second),
		"active_window":    scaled(2 * time.Minute),
		"session_ttl":      scaled(30 * time.Minute),
	}
}

// scaled writes a simulated duration in wall time.
func (o Options) scaled(d time.Duration) string {
	return time.Duration(float64(d) / o.TimeScale).String()
}

// saveAdminJSON keeps the model's panel as it stood after a level.
func saveAdminJSON(caddy *caddyproc.Process, path string) error {
	var panel json.RawMessage
	if err := caddy.Do(http.MethodGet, "/warden/models/m", nil, &panel); err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, panel, "", "  "); err != nil {
		return err
	}
	return os.WriteFile(path, out.Bytes(), 0o644)
}

// runLevel runs one level, warm-up first, and measures it.
func runLevel(ctx context.Context, o Options, policy string, sessions int, base string, sims []*Sim) (report.Row, error) {
	wall := func(d time.Duration) time.Duration { return time.Duration(float64(d) / o.TimeScale) }
	workload := o.Workload
	workload.Seed = agentload.LevelSeed(o.Workload.Seed, sessions)
	workload.ThinkTime = wall(workload.ThinkTime) // the pauses pass in simulated time too
	gen, err := agentload.NewGenerator(workload)
	if err != nil {
		return report.Row{}, err
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.Proxy = nil // loopback only
	transport.MaxIdleConnsPerHost = sessions
	defer transport.CloseIdleConnections()
	// The bound is the level's own: the best hit rate on its request stream
	// from a cold cache (each level draws its own sessions).
	bound := newBoundRecorder(o.Workload.SessionHeader, o.BlockSize)
	bound.measureFrom(time.Now().Add(time.Hour)) // nothing counts during the warm-up
	runner := &agentload.Runner{
		Generator: gen, BaseURL: base, Sessions: sessions, Duration: wall(o.Warmup + o.Duration),
		Client: &http.Client{Transport: bound.through(transport)}, OnResult: bound.onResult,
	}

	// The measured window opens after the warm-up: counters, busy samples
	// and the hit bound start there.
	var before []metricsfeed.Scrape
	var measureErr error
	sampler := newBusySampler(sims, wall(time.Second))
	samplerCtx, stopSampler := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-samplerCtx.Done():
			return
		case <-time.After(wall(o.Warmup)):
		}
		bound.measureFrom(time.Now())
		before, measureErr = ScrapeAll(ctx, sims)
		sampler.run(samplerCtx)
	})
	rep, err := runner.Run(ctx)
	stopSampler()
	wg.Wait()
	if err == nil {
		err = measureErr
	}
	if err != nil {
		return report.Row{}, err
	}
	if before == nil {
		return report.Row{}, errors.New("the level ended before its warm-up did")
	}
	after, err := ScrapeAll(ctx, sims)
	if err != nil {
		return report.Row{}, err
	}
	sum := agentload.Summarize(rep.Results, rep.Start.Add(wall(o.Warmup)), rep.End)
	place := Place(rep.Results, rep.Start.Add(wall(o.Warmup)), rep.End, o.engines())
	d := counterDeltas(before, after)
	row := report.Row{
		Mode:            report.ModeRun,
		Policy:          policy,
		Sessions:        sessions,
		Seed:            int64(o.Seed),
		DurationS:       o.Duration.Seconds(),
		ReplicasBusy:    sampler.mean(),
		HitBoundPercent: bound.percent(),
		Preemptions:     uint64(d.preemptions),
		HostTierGiB:     d.hostTierGiB,
		Replicas:        o.Replicas,
		Topology:        o.Topology,

		TurnsOnReplicaPercent: place.TurnsOnReplica,
		TurnsChangedReplica:   place.Changed,
		NewConversations:      place.NewConversations,
		NewSpread:             place.Spread,
	}
	row.SetClientSide(sum, o.TimeScale)
	if o.instances() > 1 || o.pinStore() != PinStoreNone {
		row.Instances, row.PinStore = o.instances(), o.pinStore()
	}
	if d.queries > 0 {
		row.PrefixHitPercent = 100 * d.hits / d.queries
		row.HostHitPercent = 100 * d.hostHits / d.queries
	}
	return row, nil
}

// ScrapeAll reads every simulator's /metrics.
func ScrapeAll(ctx context.Context, sims []*Sim) ([]metricsfeed.Scrape, error) {
	out := make([]metricsfeed.Scrape, len(sims))
	for i, s := range sims {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		sc, err := metricsfeed.Fetch(c, http.DefaultClient, metricsfeed.MetricsURL(s.Addr), metricsfeed.DefaultMaxBytes)
		cancel()
		if err != nil {
			return nil, err
		}
		out[i] = sc
	}
	return out, nil
}

// deltas is the growth of the engines' prefix-cache, host-tier and
// preemption counters between two scrapes of the fleet, and the size of
// an engine's host tier (0: none).
type deltas struct {
	hits, hostHits, queries, preemptions, hostTierGiB float64
}

func counterDeltas(before, after []metricsfeed.Scrape) deltas {
	total := func(scrapes []metricsfeed.Scrape) (t deltas) {
		for _, s := range scrapes {
			for _, e := range s.Engines {
				t.hits += e.PrefixHits
				t.hostHits += e.ExternalHits
				t.queries += e.PrefixQueries
				t.preemptions += e.Preemptions
				t.hostTierGiB = max(t.hostTierGiB, e.HostTierGiB)
			}
		}
		return t
	}
	b, a := total(before), total(after)
	return deltas{hits: a.hits - b.hits, hostHits: a.hostHits - b.hostHits, queries: a.queries - b.queries,
		preemptions: a.preemptions - b.preemptions, hostTierGiB: a.hostTierGiB}
}
