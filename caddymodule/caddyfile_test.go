package caddymodule

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/lmwarden/caddy-warden/kvevents"
	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// Unit tests of the Caddyfile parsers on caddyfile.NewTestDispenser: every
// error names the line (Testfile:N) and says what was expected.

// wardenOption is a global warden option around one model block, whose
// first line is line 3.
func wardenOption(block string) string {
	return "warden {\n\tmodel m {\n\t\t" + block + "\n\t}\n}"
}

// wantParseErr checks that err says want at Testfile:line.
func wantParseErr(t *testing.T, err error, line int, want string) {
	t.Helper()
	if err == nil {
		t.Errorf("no error; want %q at line %d", want, line)
		return
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if where := fmt.Sprintf(", at Testfile:%d", line); !strings.HasSuffix(err.Error(), where) {
		t.Errorf("error %q is not at line %d", err, line)
	}
}

func TestParseGlobalOptionErrors(t *testing.T) {
	for _, c := range []struct {
		input string
		line  int
		want  string
	}{
		// As examples_test.go TestCaddyfileErrors expects from `caddy adapt`.
		{wardenOption("replicas"), 3, "replicas needs at least one host:port"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tspill_threshold lots"), 4, `spill_threshold: expected auto or a positive integer, got "lots"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tspill_threshold"), 4, "spill_threshold: expected auto or a positive integer"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tspill_threshold 0"), 4, `spill_threshold: expected auto or a positive integer, got "0"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\taffinity maybe"), 4, `affinity: expected on or off, got "maybe"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\taffinity"), 4, "affinity: expected on or off"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tmax_num_seqs 0"), 4, `max_num_seqs: expected a positive integer, got "0"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tmax_num_seqs"), 4, "max_num_seqs: expected a positive integer"},
		{wardenOption("server 127.0.0.1:1 ranks x"), 3, `ranks: expected an integer from 1 to 256, got "x"`},
		{wardenOption("server 127.0.0.1:1 ranks 0"), 3, `ranks: expected an integer from 1 to 256, got "0"`},
		{wardenOption("server 127.0.0.1:1 ranks 257"), 3, `ranks: expected an integer from 1 to 256, got "257"`},
		{wardenOption("server 127.0.0.1:1"), 3, "expected: server <host:port> ranks <n>"},
		{wardenOption("server 127.0.0.1:1 shards 2"), 3, "expected: server <host:port> ranks <n>"},
		{wardenOption("server {\n\t\t}"), 4, "expected: server <host:port> ranks <n>, or a block with a process"},
		{wardenOption("replicas localhost"), 3, `address "localhost": want host:port`},
		{wardenOption("replica localhost {\n\t\t\tprocess vllm serve m\n\t\t}"), 3, `address "localhost": want host:port`},
		{wardenOption("server localhost ranks 2"), 3, `address "localhost": want host:port`},
		{wardenOption("replicas 127.0.0.1:1 127.0.0.1:1"), 4, `model "m": address 127.0.0.1:1 listed twice`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tserver 127.0.0.1:2 ranks 2"), 5, `model "m": replicas and server are exclusive`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tbogus 1"), 4, `unrecognized model option "bogus"; expected affinity, aliases, fingerprint, load_control, max_num_seqs, pin_store, replica, replicas, server or spill_threshold`},
		{wardenOption("replicas 127.0.0.1:1\n\t\taliases"), 4, "aliases: expected at least one name"},
		{wardenOption("replicas 127.0.0.1:1\n\t\taliases claude m"), 5, `model "m": alias "m": expected another name than the model's own`},
		{wardenOption("max_num_seqs 32"), 4, `model "m": needs replicas or a server`},
		{wardenOption("replicas 127.0.0.1:1\n\t\trule seed"), 4, "rule was removed: the default rule (seed) is the only one, delete the line"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tfingerprint"), 4, "fingerprint: expected on or off"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tfingerprint yes"), 4, `fingerprint: expected on or off, got "yes"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\taffinity true"), 4, `affinity: expected on or off, got "true"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tmax_num_seqs 8 16"), 4, `max_num_seqs: unexpected argument "16"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\taffinity on off"), 4, `affinity: unexpected argument "off"`},
		// Options that became JSON fields say so, and where.
		{wardenOption("replicas 127.0.0.1:1\n\t\tsession_ttl 1h"), 4, `session_ttl is no longer a Caddyfile option: set "session_ttl" in the model's JSON (apps.warden.models.<model>), see docs/configuration.md`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tactive_window 2m"), 4, `set "active_window" in the model's JSON`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tmax_sessions 64"), 4, `set "max_sessions" in the model's JSON`},
		{wardenOption("replicas 127.0.0.1:1\n\n\t\tmetrics_interval 1s"), 5, `set "metrics_interval" in the model's JSON`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tpin_snapshot_interval off"), 4, `set "pin_snapshot_interval" in the model's JSON (apps.warden.models.<model>), see docs/shared-pins.md`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tclient_pinning on"), 4, `set "client_pinning" in the model's JSON`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tsession_headers X-A"), 4, `set "session_headers" in the model's JSON (apps.warden.models.<model>), see docs/agents.md`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tsession_from_body"), 4, `set "session_from_body" in the model's JSON`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tsubagents off"), 4, `set "subagents" in the model's JSON`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tcompaction on"), 4, `set "compaction" in the model's JSON`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tcompaction_interval 1m"), 4, `set "compaction_interval" in the model's JSON`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tbody_scan_bytes 65536"), 4, `set "body_scan_bytes" in the model's JSON`},
		{wardenOption("replica {\n\t\t\tprocess vllm serve m --port 1\n\t\t\tstartup_timeout 1h\n\t\t}"), 5,
			`startup_timeout is no longer a Caddyfile option: set "startup_timeout" in the replica's process JSON (apps.warden.models.<model>.replicas[].process), see docs/processes.md`},
		{wardenOption("replica {\n\t\t\tprocess vllm serve m --port 1\n\t\t\tstop_grace 5s\n\t\t}"), 5, `set "stop_grace" in the replica's process JSON`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tpin_store redis {\n\t\t\tsync_interval 5s\n\t\t}"), 5,
			`sync_interval is no longer a Caddyfile option: set "sync_interval" in the pin store's JSON (pin_store.redis), see docs/shared-pins.md`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tpin_store redis {\n\t\t\ttls_insecure on\n\t\t}"), 5, `set "tls_insecure" in the pin store's JSON`},
		// Processes and their blocks.
		{wardenOption("replica {\n\t\t\tprocess\n\t\t}"), 4, "process: expected a command, e.g. process vllm serve MODEL --port 8001"},
		{wardenOption("replica {\n\t\t\tenv ONLY_NAME\n\t\t}"), 4, "env: expected a name and a value"},
		{wardenOption("replica {\n\t\t\tprocess vllm serve m\n\t\t}"), 6, "process [vllm serve m]: give the replica an address or the command a --port"},
		{wardenOption("replica 127.0.0.1:1 {\n\t\t\tdir /tmp\n\t\t}"), 5, "the block needs a process line"},
		{wardenOption("replica {\n\t\t\tprocess vllm serve m --port x\n\t\t}"), 6, "--port"},
		{wardenOption("replica {\n\t\t\tprocess vllm serve m --port 1\n\t\t\tdir\n\t\t}"), 5, "dir: expected a directory"},
		{wardenOption("replica {\n\t\t\tprocess vllm serve m --port 1 --max-num-seqs many\n\t\t}"), 6, `--max-num-seqs: want an integer, got "many"`},
		{wardenOption("replica {\n\t\t\tprocess vllm serve m --port 1\n\t\t\tuser vllm\n\t\t}"), 5,
			`unrecognized replica option "user"; expected dir, env, kv_events or process`},
		{wardenOption("replica {\n\t\t\tprocess vllm serve m --port 1\n\t\t\tdir /a /b\n\t\t}"), 5, `dir: unexpected argument "/b"`},
		{wardenOption("replica {\n\t\t\tprocess vllm serve m --port 1\n\t\t\tprocess vllm serve n --port 2\n\t\t}"), 5, "process given twice"},
		{wardenOption("replica 127.0.0.1:1 {\n\t\t\tkv_events\n\t\t}"), 4, "kv_events: expected the publisher's endpoint, tcp://host:port, and optionally its topic"},
		{wardenOption("replica 127.0.0.1:1 {\n\t\t\tkv_events tcp://*:5557\n\t\t}"), 4, `kv_events: kvevents: endpoint "tcp://*:5557" is where vLLM binds; give the host to connect to, e.g. tcp://127.0.0.1:5557`},
		{wardenOption("replica 127.0.0.1:1 {\n\t\t\tkv_events ipc:///tmp/kv\n\t\t}"), 4, `must be tcp://host:port`},
		{wardenOption("replica 127.0.0.1:1 {\n\t\t\tkv_events tcp://127.0.0.1:5557 topic extra\n\t\t}"), 4, `kv_events: unexpected argument "extra"`},
		{wardenOption("replica 127.0.0.1:1 {\n\t\t\tkv_events tcp://127.0.0.1:70000\n\t\t}"), 4, `the port in 1-65535`},
		{wardenOption("replica 127.0.0.1:1 {\n\t\t\tkv_events tcp://127.0.0.1:1\n\t\t\tkv_events tcp://127.0.0.1:2\n\t\t}"), 5, "kv_events given twice"},
		// Given twice: the last would win silently.
		{wardenOption("server 127.0.0.1:1 ranks 2\n\t\tserver 127.0.0.1:2 ranks 4"), 4, "server given twice"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control farm\n\t\tload_control off"), 5, "load_control given twice"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tspill_threshold 5\n\t\tspill_threshold auto"), 5, "spill_threshold given twice"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tmax_num_seqs 8\n\t\tmax_num_seqs 16"), 5, "max_num_seqs given twice"},
		{wardenOption("replicas 127.0.0.1:1\n\t\treplicas 127.0.0.1:2\n\t\treplicas"), 5, "replicas needs at least one host:port"}, // replicas add up
		{"warden {\n\tnot_a_model\n}", 2, `unrecognized warden option "not_a_model"; expected model or pin_store`},
		// The shared pin store, in the warden block or a model.
		{"warden {\n\tpin_store memcached\n}", 2, `pin_store: expected local or redis, got "memcached"`},
		{"warden {\n\tpin_store\n}", 2, "pin_store: expected local or redis"},
		{"warden {\n\tpin_store local {\n\t\taddress 127.0.0.1:1\n\t}\n}", 3, "pin_store local takes no block"},
		{"warden {\n\tpin_store redis 127.0.0.1:6379\n}", 2, `pin_store redis: unexpected argument "127.0.0.1:6379"; options go in its block`},
		{"warden {\n\tpin_store redis {\n\t\taddress localhost\n\t}\n}", 3, `address "localhost": want host:port`},
		{"warden {\n\tpin_store redis {\n\t\tdb one\n\t}\n}", 3, `db: expected a database number (0, 1, ...), got "one"`},
		{"warden {\n\tpin_store redis {\n\t\ttimeout soon\n\t}\n}", 3, `timeout: expected a positive duration such as 30s or 5m, got "soon"`},
		{"warden {\n\tpin_store redis {\n\t\tport 6379\n\t}\n}", 3,
			`unrecognized pin_store redis option "port"; expected address, db, key_prefix, password, timeout, tls_enabled or username`},
		{"warden {\n\tpin_store redis {\n\t\tpassword\n\t}\n}", 3, "password: expected a value"},
		{"warden {\n\tpin_store redis {\n\t\tkey_prefix a\n\t\tkey_prefix b\n\t}\n}", 4, "key_prefix given twice"},
		{"warden {\n\tpin_store local\n\tpin_store local\n}", 3, "pin_store given twice"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tpin_store redis {\n\t\t\ttls_enabled maybe\n\t\t}"), 5, `tls_enabled: expected on or off, got "maybe"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tpin_store redis {\n\t\t\ttls_enabled true\n\t\t}"), 5, `tls_enabled: expected on or off, got "true"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tpin_store redis {\n\t\t\ttls_enabled\n\t\t}"), 5, "tls_enabled: expected on or off"},
		// Load control: a word, and a block with flow_header only.
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control maybe"), 4, `load_control: expected off, on or farm, got "maybe"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control"), 4, "load_control: expected off, on or farm"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control on off"), 4, `load_control: unexpected argument "off"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tflow_header X-Team\n\t\t}"), 4, "load_control: expected off, on or farm"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control on {\n\t\t\tquantum off\n\t\t}"), 5,
			"quantum is a JSON field of load_control, not a Caddyfile option: load_control farm is the farm preset (what quantum off, stagger 15s, fill_range 0.92 0.98 and touch on set); see docs/load-control.md"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control on {\n\t\t\tflow_key X-Team\n\t\t}"), 5, `unrecognized load_control option "flow_key"; expected flow_header`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control on {\n\t\t\tflow_header\n\t\t}"), 5, "flow_header: expected a header name"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control on {\n\t\t\tflow_header X-Team X-Org\n\t\t}"), 5, `flow_header: unexpected argument "X-Org"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control on {\n\t\t\tflow_header \"X Team\"\n\t\t}"), 5, `flow_header: "X Team" is not a header name`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control on {\n\t\t\tflow_header A\n\t\t\tflow_header B\n\t\t}"), 6, "flow_header given twice"},
		// The option and model lines themselves.
		{"warden on {\n}", 1, "wrong argument count or unexpected line ending after 'on'"},
		{"warden {\n\tmodel {\n\t}\n}", 2, "model needs a name: model <name> { ... }"},
		{"warden {\n\tmodel m extra {\n\t\treplicas 127.0.0.1:1\n\t}\n}", 2, "wrong argument count or unexpected line ending after 'extra'"},
		{"warden {\n\tmodel m {\n\t\treplicas 127.0.0.1:1\n\t}\n\tmodel m {\n\t\treplicas 127.0.0.1:2\n\t}\n}", 5, `model "m" declared twice`},
	} {
		_, err := parseGlobalOption(caddyfile.NewTestDispenser(c.input), nil)
		wantParseErr(t, err, c.line, c.want)
	}
}

