package caddymodule

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/lmwarden/caddy-warden/selection"
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
	// lingering (default 3; -1 never yields).
	Quantum int `json:"quantum,omitempty"`
	// Stagger is how long a replica filling from empty waits between two
	// new conversations, until one of its residents leaves, so that agents
	// launched together do not grow together past its cache (default 0:
	// off).
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
	// until a reply reports its cached part (default: off, Fill throughout).
	FillMin float64 `json:"fill_min,omitempty"`
	FillMax float64 `json:"fill_max,omitempty"`
	// Touch: after a resident conversation leaves a replica, the replica
	// takes its next new conversation only once each resident idle since
	// before has begun a turn again (at most a linger), unless the
	// departed's cache, the residents' and the newcomer's fit together.
	// vLLM evicts the blocks freed longest ago first: those of the idle
	// resident due back soonest, not the departed's (default off).
	Touch bool `json:"touch,omitempty"`
}

// admission is the routing core's form of c; nil is off.
func (c *LoadControlConfig) admission() selection.AdmissionConfig {
	if c == nil {
		return selection.AdmissionConfig{}
	}
	return selection.AdmissionConfig{
		Enabled:        c.Enabled,
		CapacityTokens: c.CapacityTokens,
		Fill:           c.Fill,
		Linger:         time.Duration(c.Linger),
		MaxWait:        time.Duration(c.MaxWait),
		MaxQueue:       c.MaxQueue,
		Quantum:        c.Quantum,
		Stagger:        time.Duration(c.Stagger),
		MinResidents:   c.MinResidents,
		FillMin:        c.FillMin,
		FillMax:        c.FillMax,
		Touch:          c.Touch,
	}
}

// validate checks the JSON form, where 0 stands for the default.
func (c *LoadControlConfig) validate() error {
	switch {
	case c == nil:
		return nil
	case c.Fill < 0 || math.IsNaN(c.Fill) || math.IsInf(c.Fill, 0):
		return fmt.Errorf("load_control: fill must be a positive number (0 for the default, %g)", selection.DefaultAdmissionFill)
	case c.Linger < 0, c.MaxWait < 0:
		return errors.New("load_control: linger and max_wait must be positive durations (0 for the defaults)")
	case c.Stagger < 0:
		return errors.New("load_control: stagger must not be negative (0 is off)")
	case c.MaxQueue < 0:
		return fmt.Errorf("load_control: max_queue must be positive (0 for the default, %d)", selection.DefaultAdmissionQueue)
	case c.MinResidents < 0:
		return fmt.Errorf("load_control: min_residents must be positive (0 for the default, %d)", selection.DefaultAdmissionMinResidents)
	case c.CapacityTokens < 0:
		return errors.New("load_control: capacity_tokens must not be negative (0 reads it from /metrics)")
	case c.Quantum < -1:
		return fmt.Errorf("load_control: quantum must be a number of turns, 0 for the default (%d) or -1 for never", selection.DefaultAdmissionQuantum)
	}
	return c.validateFillRange()
}

// fill is the fill in force, the default for 0.
func (c *LoadControlConfig) fill() float64 {
	if c.Fill == 0 {
		return selection.DefaultAdmissionFill
	}
	return c.Fill
}

// validateFillRange checks fill_min and fill_max: neither, or both with
// fill between them.
func (c *LoadControlConfig) validateFillRange() error {
	if c.FillMin == 0 && c.FillMax == 0 {
		return nil
	}
	fill := c.fill()
	if !(c.FillMin > 0 && c.FillMin <= fill && fill <= c.FillMax) || math.IsInf(c.FillMax, 0) {
		return fmt.Errorf("load_control: fill_min and fill_max go together, with fill (%g) between them, got %g and %g", fill, c.FillMin, c.FillMax)
	}
	return nil
}

// parseLoadControl reads `load_control [on|off] [{ ... }]`; a block alone
// turns it on.
func parseLoadControl(d *caddyfile.Dispenser) (*LoadControlConfig, error) {
	c := &LoadControlConfig{Enabled: true}
	if d.CountRemainingArgs() > 0 {
		var err error
		if c.Enabled, err = onOff(d); err != nil {
			return nil, err
		}
	}
	given := givenOnce{}
	rangeLine := 0 // where fill_range was given: a fill outside it is told there
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if err := given.check(d, opt); err != nil {
			return nil, err
		}
		var err error
		switch opt {
		case "fill":
			c.Fill, err = positiveNumber(d)
		case "linger":
			c.Linger, err = duration(d)
		case "max_wait":
			c.MaxWait, err = duration(d)
		case "max_queue":
			c.MaxQueue, err = positiveInt(d)
		case "min_residents":
			c.MinResidents, err = positiveInt(d)
		case "capacity_tokens":
			c.CapacityTokens, err = capacityTokens(d)
		case "quantum":
			c.Quantum, err = quantum(d)
		case "stagger":
			var v *caddy.Duration
			if v, err = durationOrOff(d); v != nil {
				c.Stagger = *v
			}
		case "fill_range":
			c.FillMin, c.FillMax, err = fillRange(d)
			rangeLine = d.Line()
		case "touch":
			c.Touch, err = onOff(d)
		default:
			return nil, d.Errf("unrecognized load_control option %q; expected fill, fill_range, linger, max_wait, max_queue, capacity_tokens, quantum, stagger, min_residents or touch", opt)
		}
		if err != nil {
			return nil, err
		}
		if d.NextArg() {
			return nil, d.Errf("%s: unexpected argument %q", opt, d.Val())
		}
	}
	if err := c.validateFillRange(); err != nil {
		return nil, fmt.Errorf("fill_range: %g %g must hold fill (%g), at %s:%d", c.FillMin, c.FillMax, c.fill(), d.File(), rangeLine)
	}
	return c, nil
}

func positiveNumber(d *caddyfile.Dispenser) (float64, error) {
	return argument(d, "a positive number such as 1.2", func(s string) (float64, bool) {
		v, err := strconv.ParseFloat(s, 64)
		return v, err == nil && v > 0 && !math.IsInf(v, 0)
	})
}

// fillRange reads `fill_range <min> <max>`, or off (0, 0).
func fillRange(d *caddyfile.Dispenser) (lo, hi float64, err error) {
	args := d.RemainingArgs()
	const expected = "fill_range: expected two shares such as 0.92 0.98, lower first, or off, got %q"
	switch {
	case len(args) == 1 && args[0] == "off":
		return 0, 0, nil
	case len(args) != 2:
		return 0, 0, d.Errf(expected, strings.Join(args, " "))
	}
	share := func(s string) float64 {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || !(v > 0) || math.IsInf(v, 0) {
			return -1
		}
		return v
	}
	if lo, hi = share(args[0]), share(args[1]); lo < 0 || hi < lo {
		return 0, 0, d.Errf(expected, strings.Join(args, " "))
	}
	return lo, hi, nil
}

// quantum reads a number of turns, or off (-1: never yield).
func quantum(d *caddyfile.Dispenser) (int, error) {
	return argument(d, "a number of turns, or off", func(s string) (int, bool) {
		if s == "off" {
			return -1, true
		}
		n, err := strconv.Atoi(s)
		return n, err == nil && n > 0
	})
}

func capacityTokens(d *caddyfile.Dispenser) (int, error) {
	return argument(d, "a number of tokens, or 0 to read it from /metrics", func(s string) (int, bool) {
		n, err := strconv.Atoi(s)
		return n, err == nil && n >= 0
	})
}
