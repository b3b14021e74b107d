package e2e

import (
	"maps"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/lab"
)

// Warden's variants are warden with one model option changed; every time
// in the model's JSON fields, the compaction interval included, is divided
// by the time scale.
func TestWardenVariantsConfig(t *testing.T) {
	o := Options{Topology: TopologyServers, Replicas: 2, MaxNumSeqs: 32, TimeScale: 10, Workload: agentload.DefaultConfig()}
	sims := []*Sim{{Addr: "127.0.0.1:1"}, {Addr: "127.0.0.1:2"}}
	inst := &Instance{Site: "127.0.0.1:3", Admin: "127.0.0.1:4"}
	scaledTimes := map[string]any{"metrics_interval": "100ms", "active_window": "12s", "session_ttl": "3m0s", "compaction_interval": "6s"}
	with := func(extra map[string]any) map[string]any {
		out := maps.Clone(scaledTimes)
		maps.Copy(out, extra)
		return out
	}
	lcTimes := map[string]any{"load_control.linger": "600ms", "load_control.max_wait": "30s"}
	for policy, want := range map[string]struct {
		line   string
		fields map[string]any
	}{
		"warden":                {"", scaledTimes},
		"off":                   {"", scaledTimes},
		"warden-nosubagents":    {"", with(map[string]any{"subagents": false})},
		"warden-compaction":     {"", with(map[string]any{"compaction": true})},
		"warden-nofingerprint":  {"fingerprint off", scaledTimes},
		"warden-admission":      {"load_control on", with(lcTimes)},
		"warden-admission-farm": {"load_control farm", with(map[string]any{"load_control.linger": "600ms", "load_control.max_wait": "30s", "load_control.stagger": "1.5s"})},
	} {
		cfg := caddyfile(o, policy, sims, &Cluster{}, inst)
		if !strings.Contains(cfg, "lb_policy warden m") || !usesWarden(policy) || !strings.Contains(cfg, "warden_stop_reason") {
			t.Errorf("%s: not routed by warden behind warden_stop_reason:\n%s", policy, cfg)
		}
		for _, option := range []string{"fingerprint", "load_control"} {
			if strings.Contains(cfg, option) != strings.HasPrefix(want.line, option) {
				t.Errorf("%s: option %q misplaced:\n%s", policy, option, cfg)
			}
		}
		if want.line != "" && !strings.Contains(cfg, "\t"+want.line+"\n") {
			t.Errorf("%s: no line %q:\n%s", policy, want.line, cfg)
		}
		if got := modelFields(o, policy); !maps.Equal(got, want.fields) {
			t.Errorf("%s: model fields %v, want %v", policy, got, want.fields)
		}
	}
	for _, policy := range []string{"header", "least_conn", "round_robin"} {
		if cfg := caddyfile(o, policy, sims, &Cluster{}, inst); strings.Contains(cfg, "warden_stop_reason") || modelFields(o, policy) != nil {
			t.Errorf("%s: warden's settings where warden does not route:\n%s", policy, cfg)
		}
	}
	o.CompactionInterval = 20 * time.Second
	if got := modelFields(o, "warden")["compaction_interval"]; got != "2s" {
		t.Errorf("compaction interval %v, want 2s (scaled)", got)
	}
	o.Policies = []string{"warden-nosubagents", "warden-compaction"}
	o.Sessions, o.Duration, o.BlockSize = []int{1}, time.Second, 16
	if err := o.check(); err != nil {
		t.Error(err)
	}
	o.Policies = []string{"warden-bogus"}
	if err := o.check(); err == nil {
		t.Error("an unknown variant was accepted")
	}
}

// Under warden-events each replica's block names where its KV cache events
// are published; a server with data-parallel ranks names its first port,
// and its ranks publish on the ports after it, which the run finds free.
func TestKVEventsConfig(t *testing.T) {
	inst := &Instance{Site: "127.0.0.1:3", Admin: "127.0.0.1:4"}
	o := Options{Topology: TopologyServers, Replicas: 2, MaxNumSeqs: 32, TimeScale: 10, Workload: agentload.DefaultConfig()}
	sims := []*Sim{{Addr: "127.0.0.1:1", KVEvents: "tcp://127.0.0.1:5557"}, {Addr: "127.0.0.1:2", KVEvents: "tcp://127.0.0.1:5600"}}
	cfg := caddyfile(o, lab.PolicyWardenEvents, sims, &Cluster{}, inst)
	for _, want := range []string{"replica 127.0.0.1:1 {\n\t\t\t\tkv_events tcp://127.0.0.1:5557 " + kvEventsTopic, "replica 127.0.0.1:2 {\n\t\t\t\tkv_events tcp://127.0.0.1:5600 " + kvEventsTopic} {
		if !strings.Contains(cfg, want) {
			t.Errorf("servers: %q missing:\n%s", want, cfg)
		}
	}
	o.Topology, o.Replicas = TopologyRanks, 4
	cfg = caddyfile(o, lab.PolicyWardenEvents, sims[:1], &Cluster{}, inst)
	if want := "server 127.0.0.1:1 ranks 4 {\n\t\t\t\tkv_events tcp://127.0.0.1:5557 " + kvEventsTopic; !strings.Contains(cfg, want) {
		t.Errorf("ranks: %q missing:\n%s", want, cfg)
	}
	if cfg := caddyfile(o, "warden", sims[:1], &Cluster{}, inst); strings.Contains(cfg, "kv_events") {
		t.Errorf("warden follows no events:\n%s", cfg)
	}
	addr, err := freePortRun(4)
	if err != nil {
		t.Fatal(err)
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "0" {
		t.Errorf("freePortRun(4) = %q, want a loopback address with a port", addr)
	}
}

// A sub-agent and each prefix of a compacted conversation are conversations
// of their own: their first turn is their home.
func TestPlaceByConversation(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	res := func(agent string, segment, turn, start int, engine string) agentload.Result {
		return agentload.Result{SessionID: "s", Agent: agent, Segment: segment, Turn: turn, Start: at(start), End: at(start + 1), Engine: engine}
	}
	results := []agentload.Result{
		res("", 0, 0, 0, "r0/0"), res("", 0, 1, 2, "r0/0"),
		res("a", 0, 0, 3, "r1/0"), res("a", 0, 1, 5, "r1/0"),
		res("", 1, 0, 7, "r2/0"), res("", 1, 1, 9, "r2/0"),
	}
	p := Place(results, at(0), at(20), []string{"r0/0", "r1/0", "r2/0"})
	if p.TurnsOnReplica != 100 || p.Turns != 3 || p.NewConversations != 3 || p.Spread != 0 {
		t.Errorf("%+v", p)
	}
}
