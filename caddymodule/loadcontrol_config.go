package caddymodule

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"golang.org/x/net/http/httpguts"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// LoadControlConfig is load control (off by default): each replica keeps a
// set of resident conversations whose prompts fit in its KV cache, and a
// turn of any other conversation waits at the proxy until one leaves,
// instead of evicting a resident's cache. It needs affinity: with affinity
// off, or for a request no session key names, it does nothing. Zero values
// mean the defaults.
type LoadControlConfig struct {
	// Enabled turns load control on. Always written, so that
	// `PATCH /config/apps/warden/models/<m>/load_control/enabled` finds it.
	Enabled bool `json:"enabled"`
	// Preset "farm" (`load_control farm`) starts from the farm preset
	// (farmAdmission) instead of the defaults; the fields below, when set,
	// override either.
	Preset string `json:"preset,omitempty"`
	// Fill is the share of each replica's KV capacity that resident
	// conversations' prompts may hold, the prefix they share counted once
	// (default 0.95; prompts are estimated from their size until the
	// replies report it, and the shared prefix is learned from the cached
	// part the replies report).
	Fill float64 `json:"fill,omitempty"`
	// Linger is how long a conversation stays resident after its turn, so
	// that its next turn finds its cache (default 6s).
	Linger caddy.Duration `json:"linger,omitempty"`
	// MaxWait bounds a turn's wait; it then proceeds anyway (default 5m).
	MaxWait caddy.Duration `json:"max_wait,omitempty"`
	// MaxQueue bounds the turns waiting; a turn beyond is answered 503 with
	// Retry-After (default 1024).
	MaxQueue int `json:"max_queue,omitempty"`
	// CapacityTokens is each replica's KV cache in tokens; 0 reads it from
	// the replica's /metrics (vLLM's num_gpu_blocks × block_size).
	CapacityTokens int `json:"capacity_tokens,omitempty"`
	// Quantum is how many turns a resident conversation keeps its place
	// while others wait; it then yields at the end of its turn instead of
	// lingering (default 3; -1 never yields; the farm preset: -1).
	Quantum int `json:"quantum,omitempty"`
	// Stagger is how long a replica filling from empty waits between two
	// new conversations, until one of its residents leaves, so that agents
	// launched together do not grow together past its cache (default 0:
	// off; the farm preset: 15s).
	Stagger caddy.Duration `json:"stagger,omitempty"`
	// MinResidents is how many conversations a replica takes however large
	// they are (default 2: holding one, a replica idles through its tool
	// pauses).
	MinResidents int `json:"min_residents,omitempty"`
	// FillMin and FillMax, given together, let each replica's fill follow
	// how much of its resident turns' prompts the replies say was cached
	// (read by warden_stop_reason; vLLM needs
	// --enable-prompt-tokens-details): from FillMax, lower by 0.02 after
	// each 4 resident turns that found under 85% cached, down to FillMin,
	// and higher by 0.02 after each 4 that found 92%, up to FillMax; Fill
	// until a reply reports its cached part (default: off, Fill throughout;
	// the farm preset: 0.92 and 0.98).
	FillMin float64 `json:"fill_min,omitempty"`
	FillMax float64 `json:"fill_max,omitempty"`
	// Touch: after a resident conversation leaves a replica, the replica
	// takes its next new conversation only once each resident idle since
	// before has begun a turn again (at most a linger), unless the
	// departed's cache, the residents' and the newcomer's fit together.
	// vLLM evicts the blocks freed longest ago first: those of the idle
	// resident due back soonest, not the departed's (default off; the farm
	// preset: on).
	Touch bool `json:"touch,omitempty"`
	// FlowHeader names the header whose value says whose a turn is, for
	// load control's fair share between people (`load_control on {
	// flow_header X-Team }`); unset, or absent from a request, the
	// credential of its Authorization header tells it, else its x-api-key.
	// Values are hashed, never kept in clear.
	FlowHeader string `json:"flow_header,omitempty"`
}

// flowHeader is the header that names a turn's flow; "" reads the
// credential.
func (c *LoadControlConfig) flowHeader() string {
	if c == nil {
		return ""
	}
	return c.FlowHeader
}

// presetFarm names the farm preset: `load_control farm`.
const presetFarm = "farm"

// farmAdmission is the farm preset, the best setting measured for headless
// agent farms (docs/load-control.md): a conversation stays resident for its
// whole task (quantum off), a replica filling from empty starts its
// conversations 15 s apart (stagger), a replica a resident left waits for
// its idle residents before it takes a newcomer (touch), and each replica's
// fill follows how much of its residents' prompts the replies found cached,
// between 0.92 and 0.98 around the default 0.95. It is the lab's
// warden-admission-farm.
var farmAdmission = loadcontrol.Config{
	Quantum: -1, Stagger: 15 * time.Second, FillMin: 0.92, FillMax: 0.98, Touch: true,
}

