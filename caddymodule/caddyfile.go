package caddymodule

import (
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/lmwarden/caddy-warden/kvevents"
	"github.com/lmwarden/caddy-warden/metricsfeed"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("warden", parseGlobalOption)
}

// parseGlobalOption sets up the warden app from the global options block;
// README.md's "Syntax" lists every option with its default:
//
//	warden {
//		pin_store local|redis {
//			address <host:port>
//			username <name>
//			password <password>
//			db <n>
//			key_prefix <prefix>
//			timeout <duration>
//			tls_enabled on|off
//		}
//		model <name> {
//			aliases <name>...
//			replicas <host:port>...
//			replica [<host:port>] {
//				process <command> <args>...
//				env <name> <value>
//				dir <path>
//				kv_events tcp://<host:port> [<topic>]
//			}
//			server <host:port> ranks <n>
//			server [<host:port> ranks <n>] { ... as replica }
//			max_num_seqs <n>
//			spill_threshold auto|<n>
//			affinity on|off
//			fingerprint on|off
//			load_control off|on|farm
//			pin_store local|redis { ... }
//		}
//	}
//
// The fine settings are JSON fields of the app (docs/configuration.md); a
// Caddyfile option that became one fails at load and says so.
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
	err := parseBlock(d, "warden", map[string]option{
		"pin_store": {parse: func(d *caddyfile.Dispenser) (err error) {
			if app.PinStore != nil {
				return d.Err("pin_store given twice")
			}
			app.PinStore, err = parsePinStore(d)
			return err
		}},
		"model": {repeats: true, parse: func(d *caddyfile.Dispenser) error {
			var name string
			if !d.Args(&name) {
				return d.Err("model needs a name: model <name> { ... }")
			}
			if _, dup := app.Models[name]; dup {
				return d.Errf("model %q declared twice", name)
			}
			m, err := parseModel(d)
			if err != nil {
				return err
			}
			if err := m.provision(name); err != nil {
				return d.Err(err.Error())
			}
			if err := m.validate(name); err != nil {
				return d.Err(err.Error())
			}
			app.Models[name] = m
			if err := checkModelNames(app.Models); err != nil {
				return d.Err(err.Error())
			}
			return nil
		}},
	}, nil)
	if err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "warden", Value: caddyconfig.JSON(app, nil)}, nil
}

// option reads one option of a block: its arguments, and its own block if
// it has one.
type option struct {
	parse func(d *caddyfile.Dispenser) error
	// repeats: the option may be given again, its values adding up.
	repeats bool
}

// parseBlock reads the block that opens at d's current line with the
// options it accepts. An option that is unknown, given twice (unless it
// repeats) or given an argument too many fails at its line with what was
// expected; one named in removed fails with what replaced it.
func parseBlock(d *caddyfile.Dispenser, block string, options map[string]option, removed map[string]string) error {
	given := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		opt, known := options[name]
		switch {
		case !known && removed[name] != "":
			return d.Err(removed[name])
		case !known:
			return d.Errf("unrecognized %s option %q; expected %s", block, name, oneOf(options))
		case given[name] && !opt.repeats:
			return d.Errf("%s given twice", name)
		}
		given[name] = true
		if err := opt.parse(d); err != nil {
			return err
		}
		if d.NextArg() {
			return d.Errf("%s: unexpected argument %q", name, d.Val())
		}
	}
	return nil
}

