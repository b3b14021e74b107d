package e2e

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/lab"
)

// Warden's variants are warden with one model option off; every time in the
// config, the compaction interval included, is divided by the time scale.
func TestWardenVariantsConfig(t *testing.T) {
	o := Options{Topology: TopologyServers, Replicas: 2, MaxNumSeqs: 32, TimeScale: 10, Workload: agentload.DefaultConfig()}
	sims := []*Sim{{Addr: "127.0.0.1:1"}, {Addr: "127.0.0.1:2"}}
	inst := &Instance{Site: "127.0.0.1:3", Admin: "127.0.0.1:4"}
	for policy, option := range map[string]string{
		"warden": "", "off": "", "warden-nosubagents": "subagents off",
		"warden-compaction": "compaction on", "warden-nofingerprint": "fingerprint off",
	} {
		cfg := caddyfile(o, policy, sims, &Cluster{}, inst)
		if !strings.Contains(cfg, "lb_policy warden m") || !usesWarden(policy) {
			t.Errorf("%s: not routed by warden:\n%s", policy, cfg)
		}
		for _, o := range []string{"subagents", "compaction ", "fingerprint"} {
			if strings.Contains(cfg, o) != (option != "" && strings.HasPrefix(option, o)) {
				t.Errorf("%s: option %q misplaced:\n%s", policy, o, cfg)
			}
		}
		if !strings.Contains(cfg, "compaction_interval 6s") {
			t.Errorf("%s: compaction interval not the scaled default:\n%s", policy, cfg)
		}
	}
	if cfg := caddyfile(o, "warden-admission", sims, &Cluster{}, inst); !strings.Contains(cfg, "load_control {") ||
		!strings.Contains(cfg, "linger 600ms") || !strings.Contains(cfg, "max_wait 30s") {
		t.Errorf("warden-admission: load control missing or its times not scaled:\n%s", cfg)
	}
	if cfg := caddyfile(o, "warden-admission-farm", sims, &Cluster{}, inst); strings.Contains(cfg, "fill ") ||
		!strings.Contains(cfg, "quantum off") || !strings.Contains(cfg, "stagger 1.5s") || !strings.Contains(cfg, "linger 600ms") ||
		!strings.Contains(cfg, "fill_range 0.92 0.98") || !strings.Contains(cfg, "touch on") {
		t.Errorf("warden-admission-farm: not the farm preset:\n%s", cfg)
	}
	for _, policy := range []string{"warden", "off", "warden-admission", "header"} {
		if cfg := caddyfile(o, policy, sims, &Cluster{}, inst); strings.Contains(cfg, "warden_stop_reason") != usesWarden(policy) {
			t.Errorf("%s: warden_stop_reason where warden routes, and only there:\n%s", policy, cfg)
		}
	}
	o.CompactionInterval = 20 * time.Second
	if cfg := caddyfile(o, "warden", sims, &Cluster{}, inst); !strings.Contains(cfg, "compaction_interval 2s") {
		t.Errorf("compaction interval not scaled:\n%s", cfg)
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