// Two warden blocks merge; a model declared in both is an error.
func TestParseGlobalOptionMerges(t *testing.T) {
	first, err := parseGlobalOption(caddyfile.NewTestDispenser("warden {\n\tmodel a {\n\t\treplicas 127.0.0.1:1\n\t}\n}"), nil)
	if err != nil {
		t.Fatal(err)
	}
	merged, err := parseGlobalOption(caddyfile.NewTestDispenser("warden {\n\tmodel b {\n\t\tserver 127.0.0.1:2 ranks 2\n\t}\n}"), first)
	if err != nil {
		t.Fatal(err)
	}
	app := merged.(httpcaddyfile.App)
	var got App
	if err := json.Unmarshal(app.Value, &got); err != nil {
		t.Fatal(err)
	}
	if app.Name != "warden" || len(got.Models) != 2 || got.Models["a"] == nil || got.Models["b"] == nil || got.Models["b"].Server.Ranks != 2 {
		t.Errorf("merged %s: %s", app.Name, app.Value)
	}

	_, err = parseGlobalOption(caddyfile.NewTestDispenser("warden {\n\tmodel a {\n\t\treplicas 127.0.0.1:3\n\t}\n}"), first)
	wantParseErr(t, err, 2, `model "a" declared twice`)

	// Unreachable through Caddy, which hands back what this parser made;
	// the error is checked before the first token is read, so it has no
	// line (", at :0").
	_, err = parseGlobalOption(caddyfile.NewTestDispenser("warden {\n}"), "not an app")
	if err == nil || !strings.Contains(err.Error(), "unexpected earlier warden option of type string") {
		t.Errorf("an earlier option of another type: %v", err)
	}
}

