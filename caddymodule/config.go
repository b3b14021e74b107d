package caddymodule

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/lmwarden/caddy-warden/fleet"
	"github.com/lmwarden/caddy-warden/kvevents"
	"github.com/lmwarden/caddy-warden/metricsfeed"
	"github.com/lmwarden/caddy-warden/selection"
	"github.com/lmwarden/caddy-warden/sessionkey"
)

// ModelConfig is one model served by a fleet of vLLM replicas: either one
// server per replica (Replicas), or one server with internal data
// parallelism whose ranks are chosen with X-data-parallel-rank (Server).
type ModelConfig struct {
	// Replicas are vLLM servers, one per replica (external load balancing).
	Replicas []ReplicaConfig `json:"replicas,omitempty"`
	// Server is one vLLM server running --data-parallel-size Ranks engines.
	Server *ServerConfig `json:"server,omitempty"`

	// Aliases are the other names the model's replicas serve (vLLM's
	// --served-model-name takes several), which warden_models lists beside
	// the model's own name: the names agents ask for, served as they are,
	// with no rewrite of the request.
	Aliases []string `json:"aliases,omitempty"`

	// MaxNumSeqs is vLLM's --max-num-seqs per replica; 0 reads it from the
	// command line of the processes the app launches, else takes what vLLM
	// runs without the flag (vllmDefaultMaxNumSeqs).
	MaxNumSeqs int `json:"max_num_seqs,omitempty"`
	// SpillThreshold: requests in flight above which a pinned conversation
	// moves. 0 means auto: it moves only where its turn starts sooner
	// (selection/cost.go). Always written, so that
	// `PATCH /config/apps/warden/models/<m>/spill_threshold` finds it.
	SpillThreshold int `json:"spill_threshold"`
	// Affinity pins sessions to replicas (default true). Change it at
	// runtime with `PATCH /config/apps/warden/models/<m>/affinity`.
	Affinity *bool `json:"affinity,omitempty"`

	// SessionHeaders name the conversation, first present wins (default
	// sessionkey.DefaultHeaders: Claude Code, OpenCode, Crush, Codex, Goose).
	SessionHeaders []string `json:"session_headers,omitempty"`
	// SessionFromBody reads the conversation from the request body when no
	// header names it (default on): metadata.user_id (Claude Code),
	// session_id, prompt_cache_key, client_metadata.session_id, user.
	SessionFromBody *bool `json:"session_from_body,omitempty"`
	// Fingerprint keys a conversation that sends no ID by its head: the
	// system prompt and first messages, which agents resend unchanged on
	// every turn (default on).
	Fingerprint *bool `json:"fingerprint,omitempty"`
	// Subagents splits a session into one conversation per sub-agent, each
	// placed first beside its parent (default on).
	Subagents *bool `json:"subagents,omitempty"`
	// Compaction places a conversation anew after the agent says it
	// compacted it (default off: measured, it bought no cache and cost
	// balance; docs/research/agents.md).
	Compaction *bool `json:"compaction,omitempty"`
	// CompactionInterval is the least time between two placements of a
	// conversation for compaction (default 1m): hints sooner are ignored.
	CompactionInterval caddy.Duration `json:"compaction_interval,omitempty"`
	// BodyScanBytes bounds how much of the body is read (default 256 KiB).
	BodyScanBytes int `json:"body_scan_bytes,omitempty"`
	// ClientPinning honours a client's X-data-parallel-rank (ranks) or
	// X-Warden-Replica (replica ID) header; off, they are removed.
	ClientPinning bool `json:"client_pinning,omitempty"`

	// SessionTTL forgets conversations idle that long (default 30m).
	SessionTTL caddy.Duration `json:"session_ttl,omitempty"`
	// ActiveWindow: a conversation counts as load on its replica while it
	// sent a request this recently (default 2m).
	ActiveWindow caddy.Duration `json:"active_window,omitempty"`
	// MaxSessions bounds the session table (default 100000, LRU evicted).
	MaxSessions int `json:"max_sessions,omitempty"`

	// MetricsInterval is how often each server's /metrics is polled (default 1s).
	MetricsInterval caddy.Duration `json:"metrics_interval,omitempty"`

	// PinSnapshotInterval is how often the session table is written to
	// Caddy's storage (default 30s, checked every second), so that a
	// restart keeps conversations on their replicas; it is also written
	// when the last config using the model stops, and read when the model
	// is first loaded. 0 turns snapshots off.
	PinSnapshotInterval *caddy.Duration `json:"pin_snapshot_interval,omitempty"`

	// PinStore overrides the app's pin_store for this model; an empty one
	// keeps the model's pins local.
	PinStore *PinStoreConfig `json:"pin_store,omitempty"`

	// LoadControl holds turns at the proxy while their conversation does
	// not fit in a replica's KV cache (off by default).
	LoadControl *LoadControlConfig `json:"load_control,omitempty"`

	// Made by provision: the session header rules, and the max_num_seqs in
	// force with where it came from.
	rules            *sessionkey.Rules
	maxNumSeqs       int
	maxNumSeqsSource string
}

