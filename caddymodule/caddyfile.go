package caddymodule

import (
	"encoding/json"
	"net"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/lmwarden/caddy-warden/kvevents"
	"github.com/lmwarden/caddy-warden/metricsfeed"
	"github.com/lmwarden/caddy-warden/selection"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("warden", parseGlobalOption)
}

// parseGlobalOption sets up the warden app from the global options block:
//
//	warden {
//		pin_store local|redis {              # pins shared by Caddy instances
//			address <host:port>
//			username <name>
//			password <password>              # e.g. {env.REDIS_PASSWORD}
//			db <n>
//			key_prefix <prefix>
//			timeout <duration>
//			sync_interval <duration>
//			tls_enabled [on|off]
//			tls_insecure [on|off]
//		}
//		model <name> {
//			replicas <host:port>...          # one vLLM server per replica
//			replica [<host:port>] {           # or one at a time, launched by Caddy
//				process <command> <args>...   # e.g. vllm serve MODEL --port 8001
//				env <name> <value>
//				dir <path>
//				startup_timeout <duration>
//				stop_grace <duration>
//				kv_events tcp://<host:port> [<topic>]  # where it publishes its KV cache events
//			}
//			server <host:port> ranks <n>      # or one server with internal DP
//			server [<host:port> ranks <n>] { process ... kv_events ... }
//			max_num_seqs <n>
//			spill_threshold auto|<n>
//			affinity on|off
//			session_headers <header>...
//			session_from_body [on|off]
//			fingerprint on|off
//			subagents on|off
//			compaction on|off
//			compaction_interval <duration>
//			body_scan_bytes <n>
//			client_pinning on|off
//			session_ttl <duration>
//			active_window <duration>
//			max_sessions <n>
//			metrics_interval <duration>
//			pin_snapshot_interval <duration>|off
//			pin_store local|redis { ... }    # overrides the app's
//			load_control [on|off] {          # hold turns that do not fit in the KV caches
//				fill <share>                 # of each replica's KV capacity (default 0.95)
//				fill_range <min> <max>|off   # each replica's fill follows its residents' hits (default off)
//				linger <duration>            # residency after a turn (default 6s)
//				max_wait <duration>          # then the turn proceeds (default 5m)
//				max_queue <n>                # then turns are refused, 503 (default 1024)
//				capacity_tokens <n>          # per replica; 0 reads /metrics
//				quantum <turns>|off          # turns before a resident yields to waiting ones (default 3)
//				stagger <duration>|off       # between a filling replica's new conversations (default off)
//				min_residents <n>            # conversations a replica takes however large (default 2)
//				touch on|off                 # a replica a resident left waits for its idle residents (default off)
//			}
//		}
//	}
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	app := &App{Models: map[string]*ModelConfig{}}
	if existing != nil { // warden blocks repeated
		prev, ok := existing.(httpcaddyfile.App)
		if !ok {
			return nil, d.Errf("unexpected earlier warden option of type %T", existing)
		}
		if err := json.Unmarshal(prev.Value, app); err != nil {
			return nil, d.Errf("merging an earlier warden option: %v", err)
		}
	}
	d.Next() // option name
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	for d.NextBlock(0) {
		if d.Val() == "pin_store" {
			if app.PinStore != nil {
				return nil, d.Err("pin_store declared twice")
			}
			var err error
			if app.PinStore, err = parsePinStore(d); err != nil {
				return nil, err
			}
			continue
		}
		if d.Val() != "model" {
			return nil, d.Errf("unrecognized warden option %q; expected model or pin_store", d.Val())
		}
		var name string
		if !d.Args(&name) {
			return nil, d.Err("model needs a name: model <name> { ... }")
		}
		if _, dup := app.Models[name]; dup {
			return nil, d.Errf("model %q declared twice", name)
		}
		m, err := parseModel(d)
		if err != nil {
			return nil, err
		}
		if err := m.provision(name); err != nil {
			return nil, d.Err(err.Error())
		}
		if err := m.validate(name); err != nil {
			return nil, d.Err(err.Error())
		}
		app.Models[name] = m
	}
	return httpcaddyfile.App{Name: "warden", Value: caddyconfig.JSON(app, nil)}, nil
}