// What parseModel makes of the flags and defaults.
func TestParseModelValues(t *testing.T) {
	parse := func(t *testing.T, block string) *ModelConfig {
		t.Helper()
		v, err := parseGlobalOption(caddyfile.NewTestDispenser(wardenOption(block)), nil)
		if err != nil {
			t.Fatal(err)
		}
		var app App
		if err := json.Unmarshal(v.(httpcaddyfile.App).Value, &app); err != nil {
			t.Fatal(err)
		}
		return app.Models["m"]
	}
	m := parse(t, "replicas 127.0.0.1:1")
	if m.Affinity == nil || !*m.Affinity || m.SpillThreshold != 0 || m.MaxNumSeqs != 0 || m.Fingerprint != nil || m.LoadControl != nil {
		t.Errorf("defaults: %+v", m)
	}
	m = parse(t, "replicas 127.0.0.1:1\n\t\tfingerprint off\n\t\taffinity off\n\t\tspill_threshold 4")
	if m.Fingerprint == nil || *m.Fingerprint || m.Affinity == nil || *m.Affinity || m.SpillThreshold != 4 {
		t.Errorf("fingerprint off, affinity off, spill_threshold 4: %v %v %d", m.Fingerprint, m.Affinity, m.SpillThreshold)
	}
	// max_num_seqs given in the block wins over the command line's.
	m = parse(t, "max_num_seqs 8\n\t\treplica {\n\t\t\tprocess vllm serve m --port 7001 --max-num-seqs 64\n\t\t}")
	if m.MaxNumSeqs != 8 || m.Replicas[0].Address != "127.0.0.1:7001" {
		t.Errorf("max_num_seqs %d address %q, want 8 and 127.0.0.1:7001", m.MaxNumSeqs, m.Replicas[0].Address)
	}
	// ranks on the server line win over --data-parallel-size.
	m = parse(t, "server 127.0.0.1:7000 ranks 2 {\n\t\t\tprocess vllm serve m --port 7000 --data-parallel-size 4\n\t\t}")
	if m.Server.Ranks != 2 || m.Server.Address != "127.0.0.1:7000" {
		t.Errorf("server %+v, want 127.0.0.1:7000 with 2 ranks", m.Server)
	}
	// KV cache events: a replica's alone, with or without a process; a
	// server's ranks on consecutive ports.
	m = parse(t, "replica 127.0.0.1:7001 {\n\t\t\tkv_events tcp://127.0.0.1:5557 kv-events\n\t\t}\n\t\treplica 127.0.0.1:7002")
	if ev := m.kvEvents(); len(ev) != 1 || ev["127.0.0.1:7001"] != (kvevents.Options{Endpoint: "tcp://127.0.0.1:5557", Topic: "kv-events"}) || m.Replicas[0].Process != nil {
		t.Errorf("a replica's kv_events: %+v, process %+v", ev, m.Replicas[0].Process)
	}
	m = parse(t, "server 127.0.0.1:7000 ranks 2 {\n\t\t\tkv_events tcp://127.0.0.1:5557\n\t\t}")
	if ev := m.kvEvents(); len(ev) != 2 || ev["127.0.0.1:7000#0"].Endpoint != "tcp://127.0.0.1:5557" || ev["127.0.0.1:7000#1"].Endpoint != "tcp://127.0.0.1:5558" {
		t.Errorf("a server's kv_events: %+v", ev)
	}
}