// Where a model's max_num_seqs came from (max_num_seqs_source in the admin
// JSON).
const (
	MaxNumSeqsFromConfig  = "config"
	MaxNumSeqsFromProcess = "process"
	MaxNumSeqsVLLMDefault = "vllm_default"
)

// vllmDefaultMaxNumSeqs is what `vllm serve` runs without --max-num-seqs
// on a GPU of less than 70 GiB, or an A100 (vLLM's engine arguments,
// get_batch_defaults, for the OpenAI API server); on larger GPUs (H100,
// H200, B200, MI300X) it runs 1024, which max_num_seqs should then say.
// Taking the smaller one when unsure errs towards spilling a request early
// rather than queueing it past the engine's limit.
const vllmDefaultMaxNumSeqs = 256

// ReplicaConfig is one vLLM server serving one replica.
type ReplicaConfig struct {
	// Address is the host:port reverse_proxy dials.
	Address string `json:"address"`
	// Process, when set, is the vLLM server the app launches and supervises.
	Process *ProcessConfig `json:"process,omitempty"`
	// KVEvents, when set, is where the server publishes its KV cache events.
	KVEvents *KVEventsConfig `json:"kv_events,omitempty"`
}

// KVEventsConfig is where a vLLM server publishes its KV cache events
// (--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
// "endpoint": "tcp://*:5557"}'): rehoming then judges the conversations
// pinned there by the blocks the server evicted (selection/chains.go).
type KVEventsConfig struct {
	// Endpoint is tcp://host:port, the publisher's port on the server's
	// host; a server's rank r publishes on port + r.
	Endpoint string `json:"endpoint"`
	// Topic is the publisher's topic (vLLM's default: none).
	Topic string `json:"topic,omitempty"`
}

// ServerConfig is one vLLM server with internal data parallelism.
type ServerConfig struct {
	// Address is the host:port reverse_proxy dials.
	Address string `json:"address"`
	// Ranks is its --data-parallel-size.
	Ranks int `json:"ranks"`
	// Process, when set, is the vLLM server the app launches and supervises.
	Process *ProcessConfig `json:"process,omitempty"`
	// KVEvents, when set, is where the server publishes its KV cache events.
	KVEvents *KVEventsConfig `json:"kv_events,omitempty"`
}

// ProcessConfig is a vLLM server the warden app runs: started with Caddy,
// ready when /health answers 200, restarted with growing delays when it
// exits, stopped (SIGTERM to its process group, SIGKILL after stop_grace)
// with Caddy. A config reload that keeps the command, environment and
// directory keeps the running process.
type ProcessConfig struct {
	// Command is the program and its arguments, e.g. vllm serve MODEL --port 8001.
	Command []string `json:"command"`
	// Env is added to Caddy's environment, e.g. CUDA_VISIBLE_DEVICES.
	Env map[string]string `json:"env,omitempty"`
	// Dir is the working directory.
	Dir string `json:"dir,omitempty"`
	// StartupTimeout bounds loading the model (default 15m).
	StartupTimeout caddy.Duration `json:"startup_timeout,omitempty"`
	// StopGrace is the time between SIGTERM and SIGKILL (default 30s).
	StopGrace caddy.Duration `json:"stop_grace,omitempty"`
}