// givenOnce holds the options of a block met so far, so that one given
// twice fails with its line instead of the last silently winning; an
// option mapped to false may come again.
type givenOnce map[string]bool

func (g givenOnce) check(d *caddyfile.Dispenser, opt string) error {
	once, met := g[opt]
	if met && once {
		return d.Errf("%s given twice", opt)
	}
	if !met {
		g[opt] = true
	}
	return nil
}

// parseModel reads a model block. Affinity is always written, so that the
// config API can PATCH it.
func parseModel(d *caddyfile.Dispenser) (*ModelConfig, error) {
	on := true
	m := &ModelConfig{Affinity: &on}
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	given := givenOnce{"replicas": false, "replica": false} // these add up
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if err := given.check(d, opt); err != nil {
			return nil, err
		}
		var err error
		switch opt {
		case "replicas":
			addrs := d.RemainingArgs()
			if len(addrs) == 0 {
				return nil, d.Err("replicas needs at least one host:port")
			}
			for _, a := range addrs {
				if err := checkAddress(d, a); err != nil {
					return nil, err
				}
				m.Replicas = append(m.Replicas, ReplicaConfig{Address: a})
			}
		case "replica":
			var r ReplicaConfig
			if d.Args(&r.Address) {
				if err := checkAddress(d, r.Address); err != nil {
					return nil, err
				}
			}
			r.Process, r.KVEvents, err = parseServerBlock(d)
			m.Replicas = append(m.Replicas, r)
		case "server":
			m.Server, err = parseServer(d)
		case "max_num_seqs":
			m.MaxNumSeqs, err = positiveInt(d)
		case "spill_threshold":
			err = parseSpillThreshold(d, m)
		case "affinity":
			var on bool
			on, err = onOff(d)
			m.Affinity = &on
		case "rule":
			return nil, d.Err("rule was removed: the default rule (seed) is the only one, delete the line; cachefit was an experiment (docs/policy.md)")
		case "session_headers":
			m.SessionHeaders = d.RemainingArgs()
			if len(m.SessionHeaders) == 0 {
				return nil, d.Err("session_headers needs at least one header name")
			}
		case "session_from_body":
			m.SessionFromBody, err = optionalOnOffPtr(d)
		case "fingerprint":
			m.Fingerprint, err = onOffPtr(d)
		case "subagents":
			m.Subagents, err = onOffPtr(d)
		case "compaction":
			m.Compaction, err = onOffPtr(d)
		case "compaction_interval":
			m.CompactionInterval, err = duration(d)
		case "body_scan_bytes":
			m.BodyScanBytes, err = positiveInt(d)
		case "client_pinning":
			m.ClientPinning, err = onOff(d)
		case "session_ttl":
			m.SessionTTL, err = duration(d)
		case "active_window":
			m.ActiveWindow, err = duration(d)
		case "max_sessions":
			m.MaxSessions, err = positiveInt(d)
			if err == nil && m.MaxSessions < selection.MinMaxSessions {
				err = d.Errf("max_sessions must be at least %d", selection.MinMaxSessions)
			}
		case "metrics_interval":
			m.MetricsInterval, err = duration(d)
		case "pin_snapshot_interval":
			m.PinSnapshotInterval, err = durationOrOff(d)
		case "pin_store":
			m.PinStore, err = parsePinStore(d)
		case "load_control":
			m.LoadControl, err = parseLoadControl(d)
		default:
			return nil, d.Errf("unrecognized model option %q", opt)
		}
		if err != nil {
			return nil, err
		}
		if d.NextArg() {
			return nil, d.Errf("%s: unexpected argument %q", opt, d.Val())
		}
	}
	return m, nil
}