// load_control on, off and farm, as the routing core gets them.
func TestParseLoadControl(t *testing.T) {
	parse := func(t *testing.T, lines string) *LoadControlConfig {
		t.Helper()
		v, err := parseGlobalOption(caddyfile.NewTestDispenser(wardenOption("replicas 127.0.0.1:1\n\t\t"+lines)), nil)
		if err != nil {
			t.Fatal(err)
		}
		var app App
		if err := json.Unmarshal(v.(httpcaddyfile.App).Value, &app); err != nil {
			t.Fatal(err)
		}
		return app.Models["m"].LoadControl
	}
	for _, c := range []struct {
		lines string
		want  loadcontrol.Config
	}{
		{"load_control on", loadcontrol.Config{Enabled: true}},
		{"load_control off", loadcontrol.Config{}},
		// The farm preset: the lines that set it before it had a name.
		{"load_control farm", loadcontrol.Config{Enabled: true, Quantum: -1, Stagger: 15 * time.Second, FillMin: 0.92, FillMax: 0.98, Touch: true}},
	} {
		if got := parse(t, c.lines).admission(); got != c.want {
			t.Errorf("%q: %+v, want %+v", c.lines, got, c.want)
		}
	}
	var absent *LoadControlConfig
	if got := absent.admission(); got.Enabled || absent.flowHeader() != "" {
		t.Error("no load_control line turns it on")
	}
	if got := parse(t, "load_control farm {\n\t\t\tflow_header X-Team\n\t\t}"); got.FlowHeader != "X-Team" || got.Preset != "farm" || !got.Enabled {
		t.Errorf("load_control farm with flow_header: %+v", got)
	}
}