// defaultBodyScanBytes covers the head of the agents with the longest
// prompts (Cline's system prompt alone is about 50 KB) with room for the
// first message. Only requests no header names are read, and a scan stops
// at the end of the head: see docs/agents.md.
const defaultBodyScanBytes = 256 << 10

// provision fills what process command lines say (the address from
// --port, ranks from --data-parallel-size) and resolves max_num_seqs.
func (c *ModelConfig) provision(name string) error {
	if err := c.fromProcesses(); err != nil {
		return fmt.Errorf("model %q: %v", name, err)
	}
	if err := c.resolveMaxNumSeqs(); err != nil {
		return fmt.Errorf("model %q: %v", name, err)
	}
	c.rules = c.newRules()
	return nil
}

// validate checks a provisioned model's shape; errors name the model.
func (c *ModelConfig) validate(name string) error {
	switch {
	case len(c.Replicas) == 0 && c.Server == nil:
		return fmt.Errorf("model %q: needs replicas or a server", name)
	case c.Server != nil && c.Server.Address == "":
		return fmt.Errorf("model %q: server needs an address (or a process with --port)", name)
	case len(c.Replicas) > 0 && c.Server != nil:
		return fmt.Errorf("model %q: replicas and server are exclusive", name)
	case c.Server != nil && (c.Server.Ranks < 1 || c.Server.Ranks > metricsfeed.MaxEngines):
		return fmt.Errorf("model %q: server %s needs ranks from 1 to %d", name, c.Server.Address, metricsfeed.MaxEngines)
	case c.MaxNumSeqs < 0, c.SpillThreshold < 0, c.MaxSessions < 0, c.BodyScanBytes < 0:
		return fmt.Errorf("model %q: max_num_seqs, spill_threshold, max_sessions and body_scan_bytes must not be negative", name)
	case c.PinSnapshotInterval != nil && *c.PinSnapshotInterval < 0:
		return fmt.Errorf("model %q: pin_snapshot_interval must not be negative (0 turns snapshots off)", name)
	case c.MaxSessions > 0 && c.MaxSessions < selection.MinMaxSessions:
		return fmt.Errorf("model %q: max_sessions must be at least %d", name, selection.MinMaxSessions)
	}
	if err := c.LoadControl.validate(); err != nil {
		return fmt.Errorf("model %q: %v", name, err)
	}
	for id, ev := range c.kvEvents() {
		if err := kvevents.CheckEndpoint(ev.Endpoint); err != nil {
			return fmt.Errorf("model %q: kv_events of %s: %v", name, id, err)
		}
	}
	for _, a := range c.Aliases {
		if a == "" || a == name {
			return fmt.Errorf("model %q: alias %q: expected another name than the model's own", name, a)
		}
	}
	seen := map[string]bool{}
	for _, a := range c.addresses() {
		if a == "" {
			return fmt.Errorf("model %q: a replica needs an address (or a process with --port)", name)
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("model %q: address %q: want host:port: %v", name, a, err)
		}
		if seen[a] {
			return fmt.Errorf("model %q: address %s listed twice", name, a)
		}
		seen[a] = true
	}
	return nil
}

// addresses are the servers to poll.
func (c *ModelConfig) addresses() []string {
	if c.Server != nil {
		return []string{c.Server.Address}
	}
	out := make([]string, len(c.Replicas))
	for i, r := range c.Replicas {
		out[i] = r.Address
	}
	return out
}

// replicas lists the routing targets: a server each, or a rank each.
func (c *ModelConfig) replicas() []selection.Replica {
	if c.Server != nil {
		out := make([]selection.Replica, c.Server.Ranks)
		for r := range out {
			out[r] = selection.Replica{
				ID:       c.Server.Address + "#" + strconv.Itoa(r),
				Address:  c.Server.Address,
				Rank:     r,
				SetsRank: true,
			}
		}
		return out
	}
	out := make([]selection.Replica, len(c.Replicas))
	for i, r := range c.Replicas {
		out[i] = selection.Replica{ID: r.Address, Address: r.Address}
	}
	return out
}

