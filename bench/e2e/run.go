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
	"strconv"
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
	// People, when set, share the fleet in place of a level's sessions
	// (Sessions is then their sessions in all, one level): each runs its
	// own sessions and think time (lab.Person), its agents sending its own
	// API key so that load control tells its turns apart, and gets its own
	// rows. OneFlow sends no key: every turn in one flow, as a proxy that
	// tells no one apart.
	People  []lab.Person
	OneFlow bool
	// SmallReplicas serve Workload.SmallModel, the side calls' model, on
	// servers of their own beside the Replicas of Workload.Model: one
	// Caddy site routes each request by the model its body names
	// (warden_model) to that model's reverse_proxy, and each model gets
	// its own rows. 0 without a small model.
	SmallReplicas int
	// SimArgs are extra vllmsim flags (profile overrides), for both models.
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
	if o.People != nil && (len(o.Sessions) != 1 || o.Sessions[0] != lab.Sessions(o.People)) {
		return errors.New("with people, the one level is their sessions in all")
	}
	if (o.Workload.SmallModel != "") != (o.SmallReplicas > 0) {
		return errors.New("a small model and its replicas go together: give both or neither")
	}
	if o.SmallReplicas > 0 && (o.Topology != TopologyServers || o.Workload.SmallModel == o.Workload.Model) {
		return errors.New("a small model needs the servers topology and a name of its own")
	}
	if o.SmallReplicas < 0 || o.Replicas < 1 || o.TimeScale <= 0 || o.Duration <= 0 || o.Warmup < 0 || o.BlockSize < 1 || len(o.Sessions) == 0 || o.CompactionInterval < 0 {
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
		co := ClusterOptions{Instances: o.instances(), PinStore: o.PinStore, Bin: caddyBin, Log: o.Log, ModelFields: modelFields(o, policy), Models: o.wardenModels()}
		if co.DataDir, err = os.MkdirTemp(storage, "fleet-"); err != nil {
			return rows, err
		}
		if cluster, err = StartCluster(ctx, co, config); err != nil {
			return rows, err
		}
		if usesWarden(policy) {
			for _, m := range o.wardenModels() {
				if err := cluster.Do(http.MethodPost, "/warden/models/"+m+"/affinity", map[string]bool{"enabled": policy != "off"}); err != nil {
					return rows, err
				}
			}
		}
		for _, n := range o.Sessions {
			if o.Progress != nil {
				o.Progress(policy, n, false)
			}
			levelRows, err := runLevel(ctx, o, policy, n, "http://"+cluster.Site, sims)
			if err != nil {
				return rows, fmt.Errorf("%s at %d sessions: %v", policy, n, err)
			}
			rows = append(rows, levelRows...)
			if usesWarden(policy) {
				for _, inst := range cluster.Instances {
					name := fmt.Sprintf("admin-%s-%d", policy, n)
					if len(cluster.Instances) > 1 {
						name = fmt.Sprintf("admin-%s-x%d-%s-%d-%s", policy, o.instances(), o.pinStore(), n, inst.Name)
					}
					for _, m := range o.wardenModels() {
						path := filepath.Join(dir, name+".json")
						if m != "m" {
							path = filepath.Join(dir, name+"-"+m+".json")
						}
						if err := saveAdminJSON(inst.Proc, m, path); err != nil {
							return rows, err
						}
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

// SmallModel is the warden model of the small model's replicas, in the
// Caddyfile and the admin API, beside m.
const SmallModel = "small"

// wardenModels are the warden models of a run's Caddyfile.
func (o Options) wardenModels() []string {
	if o.SmallReplicas > 0 {
		return []string{"m", SmallModel}
	}
	return []string{"m"}
}

func usesWarden(policy string) bool {
	_, variant := wardenVariants[policy]
	return policy == "warden" || policy == "off" || variant
}

// caddyfile is an instance's Caddyfile for a policy; modelFields are the
// JSON fields of its models that a Caddyfile does not offer. With a small
// model, its requests, told by the model their body names, go to its own
// replicas and warden model, as docs/models.md lays a farm out.
func caddyfile(o Options, policy string, sims []*Sim, c *Cluster, inst *Instance) string {
	large, small := sims[:o.servers()], sims[o.servers():]
	options := ""
	if v := wardenVariants[policy]; v != nil && v(o.scaled).line != "" {
		options = "\t\t\t" + v(o.scaled).line + "\n"
	}
	block := func(name string, sims []*Sim) string {
		return fmt.Sprintf("\t\tmodel %s {\n\t\t\t%s\n\t\t\tmax_num_seqs %d\n%s\t\t}\n", name, o.replicasLines(policy, sims), o.MaxNumSeqs, options)
	}
	models := block("m", large)
	lbPolicy, site := policy, inst.SiteDirectives()
	if usesWarden(policy) {
		lbPolicy = "warden"
		site += "\twarden_stop_reason\n"
	}
	proxy := func(matcher, model string, sims []*Sim) string {
		lb := map[string]string{
			"warden":      "lb_policy warden " + model,
			"header":      "lb_policy header " + o.Workload.SessionHeader,
			"least_conn":  "lb_policy least_conn",
			"round_robin": "lb_policy round_robin",
			"vllm":        "", // one upstream: vLLM's own balancer picks the engine
		}[lbPolicy]
		return fmt.Sprintf("\treverse_proxy %s%s {\n\t\t%s\n\t}\n", matcher, addrs(sims), lb)
	}
	if len(small) > 0 {
		models += block(SmallModel, small)
		site += fmt.Sprintf("\t@small warden_model %s\n", o.Workload.SmallModel) + proxy("@small ", SmallModel, small)
	}
	return fmt.Sprintf(`{
	admin %s
	default_bind 127.0.0.1
	log {
		level ERROR
	}
	warden {
%s%s	}
}
http://%s {
%s%s}
`, inst.Admin, c.Global(), models, inst.Site, site, proxy("", "m", large))
}

// replicasLines are a warden model's lines naming its replicas, sims.
func (o Options) replicasLines(policy string, sims []*Sim) string {
	switch {
	case o.Topology == TopologyRanks && policy == lab.PolicyWardenEvents:
		return fmt.Sprintf("server %s ranks %d {\n\t\t\t\tkv_events %s %s\n\t\t\t}", sims[0].Addr, o.Replicas, sims[0].KVEvents, kvEventsTopic)
	case o.Topology == TopologyRanks:
		return fmt.Sprintf("server %s ranks %d", sims[0].Addr, o.Replicas)
	case policy == lab.PolicyWardenEvents:
		var lines []string
		for _, s := range sims {
			lines = append(lines, fmt.Sprintf("replica %s {\n\t\t\t\tkv_events %s %s\n\t\t\t}", s.Addr, s.KVEvents, kvEventsTopic))
		}
		return strings.Join(lines, "\n\t\t\t")
	}
	return "replicas " + addrs(sims)
}

// addrs lists the simulators' addresses, space-separated.
func addrs(sims []*Sim) string {
	var out []string
	for _, s := range sims {
		out = append(out, s.Addr)
	}
	return strings.Join(out, " ")
}

// modelFields are the JSON fields of every warden model for a policy: warden's times
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

// saveAdminJSON keeps a model's panel as it stood after a level.
func saveAdminJSON(caddy *caddyproc.Process, model, path string) error {
	var panel json.RawMessage
	if err := caddy.Do(http.MethodGet, "/warden/models/"+model, nil, &panel); err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, panel, "", "  "); err != nil {
		return err
	}
	return os.WriteFile(path, out.Bytes(), 0o644)
}

// party is the load of one person, or without people everyone's: its
// workload and how many sessions it keeps going.
type party struct {
	person   *lab.Person
	workload agentload.Config
	sessions int
}

// parties shares a level's sessions between the people, each with its own
// workload and, unless OneFlow, its own API key.
func (o Options) parties(sessions int) []party {
	if o.People == nil {
		w := o.Workload
		w.Seed = agentload.LevelSeed(o.Workload.Seed, sessions)
		return []party{{workload: w, sessions: sessions}}
	}
	out := make([]party, len(o.People))
	for i := range o.People {
		p := &o.People[i]
		out[i] = party{person: p, workload: p.Workload(o.Workload, o.Workload.Seed), sessions: p.Sessions}
		if !o.OneFlow {
			out[i].workload.APIKey = "sk-" + p.Name
		}
	}
	return out
}

// modelFleet is the replicas of one model in a level: the simulators
// sims[first:first+len(sims)] of the run, their engines, and the busy
// sampler over them. Its name is the model its requests name, "" when it
// is the only one; side marks the small model's.
type modelFleet struct {
	name    string
	side    bool
	sims    []*Sim
	first   int
	engines []string
	busy    *busySampler
}

// modelFleets are the level's models: one, or the model and the small one.
func (o Options) modelFleets(sims []*Sim, sample time.Duration) []modelFleet {
	if o.SmallReplicas == 0 {
		return []modelFleet{{sims: sims, engines: o.engines(), busy: newBusySampler(sims, sample)}}
	}
	n := o.servers()
	var small []string
	for i := range o.SmallReplicas {
		small = append(small, "s"+strconv.Itoa(i)+"/0")
	}
	return []modelFleet{
		{name: o.Workload.Model, sims: sims[:n], engines: o.engines(), busy: newBusySampler(sims[:n], sample)},
		{name: o.Workload.SmallModel, side: true, sims: sims[n:], first: n, engines: small, busy: newBusySampler(sims[n:], sample)},
	}
}

// results are the fleet's model's among results.
func (f modelFleet) results(results []agentload.Result) []agentload.Result {
	if f.name == "" {
		return results
	}
	return slices.DeleteFunc(slices.Clone(results), func(r agentload.Result) bool { return r.Side != f.side })
}

// runLevel runs one level, warm-up first, and measures it: one row, or
// one per model, and with people one per person of each.
func runLevel(ctx context.Context, o Options, policy string, sessions int, base string, sims []*Sim) ([]report.Row, error) {
	wall := func(d time.Duration) time.Duration { return time.Duration(float64(d) / o.TimeScale) }
	parties := o.parties(sessions)
	fleets := o.modelFleets(sims, wall(time.Second))
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.Proxy = nil                        // loopback only
	transport.MaxIdleConnsPerHost = 2 * sessions // a turn and its side call
	defer transport.CloseIdleConnections()
	// The bound is the level's own: the best hit rate on its request stream
	// from a cold cache (each level draws its own sessions).
	bound := newBoundRecorder(o.Workload.SessionHeader, o.BlockSize)
	bound.measureFrom(time.Now().Add(time.Hour)) // nothing counts during the warm-up
	client := &http.Client{Transport: bound.through(transport)}
	runners := make([]*agentload.Runner, len(parties))
	for i, p := range parties {
		p.workload.ThinkTime = wall(p.workload.ThinkTime) // the pauses pass in simulated time too
		gen, err := agentload.NewGenerator(p.workload)
		if err != nil {
			return nil, err
		}
		runners[i] = &agentload.Runner{Generator: gen, BaseURL: base, Sessions: p.sessions, Duration: wall(o.Warmup + o.Duration), Client: client, OnResult: bound.onResult}
	}

	// The measured window opens after the warm-up: counters, busy samples
	// and the hit bound start there.
	var before []metricsfeed.Scrape
	var measureErr error
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
		var samplers sync.WaitGroup
		for _, f := range fleets {
			samplers.Go(func() { f.busy.run(samplerCtx) })
		}
		samplers.Wait()
	})
	reports := make([]agentload.Report, len(runners))
	errs := make([]error, len(runners)+1)
	var load sync.WaitGroup
	for i, r := range runners {
		load.Go(func() { reports[i], errs[i] = r.Run(ctx) })
	}
	load.Wait()
	stopSampler()
	wg.Wait()
	errs[len(runners)] = measureErr
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if before == nil {
		return nil, errors.New("the level ended before its warm-up did")
	}
	after, err := ScrapeAll(ctx, sims)
	if err != nil {
		return nil, err
	}
	start, end := reports[0].Start, reports[0].End
	var all []agentload.Result
	for _, rep := range reports {
		start, end = minTime(start, rep.Start), maxTime(end, rep.End)
		all = append(all, rep.Results...)
	}
	from := start.Add(wall(o.Warmup))
	var rows []report.Row
	for _, f := range fleets {
		row := o.fleetRow(policy, sessions, f, f.results(all), from, end, before, after, bound)
		if o.People == nil {
			rows = append(rows, row)
			continue
		}
		for i, p := range parties {
			rows = append(rows, p.person.Row(row, agentload.Summarize(f.results(reports[i].Results), from, end), o.TimeScale))
		}
	}
	return rows, nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// fleetRow is a model's row of a level: what its clients saw of its
// requests, results, over [from, to], and what its replicas counted
// between the scrapes before and after.
func (o Options) fleetRow(policy string, sessions int, f modelFleet, results []agentload.Result, from, to time.Time, before, after []metricsfeed.Scrape, bound *boundRecorder) report.Row {
	sum := agentload.Summarize(results, from, to)
	place := Place(results, from, to, f.engines)
	span := func(s []metricsfeed.Scrape) []metricsfeed.Scrape { return s[f.first : f.first+len(f.sims)] }
	d := counterDeltas(span(before), span(after))
	var models []string
	if f.name != "" {
		models = []string{f.name}
	}
	row := report.Row{
		Mode:            report.ModeRun,
		Policy:          policy,
		Sessions:        sessions,
		Seed:            int64(o.Seed),
		DurationS:       o.Duration.Seconds(),
		ReplicasBusy:    f.busy.mean(),
		HitBoundPercent: bound.percent(models...),
		Preemptions:     uint64(d.preemptions),
		ReplicaRequests: int(d.requests),
		HostTierGiB:     d.hostTierGiB,
		Replicas:        len(f.engines),
		Topology:        o.Topology,
		Model:           f.name,

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
	return row
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

// deltas is the growth of the engines' prefix-cache, host-tier,
// preemption and finished-request counters between two scrapes of the
// fleet, and the size of an engine's host tier (0: none).
type deltas struct {
	hits, hostHits, queries, preemptions, requests, hostTierGiB float64
}

func counterDeltas(before, after []metricsfeed.Scrape) deltas {
	total := func(scrapes []metricsfeed.Scrape) (t deltas) {
		for _, s := range scrapes {
			for _, e := range s.Engines {
				t.hits += e.PrefixHits
				t.hostHits += e.ExternalHits
				t.queries += e.PrefixQueries
				t.preemptions += e.Preemptions
				t.requests += e.RequestSuccess
				t.hostTierGiB = max(t.hostTierGiB, e.HostTierGiB)
			}
		}
		return t
	}
	b, a := total(before), total(after)
	return deltas{hits: a.hits - b.hits, hostHits: a.hostHits - b.hostHits, queries: a.queries - b.queries,
		preemptions: a.preemptions - b.preemptions, requests: a.requests - b.requests, hostTierGiB: a.hostTierGiB}
}