// The JSON form is checked where the Caddyfile's is not: 0 means the default.
func TestLoadControlValidate(t *testing.T) {
	for _, c := range []struct {
		lc   LoadControlConfig
		want string
	}{
		{LoadControlConfig{Enabled: true}, ""},
		{LoadControlConfig{Fill: -1}, "fill must be a positive number"},
		{LoadControlConfig{Fill: math.Inf(1)}, "fill must be a positive number"},
		{LoadControlConfig{Linger: -1}, "linger and max_wait must be positive durations"},
		{LoadControlConfig{MaxWait: -1}, "linger and max_wait must be positive durations"},
		{LoadControlConfig{MaxQueue: -1}, "max_queue must be positive"},
		{LoadControlConfig{CapacityTokens: -1}, "capacity_tokens must not be negative"},
		{LoadControlConfig{Stagger: -1}, "stagger must not be negative"},
		{LoadControlConfig{MinResidents: -1}, "min_residents must be positive"},
		{LoadControlConfig{FillMin: 0.92, FillMax: 0.98}, ""},
		{LoadControlConfig{FillMax: 0.98}, "fill_min and fill_max go together"},
		{LoadControlConfig{Fill: 1, FillMin: 0.92, FillMax: 0.98}, "with fill (1) between them"},
		{LoadControlConfig{FillMin: 0.92, FillMax: math.Inf(1)}, "fill_min and fill_max go together"},
		{LoadControlConfig{Enabled: true, Preset: "farm"}, ""},
		{LoadControlConfig{Preset: "ranch"}, `preset must be "farm" or empty, got "ranch"`},
		// The preset's range must still hold a fill set over it.
		{LoadControlConfig{Preset: "farm", Fill: 0.99}, "with fill (0.99) between them, got 0.92 and 0.98"},
		{LoadControlConfig{Preset: "farm", Fill: 0.99, FillMin: 0.9, FillMax: 1}, ""},
		{LoadControlConfig{Enabled: true, FlowHeader: "X-Team"}, ""},
		{LoadControlConfig{Enabled: true, FlowHeader: "X Team"}, `flow_header "X Team" is not a header name`},
	} {
		m := &ModelConfig{Replicas: []ReplicaConfig{{Address: "127.0.0.1:1"}}, LoadControl: &c.lc}
		err := m.validate("m")
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: error %v, want %q", c.lc, err, c.want)
		}
	}
}

