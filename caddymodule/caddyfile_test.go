package caddymodule

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/lmwarden/caddy-warden/selection"
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
		{wardenOption("replicas 127.0.0.1:1\n\t\tsession_ttl soon"), 4, `session_ttl: expected a positive duration such as 30s or 5m, got "soon"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tsession_ttl"), 4, "session_ttl: expected a duration such as 30s or 5m"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tactive_window -1m"), 4, `active_window: expected a positive duration such as 30s or 5m, got "-1m"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tbogus 1"), 4, `unrecognized model option "bogus"`},
		{wardenOption("max_num_seqs 32"), 4, `model "m": needs replicas or a server`},
		{wardenOption("replicas 127.0.0.1:1\n\t\trule seed"), 4, "rule was removed: the default rule (seed) is the only one, delete the line"},
		{wardenOption("replicas 127.0.0.1:1\n\t\trule cachefit"), 4, "cachefit was an experiment"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tmax_sessions 10"), 4, `max_sessions must be at least 64`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tsession_headers"), 4, "session_headers needs at least one header name"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tsession_from_body maybe"), 4, `session_from_body: expected on or off, got "maybe"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tfingerprint"), 4, "fingerprint: expected on or off"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tsubagents yes"), 4, `subagents: expected on or off, got "yes"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tcompaction on off"), 4, `compaction: unexpected argument "off"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tmax_num_seqs 8 16"), 4, `max_num_seqs: unexpected argument "16"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tclient_pinning on off"), 4, `client_pinning: unexpected argument "off"`},
		{wardenOption("replica {\n\t\t\tprocess\n\t\t}"), 4, "process: expected a command, e.g. process vllm serve MODEL --port 8001"},
		{wardenOption("replica {\n\t\t\tenv ONLY_NAME\n\t\t}"), 4, "env: expected a name and a value"},
		{wardenOption("replica {\n\t\t\tprocess vllm serve m\n\t\t}"), 6, "process [vllm serve m]: give the replica an address or the command a --port"},
		{wardenOption("replica 127.0.0.1:1 {\n\t\t\tdir /tmp\n\t\t}"), 5, "the block needs a process line"},
		{wardenOption("replica {\n\t\t\tprocess vllm serve m --port x\n\t\t}"), 6, "--port"},
		{wardenOption("replica {\n\t\t\tprocess vllm serve m --port 1\n\t\t\tdir\n\t\t}"), 5, "dir: expected a directory"},
		{wardenOption("replica {\n\t\t\tprocess vllm serve m --port 1\n\t\t\tstop_grace never\n\t\t}"), 5, `stop_grace: expected a positive duration such as 30s or 5m, got "never"`},
		{wardenOption("replica {\n\t\t\tprocess vllm serve m --port 1\n\t\t\tuser vllm\n\t\t}"), 5,
			`unrecognized option "user"; expected process, env, dir, startup_timeout, stop_grace or kv_events`},
		{wardenOption("replica {\n\t\t\tprocess vllm serve m --port 1\n\t\t\tdir /a /b\n\t\t}"), 5, `dir: unexpected argument "/b"`},
		{wardenOption("replica 127.0.0.1:1 {\n\t\t\tkv_events\n\t\t}"), 4, "kv_events: expected the publisher's endpoint, tcp://host:port, and optionally its topic"},
		{wardenOption("replica 127.0.0.1:1 {\n\t\t\tkv_events tcp://*:5557\n\t\t}"), 4, `kv_events: kvevents: endpoint "tcp://*:5557" is where vLLM binds; give the host to connect to, e.g. tcp://127.0.0.1:5557`},
		{wardenOption("replica 127.0.0.1:1 {\n\t\t\tkv_events ipc:///tmp/kv\n\t\t}"), 4, `must be tcp://host:port`},
		{wardenOption("replica 127.0.0.1:1 {\n\t\t\tkv_events tcp://127.0.0.1:5557 topic extra\n\t\t}"), 4, `kv_events: unexpected argument "extra"`},
		{wardenOption("replica 127.0.0.1:1 {\n\t\t\tkv_events tcp://127.0.0.1:70000\n\t\t}"), 4, `the port in 1-65535`},
		{wardenOption("replica 127.0.0.1:1 {\n\t\t\tkv_events tcp://127.0.0.1:1\n\t\t\tkv_events tcp://127.0.0.1:2\n\t\t}"), 5, "kv_events given twice"},
		{wardenOption("server 127.0.0.1:1 ranks 2\n\t\tserver 127.0.0.1:2 ranks 4"), 4, "server given twice"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tfill 0.5\n\t\t}\n\t\tload_control off"), 7, "load_control given twice"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tsession_headers A\n\t\tsession_headers B"), 5, "session_headers given twice"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tspill_threshold 5\n\t\tspill_threshold auto"), 5, "spill_threshold given twice"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tmax_num_seqs 8\n\t\tmax_num_seqs 16"), 5, "max_num_seqs given twice"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tfill 0.9\n\t\t\tfill 0.8\n\t\t}"), 6, "fill given twice"},
		{wardenOption("replicas 127.0.0.1:1\n\t\treplicas 127.0.0.1:2\n\t\treplicas"), 5, "replicas needs at least one host:port"}, // replicas add up
		// As hostile_test.go TestCaddyfileErrorsNameTheLine expects.
		{wardenOption("replicas 127.0.0.1:1\n\t\tmax_sessions -5"), 4, `max_sessions: expected a positive integer, got "-5"`},
		{wardenOption("replicas 127.0.0.1:1\n\n\t\tmetrics_interval 0s"), 5, `metrics_interval: expected a positive duration such as 30s or 5m, got "0s"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tclient_pinning yes"), 4, `client_pinning: expected on or off, got "yes"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tbody_scan_bytes 64k"), 4, `body_scan_bytes: expected a positive integer, got "64k"`},
		{"warden {\n\tnot_a_model\n}", 2, `unrecognized warden option "not_a_model"; expected model`},
		// The shared pin store, in the warden block or a model.
		{"warden {\n\tpin_store memcached\n}", 2, `pin_store: expected local or redis, got "memcached"`},
		{"warden {\n\tpin_store\n}", 2, "pin_store: expected local or redis"},
		{"warden {\n\tpin_store local {\n\t\taddress 127.0.0.1:1\n\t}\n}", 3, "pin_store local takes no block"},
		{"warden {\n\tpin_store redis 127.0.0.1:6379\n}", 2, `pin_store redis: unexpected argument "127.0.0.1:6379"; options go in its block`},
		{"warden {\n\tpin_store redis {\n\t\taddress localhost\n\t}\n}", 3, `address "localhost": want host:port`},
		{"warden {\n\tpin_store redis {\n\t\tdb one\n\t}\n}", 3, `db: expected a database number (0, 1, ...), got "one"`},
		{"warden {\n\tpin_store redis {\n\t\ttimeout soon\n\t}\n}", 3, `timeout: expected a positive duration such as 30s or 5m, got "soon"`},
		{"warden {\n\tpin_store redis {\n\t\tport 6379\n\t}\n}", 3, `unrecognized pin_store redis option "port"; expected address, username, password`},
		{"warden {\n\tpin_store redis {\n\t\tpassword\n\t}\n}", 3, "password: expected a value"},
		{"warden {\n\tpin_store local\n\tpin_store local\n}", 3, "pin_store declared twice"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tpin_store redis {\n\t\t\ttls_enabled maybe\n\t\t}"), 5, `expected on, off, true or false, got "maybe"`},
		// Load control.
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control maybe"), 4, `load_control: expected on or off, got "maybe"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control on off"), 4, `load_control: unexpected argument "off"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tfill 0\n\t\t}"), 5, `fill: expected a positive number such as 1.2, got "0"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tfill lots\n\t\t}"), 5, `fill: expected a positive number such as 1.2, got "lots"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tquantum 0\n\t\t}"), 5, `quantum: expected a number of turns, or off, got "0"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tfill\n\t\t}"), 5, "fill: expected a positive number such as 1.2"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tlinger 0s\n\t\t}"), 5, `linger: expected a positive duration such as 30s or 5m, got "0s"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tmax_wait forever\n\t\t}"), 5, `max_wait: expected a positive duration such as 30s or 5m, got "forever"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tmax_queue 0\n\t\t}"), 5, `max_queue: expected a positive integer, got "0"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tcapacity_tokens -1\n\t\t}"), 5, `capacity_tokens: expected a number of tokens, or 0 to read it from /metrics, got "-1"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tmax_queue 5 6\n\t\t}"), 5, `max_queue: unexpected argument "6"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tqueue 5\n\t\t}"), 5,
			`unrecognized load_control option "queue"; expected fill, fill_range, linger, max_wait, max_queue, capacity_tokens, quantum, stagger, min_residents or touch`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tfill_range 0.9\n\t\t}"), 5, `fill_range: expected two shares such as 0.92 0.98, lower first, or off, got "0.9"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tfill_range 0.9 lots\n\t\t}"), 5, `fill_range: expected two shares such as 0.92 0.98, lower first, or off, got "0.9 lots"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tfill_range 0.98 0.92\n\t\t}"), 5, `fill_range: expected two shares such as 0.92 0.98, lower first, or off, got "0.98 0.92"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tfill_range 0.97 0.99\n\t\t}"), 5, "fill_range: 0.97 0.99 must hold fill (0.95)"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tfill_range 0.5 0.9\n\t\t\tfill 0.95\n\t\t}"), 5, "fill_range: 0.5 0.9 must hold fill (0.95)"},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\ttouch maybe\n\t\t}"), 5, `touch: expected on or off, got "maybe"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tstagger soon\n\t\t}"), 5, `stagger: expected a duration such as 30s, or off, got "soon"`},
		{wardenOption("replicas 127.0.0.1:1\n\t\tload_control {\n\t\t\tmin_residents 0\n\t\t}"), 5, `min_residents: expected a positive integer, got "0"`},
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
	if m.Affinity == nil || !*m.Affinity || m.SpillThreshold != 0 || m.SessionFromBody != nil || m.Fingerprint != nil || m.ClientPinning {
		t.Errorf("defaults: %+v", m)
	}
	if m := parse(t, "replicas 127.0.0.1:1\n\t\tsession_from_body"); m.SessionFromBody == nil || !*m.SessionFromBody {
		t.Error("session_from_body alone is not on")
	}
	if m := parse(t, "replicas 127.0.0.1:1\n\t\tsession_from_body off"); m.SessionFromBody == nil || *m.SessionFromBody {
		t.Error("session_from_body off is on")
	}
	m = parse(t, "replicas 127.0.0.1:1\n\t\tfingerprint off\n\t\tsubagents off\n\t\tcompaction on")
	if m.Fingerprint == nil || *m.Fingerprint || m.Subagents == nil || *m.Subagents || m.Compaction == nil || !*m.Compaction {
		t.Errorf("fingerprint off, subagents off, compaction on: %v %v %v", m.Fingerprint, m.Subagents, m.Compaction)
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
	if ev := m.kvEvents(); len(ev) != 1 || ev["127.0.0.1:7001"] != (KVEventsConfig{Endpoint: "tcp://127.0.0.1:5557", Topic: "kv-events"}) || m.Replicas[0].Process != nil {
		t.Errorf("a replica's kv_events: %+v, process %+v", ev, m.Replicas[0].Process)
	}
	m = parse(t, "server 127.0.0.1:7000 ranks 2 {\n\t\t\tkv_events tcp://127.0.0.1:5557\n\t\t}")
	if ev := m.kvEvents(); len(ev) != 2 || ev["127.0.0.1:7000#0"].Endpoint != "tcp://127.0.0.1:5557" || ev["127.0.0.1:7000#1"].Endpoint != "tcp://127.0.0.1:5558" {
		t.Errorf("a server's kv_events: %+v", ev)
	}
}