// kvEvents is where each replica that publishes its KV cache events does,
// by replica ID: a server's rank r on the endpoint's port + r, as vLLM's
// data-parallel ranks publish.
func (c *ModelConfig) kvEvents() map[string]kvevents.Options {
	out := map[string]kvevents.Options{}
	if c.Server != nil && c.Server.KVEvents != nil {
		for _, rep := range c.replicas() {
			ev := c.Server.KVEvents
			out[rep.ID] = kvevents.Options{Endpoint: offsetPort(ev.Endpoint, rep.Rank), Topic: ev.Topic}
		}
	}
	for _, r := range c.Replicas {
		if r.KVEvents != nil {
			out[r.Address] = kvevents.Options{Endpoint: r.KVEvents.Endpoint, Topic: r.KVEvents.Topic}
		}
	}
	return out
}

// offsetPort adds n to the port of a tcp://host:port endpoint; an endpoint
// that is not one is returned as it is, for validation to reject.
func offsetPort(endpoint string, n int) string {
	host, port, err := net.SplitHostPort(strings.TrimPrefix(endpoint, "tcp://"))
	p, perr := strconv.Atoi(port)
	if err != nil || perr != nil || n == 0 {
		return endpoint
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+n))
}

// fleetSpec is the model's runtime configuration; shared is its pin store,
// nil when pins are local.
func (c *ModelConfig) fleetSpec(shared selection.SharedPins) fleet.Spec {
	return fleet.Spec{
		Routing: selection.Config{
			MaxNumSeqs:         c.maxNumSeqs,
			SpillThreshold:     c.SpillThreshold,
			Affinity:           c.Affinity == nil || *c.Affinity,
			SessionTTL:         time.Duration(c.SessionTTL),
			ActiveWindow:       time.Duration(c.ActiveWindow),
			MaxSessions:        c.MaxSessions,
			Shared:             shared,
			CompactionInterval: time.Duration(c.CompactionInterval),
			Admission:          c.LoadControl.admission(),
		},
		Replicas:        c.replicas(),
		MetricsInterval: c.metricsInterval(),
	}
}

func (c *ModelConfig) metricsInterval() time.Duration {
	if c.MetricsInterval > 0 {
		return time.Duration(c.MetricsInterval)
	}
	return time.Second
}

// defaultPinSnapshotInterval: at 100,000 conversations a write costs some
// tens of milliseconds of CPU and 1.5 MB, and a crash loses at most this
// much of the table's changes.
const defaultPinSnapshotInterval = 30 * time.Second

// pinSnapshotInterval is 0 when snapshots are off.
func (c *ModelConfig) pinSnapshotInterval() time.Duration {
	if c.PinSnapshotInterval == nil {
		return defaultPinSnapshotInterval
	}
	return time.Duration(*c.PinSnapshotInterval)
}

func (c *ModelConfig) newRules() *sessionkey.Rules {
	return sessionkey.NewRules(c.SessionHeaders, isOn(c.Subagents), c.Compaction != nil && *c.Compaction)
}

// keyRules are the model's session header rules.
func (c *ModelConfig) keyRules() *sessionkey.Rules {
	if c.rules == nil { // a config not provisioned (tests)
		return c.newRules()
	}
	return c.rules
}

// isOn reads an on|off option whose default is on.
func isOn(b *bool) bool { return b == nil || *b }

func (c *ModelConfig) sessionFromBody() bool { return isOn(c.SessionFromBody) }
func (c *ModelConfig) fingerprint() bool     { return isOn(c.Fingerprint) }

func (c *ModelConfig) bodyScanBytes() int {
	if c.BodyScanBytes > 0 {
		return c.BodyScanBytes
	}
	return defaultBodyScanBytes
}

// checkModelNames reports a name two models answer to: a model's name or
// alias that another model (or the same one) also has. warden_models would
// list it twice, and a request naming it can go to one of them only.
func checkModelNames(models map[string]*ModelConfig) error {
	owner := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(models)) {
		owner[name] = name
	}
	for _, name := range slices.Sorted(maps.Keys(models)) {
		if models[name] == nil {
			continue // Provision reports it
		}
		for _, a := range models[name].Aliases {
			if other, taken := owner[a]; taken {
				return fmt.Errorf("model %q: alias %q is already a name of model %q", name, a, other)
			}
			owner[a] = name
		}
	}
	return nil
}