// JSON fields set over the farm preset override it; those left at 0 keep
// the preset's.
func TestLoadControlPresetOverrides(t *testing.T) {
	lc := LoadControlConfig{Enabled: true, Preset: "farm", Quantum: 4, Linger: caddy.Duration(time.Second), MaxQueue: 8}
	want := loadcontrol.Config{Enabled: true, Quantum: 4, Stagger: 15 * time.Second, FillMin: 0.92, FillMax: 0.98, Touch: true,
		Linger: time.Second, MaxQueue: 8}
	if got := lc.admission(); got != want {
		t.Errorf("farm with quantum 4, linger 1s, max_queue 8: %+v, want %+v", got, want)
	}
}

// max_num_seqs in force and where it came from: the config's, else the
// smallest --max-num-seqs of the launched processes, else vLLM's default.
func TestMaxNumSeqsSource(t *testing.T) {
	process := func(port string, flags ...string) ReplicaConfig {
		return ReplicaConfig{Process: &ProcessConfig{Command: append([]string{"vllm", "serve", "m", "--port", port}, flags...)}}
	}
	for _, c := range []struct {
		name   string
		cfg    ModelConfig
		n      int
		source string
	}{
		{"set", ModelConfig{MaxNumSeqs: 48, Replicas: []ReplicaConfig{process("1", "--max-num-seqs", "64")}}, 48, "config"},
		{"from the command lines", ModelConfig{Replicas: []ReplicaConfig{process("1", "--max-num-seqs", "64"), process("2", "--max_num_seqs=32"), process("3")}}, 32, "process"},
		{"from a server's command line", ModelConfig{Server: &ServerConfig{Process: &ProcessConfig{Command: []string{"vllm", "serve", "m", "--port", "1", "--data-parallel-size", "2", "--max-num-seqs", "128"}}}}, 128, "process"},
		{"launched without the flag", ModelConfig{Replicas: []ReplicaConfig{process("1")}}, 256, "vllm_default"},
		{"not launched", ModelConfig{Replicas: []ReplicaConfig{{Address: "127.0.0.1:1"}}}, 256, "vllm_default"},
	} {
		if err := c.cfg.provision("m"); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if c.cfg.maxNumSeqs != c.n || c.cfg.maxNumSeqsSource != c.source || c.cfg.fleetSpec(nil).Routing.MaxNumSeqs != c.n {
			t.Errorf("%s: max_num_seqs %d from %s (routing %d), want %d from %s", c.name, c.cfg.maxNumSeqs, c.cfg.maxNumSeqsSource, c.cfg.fleetSpec(nil).Routing.MaxNumSeqs, c.n, c.source)
		}
	}
}