// load_control alone, on, off and a block, as the routing core gets them.
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
		want  selection.AdmissionConfig
	}{
		{"load_control", selection.AdmissionConfig{Enabled: true}},
		{"load_control on", selection.AdmissionConfig{Enabled: true}},
		{"load_control off", selection.AdmissionConfig{}},
		{"load_control {\n\t\t\tfill 0.9\n\t\t\tlinger 10s\n\t\t\tmax_wait 1m\n\t\t\tmax_queue 16\n\t\t\tcapacity_tokens 40000\n\t\t}",
			selection.AdmissionConfig{Enabled: true, Fill: 0.9, Linger: 10 * time.Second, MaxWait: time.Minute, MaxQueue: 16, CapacityTokens: 40000}},
		{"load_control off {\n\t\t\tmax_queue 16\n\t\t}", selection.AdmissionConfig{MaxQueue: 16}},
		{"load_control {\n\t\t\tfill 1\n\t\t\tquantum off\n\t\t\tstagger 15s\n\t\t\tmin_residents 3\n\t\t}",
			selection.AdmissionConfig{Enabled: true, Fill: 1, Quantum: -1, Stagger: 15 * time.Second, MinResidents: 3}},
		{"load_control {\n\t\t\tstagger off\n\t\t\tfill_range off\n\t\t\ttouch off\n\t\t}", selection.AdmissionConfig{Enabled: true}},
		{"load_control {\n\t\t\tquantum off\n\t\t\tstagger 15s\n\t\t\tfill_range 0.92 0.98\n\t\t\ttouch on\n\t\t}",
			selection.AdmissionConfig{Enabled: true, Quantum: -1, Stagger: 15 * time.Second, FillMin: 0.92, FillMax: 0.98, Touch: true}},
	} {
		if got := parse(t, c.lines).admission(); got != c.want {
			t.Errorf("%q: %+v, want %+v", c.lines, got, c.want)
		}
	}
	var absent *LoadControlConfig
	if got := absent.admission(); got.Enabled {
		t.Error("no load_control line turns it on")
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
	} {
		m := &ModelConfig{Replicas: []ReplicaConfig{{Address: "127.0.0.1:1"}}, LoadControl: &c.lc}
		err := m.validate("m")
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: error %v, want %q", c.lc, err, c.want)
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