// admission is the routing core's form of c, the preset's values under the
// fields set; nil is off.
func (c *LoadControlConfig) admission() loadcontrol.Config {
	var a loadcontrol.Config
	if c == nil {
		return a
	}
	if c.Preset == presetFarm {
		a = farmAdmission
	}
	a.Enabled = c.Enabled
	set := func(dst *float64, v float64) {
		if v != 0 {
			*dst = v
		}
	}
	setInt := func(dst *int, v int) {
		if v != 0 {
			*dst = v
		}
	}
	setDuration := func(dst *time.Duration, v caddy.Duration) {
		if v != 0 {
			*dst = time.Duration(v)
		}
	}
	set(&a.Fill, c.Fill)
	setDuration(&a.Linger, c.Linger)
	setDuration(&a.MaxWait, c.MaxWait)
	setInt(&a.MaxQueue, c.MaxQueue)
	setInt(&a.CapacityTokens, c.CapacityTokens)
	setInt(&a.Quantum, c.Quantum)
	setDuration(&a.Stagger, c.Stagger)
	setInt(&a.MinResidents, c.MinResidents)
	if c.FillMin != 0 || c.FillMax != 0 {
		a.FillMin, a.FillMax = c.FillMin, c.FillMax
	}
	a.Touch = a.Touch || c.Touch
	return a
}

// validate checks the JSON form, where 0 stands for the preset's value or
// the default.
func (c *LoadControlConfig) validate() error {
	switch {
	case c == nil:
		return nil
	case c.Preset != "" && c.Preset != presetFarm:
		return fmt.Errorf("load_control: preset must be %q or empty, got %q", presetFarm, c.Preset)
	case c.Fill < 0 || math.IsNaN(c.Fill) || math.IsInf(c.Fill, 0):
		return fmt.Errorf("load_control: fill must be a positive number (0 for the default, %g)", loadcontrol.DefaultFill)
	case c.Linger < 0, c.MaxWait < 0:
		return errors.New("load_control: linger and max_wait must be positive durations (0 for the defaults)")
	case c.Stagger < 0:
		return errors.New("load_control: stagger must not be negative (0 is the default)")
	case c.MaxQueue < 0:
		return fmt.Errorf("load_control: max_queue must be positive (0 for the default, %d)", loadcontrol.DefaultQueue)
	case c.MinResidents < 0:
		return fmt.Errorf("load_control: min_residents must be positive (0 for the default, %d)", loadcontrol.DefaultMinResidents)
	case c.CapacityTokens < 0:
		return errors.New("load_control: capacity_tokens must not be negative (0 reads it from /metrics)")
	case c.Quantum < -1:
		return fmt.Errorf("load_control: quantum must be a number of turns, 0 for the default (%d) or -1 for never", loadcontrol.DefaultQuantum)
	case c.FlowHeader != "" && !httpguts.ValidHeaderFieldName(c.FlowHeader):
		return fmt.Errorf("load_control: flow_header %q is not a header name", c.FlowHeader)
	}
	return validateFillRange(c.admission())
}

// validateFillRange checks fill_min and fill_max in force: neither, or both
// with the fill between them.
func validateFillRange(a loadcontrol.Config) error {
	if a.FillMin == 0 && a.FillMax == 0 {
		return nil
	}
	fill := a.Fill
	if fill == 0 {
		fill = loadcontrol.DefaultFill
	}
	if !(a.FillMin > 0 && a.FillMin <= fill && fill <= a.FillMax) || math.IsInf(a.FillMax, 0) {
		return fmt.Errorf("load_control: fill_min and fill_max go together, with fill (%g) between them, got %g and %g", fill, a.FillMin, a.FillMax)
	}
	return nil
}

// parseLoadControl reads `load_control off|on|farm`, with an optional
// block `{ flow_header <header> }`.
func parseLoadControl(d *caddyfile.Dispenser) (*LoadControlConfig, error) {
	var word string
	if d.NextArg() {
		word = d.Val()
	}
	var c *LoadControlConfig
	switch word {
	case "off", "on":
		c = &LoadControlConfig{Enabled: word == "on"}
	case presetFarm:
		c = &LoadControlConfig{Enabled: true, Preset: presetFarm}
	case "":
		return nil, d.Err("load_control: expected off, on or farm")
	default:
		return nil, d.Errf("load_control: expected off, on or farm, got %q", word)
	}
	err := parseBlock(d, "load_control", map[string]option{
		"flow_header": {parse: func(d *caddyfile.Dispenser) error {
			if !d.Args(&c.FlowHeader) {
				return d.Err("flow_header: expected a header name")
			}
			if !httpguts.ValidHeaderFieldName(c.FlowHeader) {
				return d.Errf("flow_header: %q is not a header name", c.FlowHeader)
			}
			return nil
		}},
	}, loadControlJSONOnly)
	return c, err
}

// loadControlJSONOnly are load control's settings a Caddyfile does not
// take, each with where to set it.
var loadControlJSONOnly = func() map[string]string {
	out := map[string]string{}
	for _, name := range []string{"fill", "linger", "max_wait", "max_queue", "capacity_tokens", "quantum", "stagger",
		"min_residents", "fill_min", "fill_max", "fill_range", "touch"} {
		out[name] = name + " is a JSON field of load_control, not a Caddyfile option: load_control farm is the farm preset " +
			"(what quantum off, stagger 15s, fill_range 0.92 0.98 and touch on set); see docs/load-control.md"
	}
	return out
}()