func TestPolicyUnmarshalCaddyfile(t *testing.T) {
	// reverse_proxy hands the policy the tokens from its name on:
	// `lb_policy warden qwen3` arrives as "warden qwen3".
	var p Policy
	if err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser("warden qwen3")); err != nil || p.Model != "qwen3" {
		t.Errorf("warden qwen3: model %q, error %v", p.Model, err)
	}
	if err := new(Policy).UnmarshalCaddyfile(caddyfile.NewTestDispenser("warden qwen3 {\n}")); err != nil {
		t.Errorf("an empty block: %v", err)
	}
	for _, c := range []struct {
		input string
		line  int
		want  string
	}{
		{"warden", 1, "expected: lb_policy warden <model>"},
		{"warden qwen3 llama", 1, `lb_policy warden: unexpected argument "llama"`},
		{"warden qwen3 {\n\tspill_threshold 4\n}", 2, `lb_policy warden: unexpected block option "spill_threshold"; model options go in the global warden option`},
	} {
		wantParseErr(t, new(Policy).UnmarshalCaddyfile(caddyfile.NewTestDispenser(c.input)), c.line, c.want)
	}
}

func TestUpstreamsUnmarshalCaddyfile(t *testing.T) {
	// `dynamic warden qwen3` arrives as "warden qwen3".
	var u Upstreams
	if err := u.UnmarshalCaddyfile(caddyfile.NewTestDispenser("warden qwen3")); err != nil || u.Model != "qwen3" {
		t.Errorf("warden qwen3: model %q, error %v", u.Model, err)
	}
	for _, c := range []struct {
		input string
		line  int
		want  string
	}{
		{"warden", 1, "expected: dynamic warden <model>"},
		{"warden qwen3 127.0.0.1:1", 1, `dynamic warden: unexpected argument "127.0.0.1:1"`},
		{"warden qwen3 {\n\treplicas 127.0.0.1:1\n}", 2, `dynamic warden: unexpected block option "replicas"; model options go in the global warden option`},
	} {
		wantParseErr(t, new(Upstreams).UnmarshalCaddyfile(caddyfile.NewTestDispenser(c.input)), c.line, c.want)
	}
}