// oneOf lists the options' names for an error: "a, b or c".
func oneOf(options map[string]option) string {
	names := make([]string, 0, len(options))
	for name := range options {
		names = append(names, name)
	}
	slices.Sort(names)
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// jsonField is the error for a Caddyfile option that became a JSON field of
// the model (the same name, the same meaning), documented in doc.
func jsonField(name, doc string) string {
	return fmt.Sprintf("%s is no longer a Caddyfile option: set %q in the model's JSON (apps.warden.models.<model>), see %s", name, name, doc)
}

// removedModelOptions are the model options a Caddyfile no longer takes,
// with what replaced them (CHANGELOG.md).
var removedModelOptions = map[string]string{
	"rule":                  "rule was removed: the default rule (seed) is the only one, delete the line",
	"session_headers":       jsonField("session_headers", "docs/agents.md"),
	"session_from_body":     jsonField("session_from_body", "docs/agents.md"),
	"subagents":             jsonField("subagents", "docs/agents.md"),
	"compaction":            jsonField("compaction", "docs/agents.md"),
	"compaction_interval":   jsonField("compaction_interval", "docs/agents.md"),
	"body_scan_bytes":       jsonField("body_scan_bytes", "docs/agents.md"),
	"client_pinning":        jsonField("client_pinning", "docs/configuration.md"),
	"session_ttl":           jsonField("session_ttl", "docs/configuration.md"),
	"active_window":         jsonField("active_window", "docs/configuration.md"),
	"max_sessions":          jsonField("max_sessions", "docs/configuration.md"),
	"metrics_interval":      jsonField("metrics_interval", "docs/configuration.md"),
	"pin_snapshot_interval": jsonField("pin_snapshot_interval", "docs/shared-pins.md"),
}

// parseModel reads a model block. Affinity is always written, so that the
// config API can PATCH it.
func parseModel(d *caddyfile.Dispenser) (*ModelConfig, error) {
	on := true
	m := &ModelConfig{Affinity: &on}
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	err := parseBlock(d, "model", map[string]option{
		"replicas": {repeats: true, parse: func(d *caddyfile.Dispenser) error {
			addrs := d.RemainingArgs()
			if len(addrs) == 0 {
				return d.Err("replicas needs at least one host:port")
			}
			for _, a := range addrs {
				if err := checkAddress(d, a); err != nil {
					return err
				}
				m.Replicas = append(m.Replicas, ReplicaConfig{Address: a})
			}
			return nil
		}},
		"replica": {repeats: true, parse: func(d *caddyfile.Dispenser) (err error) {
			var r ReplicaConfig
			if d.Args(&r.Address) {
				if err := checkAddress(d, r.Address); err != nil {
					return err
				}
			}
			r.Process, r.KVEvents, err = parseServerBlock(d)
			m.Replicas = append(m.Replicas, r)
			return err
		}},
		"server": {parse: func(d *caddyfile.Dispenser) (err error) {
			m.Server, err = parseServer(d)
			return err
		}},
		"aliases": {repeats: true, parse: func(d *caddyfile.Dispenser) error {
			names := d.RemainingArgs()
			if len(names) == 0 {
				return d.Err("aliases: expected at least one name, as vllm serve --served-model-name gives them")
			}
			m.Aliases = append(m.Aliases, names...)
			return nil
		}},
		"max_num_seqs": {parse: func(d *caddyfile.Dispenser) (err error) {
			m.MaxNumSeqs, err = positiveInt(d)
			return err
		}},
		"spill_threshold": {parse: func(d *caddyfile.Dispenser) (err error) {
			m.SpillThreshold, err = argument(d, "auto or a positive integer", func(s string) (int, bool) {
				if s == "auto" {
					return 0, true
				}
				n, err := strconv.Atoi(s)
				return n, err == nil && n >= 1
			})
			return err
		}},
		"affinity": {parse: func(d *caddyfile.Dispenser) (err error) {
			m.Affinity, err = onOffPtr(d)
			return err
		}},
		"fingerprint": {parse: func(d *caddyfile.Dispenser) (err error) {
			m.Fingerprint, err = onOffPtr(d)
			return err
		}},
		"load_control": {parse: func(d *caddyfile.Dispenser) (err error) {
			m.LoadControl, err = parseLoadControl(d)
			return err
		}},
		"pin_store": {parse: func(d *caddyfile.Dispenser) (err error) {
			m.PinStore, err = parsePinStore(d)
			return err
		}},
	}, removedModelOptions)
	return m, err
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

// removedProcessOptions are the options of a replica or server block a
// Caddyfile no longer takes.
var removedProcessOptions = map[string]string{
	"startup_timeout": processField("startup_timeout"),
	"stop_grace":      processField("stop_grace"),
}

func processField(name string) string {
	return fmt.Sprintf("%s is no longer a Caddyfile option: set %q in the replica's process JSON (apps.warden.models.<model>.replicas[].process), see docs/processes.md", name, name)
}

// parseServerBlock reads the optional block of a replica or server: the
// process the app launches, and where the server publishes its KV cache
// events.
func parseServerBlock(d *caddyfile.Dispenser) (*ProcessConfig, *KVEventsConfig, error) {
	p := &ProcessConfig{}
	var events *KVEventsConfig
	err := parseBlock(d, "replica", map[string]option{
		"process": {parse: func(d *caddyfile.Dispenser) error {
			if p.Command = d.RemainingArgs(); len(p.Command) == 0 {
				return d.Err("process: expected a command, e.g. process vllm serve MODEL --port 8001")
			}
			return nil
		}},
		"env": {repeats: true, parse: func(d *caddyfile.Dispenser) error {
			var name, value string
			if !d.Args(&name, &value) {
				return d.Err("env: expected a name and a value")
			}
			if p.Env == nil {
				p.Env = map[string]string{}
			}
			p.Env[name] = value
			return nil
		}},
		"dir": {parse: func(d *caddyfile.Dispenser) error {
			if !d.Args(&p.Dir) {
				return d.Err("dir: expected a directory")
			}
			return nil
		}},
		"kv_events": {parse: func(d *caddyfile.Dispenser) error {
			events = &KVEventsConfig{}
			if !d.Args(&events.Endpoint) {
				return d.Err("kv_events: expected the publisher's endpoint, tcp://host:port, and optionally its topic")
			}
			if err := kvevents.CheckEndpoint(events.Endpoint); err != nil {
				return d.Errf("kv_events: %v", err)
			}
			d.Args(&events.Topic)
			return nil
		}},
	}, removedProcessOptions)
	switch {
	case err != nil:
		return nil, nil, err
	case len(p.Command) == 0 && (p.Env != nil || p.Dir != ""):
		return nil, nil, d.Err("the block needs a process line")
	case len(p.Command) == 0:
		return nil, events, nil
	}
	return p, events, nil
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

// onOff reads the one boolean syntax of warden's Caddyfile options.
func onOff(d *caddyfile.Dispenser) (bool, error) {
	return argument(d, "on or off", func(s string) (bool, bool) {
		return s == "on", s == "on" || s == "off"
	})
}

func onOffPtr(d *caddyfile.Dispenser) (*bool, error) {
	on, err := onOff(d)
	return &on, err
}

func duration(d *caddyfile.Dispenser) (caddy.Duration, error) {
	return argument(d, "a positive duration such as 30s or 5m", func(s string) (caddy.Duration, bool) {
		v, err := caddy.ParseDuration(s)
		return caddy.Duration(v), err == nil && v > 0
	})
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