// parseServer reads `server <host:port> ranks <n>`, whose address and ranks
// may be left out when a process block gives --port and --data-parallel-size.
func parseServer(d *caddyfile.Dispenser) (*ServerConfig, error) {
	srv := &ServerConfig{}
	args := d.RemainingArgs()
	switch {
	case len(args) == 3 && args[1] == "ranks":
		ranks, err := strconv.Atoi(args[2])
		if err != nil || ranks < 1 || ranks > metricsfeed.MaxEngines {
			return nil, d.Errf("ranks: expected an integer from 1 to %d, got %q", metricsfeed.MaxEngines, args[2])
		}
		if err := checkAddress(d, args[0]); err != nil {
			return nil, err
		}
		srv.Address, srv.Ranks = args[0], ranks
	case len(args) == 0: // from the process block
	default:
		return nil, d.Err("expected: server <host:port> ranks <n>")
	}
	var err error
	srv.Process, srv.KVEvents, err = parseServerBlock(d)
	if err == nil && srv.Address == "" && srv.Process == nil {
		err = d.Err("expected: server <host:port> ranks <n>, or a block with a process")
	}
	return srv, err
}

// parseServerBlock reads the optional block of a replica or server: the
// process the app launches, and where the server publishes its KV cache
// events.
func parseServerBlock(d *caddyfile.Dispenser) (*ProcessConfig, *KVEventsConfig, error) {
	var p *ProcessConfig
	var events *KVEventsConfig
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if opt == "kv_events" {
			if events != nil {
				return nil, nil, d.Err("kv_events given twice")
			}
			events = &KVEventsConfig{}
			if !d.Args(&events.Endpoint) {
				return nil, nil, d.Err("kv_events: expected the publisher's endpoint, tcp://host:port, and optionally its topic")
			}
			if err := kvevents.CheckEndpoint(events.Endpoint); err != nil {
				return nil, nil, d.Errf("kv_events: %v", err)
			}
			d.Args(&events.Topic)
			if d.NextArg() {
				return nil, nil, d.Errf("kv_events: unexpected argument %q", d.Val())
			}
			continue
		}
		if p == nil {
			p = &ProcessConfig{}
		}
		if err := parseProcessOption(d, p, opt); err != nil {
			return nil, nil, err
		}
	}
	if p != nil && len(p.Command) == 0 {
		return nil, nil, d.Err("the block needs a process line")
	}
	return p, events, nil
}

// parseProcessOption reads one option of a launched server.
func parseProcessOption(d *caddyfile.Dispenser, p *ProcessConfig, opt string) error {
	var err error
	switch opt {
	case "process":
		p.Command = d.RemainingArgs()
		if len(p.Command) == 0 {
			return d.Err("process: expected a command, e.g. process vllm serve MODEL --port 8001")
		}
	case "env":
		var name, value string
		if !d.Args(&name, &value) {
			return d.Err("env: expected a name and a value")
		}
		if p.Env == nil {
			p.Env = map[string]string{}
		}
		p.Env[name] = value
	case "dir":
		if !d.Args(&p.Dir) {
			return d.Err("dir: expected a directory")
		}
	case "startup_timeout":
		p.StartupTimeout, err = duration(d)
	case "stop_grace":
		p.StopGrace, err = duration(d)
	default:
		return d.Errf("unrecognized option %q; expected process, env, dir, startup_timeout, stop_grace or kv_events", opt)
	}
	if err != nil {
		return err
	}
	if d.NextArg() {
		return d.Errf("%s: unexpected argument %q", opt, d.Val())
	}
	return nil
}