// The handlers without options refuse arguments and blocks, with the line.
func TestHandlersWithoutOptionsUnmarshalCaddyfileErrors(t *testing.T) {
	for _, c := range []struct {
		input string
		u     caddyfile.Unmarshaler
		line  int
		want  string
	}{
		{"warden_panel extra", new(Panel), 1, "wrong argument count or unexpected line ending after 'extra'"},
		{"warden_panel {\n\trefresh 1s\n}", new(Panel), 2, `warden_panel takes no options, found "refresh"`},
		{"warden_stop_reason extra", new(StopReason), 1, "wrong argument count or unexpected line ending after 'extra'"},
		{"warden_stop_reason {\n\tapis anthropic\n}", new(StopReason), 2, `warden_stop_reason takes no options, found "apis"`},
	} {
		wantParseErr(t, c.u.UnmarshalCaddyfile(caddyfile.NewTestDispenser(c.input)), c.line, c.want)
	}
}

// Through the caddyfile adapter, the sources and the panel are reached by
// the names a Caddyfile uses, and their errors come back with the line.
func TestDirectivesThroughTheAdapter(t *testing.T) {
	for _, c := range []struct{ site, want string }{
		{"reverse_proxy {\n\t\tdynamic warden\n\t\tlb_policy warden m\n\t}", "expected: dynamic warden <model>, at Caddyfile:10"},
		{"reverse_proxy 127.0.0.1:1 {\n\t\tlb_policy warden\n\t}", "expected: lb_policy warden <model>, at Caddyfile:10"},
		{"warden_panel extra", "wrong argument count or unexpected line ending after 'extra', at Caddyfile:9"},
		{"warden_stop_reason extra", "wrong argument count or unexpected line ending after 'extra', at Caddyfile:9"},
	} {
		input := "{\n\twarden {\n\t\tmodel m {\n\t\t\treplicas 127.0.0.1:1\n\t\t}\n\t}\n}\n:8080 {\n\t" + c.site + "\n}\n"
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(input), nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.site, err, c.want)
		}
	}
}

// The JSON form's kv_events is checked at load, with the model's name.
func TestKVEventsValidate(t *testing.T) {
	for _, c := range []struct {
		replica ReplicaConfig
		server  *ServerConfig
		want    string
	}{
		{ReplicaConfig{Address: "127.0.0.1:1", KVEvents: &KVEventsConfig{Endpoint: "tcp://127.0.0.1:5557"}}, nil, ""},
		{ReplicaConfig{Address: "127.0.0.1:1", KVEvents: &KVEventsConfig{Endpoint: "127.0.0.1:5557"}}, nil,
			`model "m": kv_events of 127.0.0.1:1: kvevents: endpoint "127.0.0.1:5557" must be tcp://host:port`},
		{ReplicaConfig{}, &ServerConfig{Address: "127.0.0.1:1", Ranks: 2, KVEvents: &KVEventsConfig{Endpoint: "tcp://:5557"}},
			`is where vLLM binds`},
		{ReplicaConfig{}, &ServerConfig{Address: "127.0.0.1:1", Ranks: 3, KVEvents: &KVEventsConfig{Endpoint: "tcp://127.0.0.1:65534"}},
			`model "m": kv_events of 127.0.0.1:1#2: kvevents: endpoint "tcp://127.0.0.1:65536" must be tcp://host:port, the port in 1-65535`},
	} {
		m := ModelConfig{Server: c.server}
		if c.server == nil {
			m.Replicas = []ReplicaConfig{c.replica}
		}
		err := m.validate("m")
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v %+v: %v, want %q", c.replica, c.server, err, c.want)
		}
	}
}