func parseSpillThreshold(d *caddyfile.Dispenser, m *ModelConfig) error {
	if !d.NextArg() {
		return d.Err("spill_threshold: expected auto or a positive integer")
	}
	if d.Val() == "auto" {
		m.SpillThreshold = 0
		return nil
	}
	n, err := strconv.Atoi(d.Val())
	if err != nil || n < 1 {
		return d.Errf("spill_threshold: expected auto or a positive integer, got %q", d.Val())
	}
	m.SpillThreshold = n
	return nil
}

func positiveInt(d *caddyfile.Dispenser) (int, error) {
	return argument(d, "a positive integer", func(s string) (int, bool) {
		n, err := strconv.Atoi(s)
		return n, err == nil && n >= 1
	})
}

// argument reads the option's one argument with parse, which reports
// whether it is valid; expected says what is, in the error.
func argument[T any](d *caddyfile.Dispenser, expected string, parse func(string) (T, bool)) (T, error) {
	opt := d.Val()
	var zero T
	if !d.NextArg() {
		return zero, d.Errf("%s: expected %s", opt, expected)
	}
	v, ok := parse(d.Val())
	if !ok {
		return zero, d.Errf("%s: expected %s, got %q", opt, expected, d.Val())
	}
	return v, nil
}

func onOff(d *caddyfile.Dispenser) (bool, error) {
	opt := d.Val()
	if !d.NextArg() {
		return false, d.Errf("%s: expected on or off", opt)
	}
	switch d.Val() {
	case "on":
		return true, nil
	case "off":
		return false, nil
	}
	return false, d.Errf("%s: expected on or off, got %q", opt, d.Val())
}

// optionalOnOff reads a flag that means on when given alone.
func optionalOnOff(d *caddyfile.Dispenser) (bool, error) {
	if d.CountRemainingArgs() == 0 {
		return true, nil
	}
	return onOff(d)
}

func onOffPtr(d *caddyfile.Dispenser) (*bool, error) {
	on, err := onOff(d)
	return &on, err
}

func optionalOnOffPtr(d *caddyfile.Dispenser) (*bool, error) {
	on, err := optionalOnOff(d)
	return &on, err
}

func duration(d *caddyfile.Dispenser) (caddy.Duration, error) {
	opt := d.Val()
	if !d.NextArg() {
		return 0, d.Errf("%s: expected a duration such as 30s or 5m", opt)
	}
	v, err := caddy.ParseDuration(d.Val())
	if err != nil || v <= 0 {
		return 0, d.Errf("%s: expected a positive duration such as 30s or 5m, got %q", opt, d.Val())
	}
	return caddy.Duration(v), nil
}

// durationOrOff reads a duration, or off (or 0), written as 0.
func durationOrOff(d *caddyfile.Dispenser) (*caddy.Duration, error) {
	opt := d.Val()
	if !d.NextArg() {
		return nil, d.Errf("%s: expected a duration such as 30s, or off", opt)
	}
	var v time.Duration
	if d.Val() != "off" {
		var err error
		if v, err = caddy.ParseDuration(d.Val()); err != nil || v < 0 {
			return nil, d.Errf("%s: expected a duration such as 30s, or off, got %q", opt, d.Val())
		}
	}
	out := caddy.Duration(v)
	return &out, nil
}

// checkAddress reports a replica address that is not host:port at its line.
func checkAddress(d *caddyfile.Dispenser, addr string) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return d.Errf("address %q: want host:port: %v", addr, err)
	}
	return nil
}

// parseModelName reads `<directive> <model>` with nothing else, for the
// modules that name a model of the global warden option.
func parseModelName(d *caddyfile.Dispenser, directive string) (string, error) {
	d.Next() // the module's name
	var model string
	if !d.Args(&model) {
		return "", d.Errf("expected: %s <model>", directive)
	}
	if d.NextArg() {
		return "", d.Errf("%s: unexpected argument %q", directive, d.Val())
	}
	if d.NextBlock(0) {
		return "", d.Errf("%s: unexpected block option %q; model options go in the global warden option", directive, d.Val())
	}
	return model, nil
}
