package server

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/dplb"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
)

// Config describes one simulated vLLM server.
type Config struct {
	// Host is the address to listen on (127.0.0.1 by default).
	Host string
	// Port is the API port (0 picks a free one).
	Port int
	// ControlPort, when not 0, also serves /sim/faults on a port that a refusal leaves open.
	ControlPort int
	// ID names the server in the X-Vllmsim-Engine header (default: its host:port).
	ID string
	// Profile is the engine model of every rank.
	Profile engine.Profile
	// DataParallelSize is the number of engines behind the port.
	DataParallelSize int
	// LB is vLLM's internal DP balancer variant.
	LB dplb.Mode
	// TimeScale runs simulated time this many times faster than the wall clock.
	TimeScale float64
	// Seed makes generated text and lengths reproducible.
	Seed uint64
	// Model is the model the server pretends to load (its /v1/models root).
	Model string
	// ServedModelNames are the names requests may use; the first is reported in metrics.
	ServedModelNames []string
	// OutputLen is the reply length distribution.
	OutputLen OutputLen
	// PromptTokensDetails reports cached prompt tokens in usage (vLLM's
	// --enable-prompt-tokens-details; on here, since measuring caching is the point).
	PromptTokensDetails bool
	// CountTokens serves POST /v1/messages/count_tokens, as vLLM has since PR #35588
	// (February 2026); off, the path is a 404 as on older servers.
	CountTokens bool
	// KVEvents, when enabled, publishes each engine's prefix-cache changes as vLLM's KV
	// cache events (--kv-events-config).
	KVEvents KVEventsConfig
	// Faults are the fault switches in force at start.
	Faults Faults
	// OnRequest, if set, is called with every generation request the server accepted, once
	// its engine is chosen and before the reply starts (from the request's goroutine, so
	// it must be safe for concurrent use). Tests use it to see which engine served what and
	// what the client sent.
	OnRequest func(Served)
	// OnCount, if set, is called with every count_tokens request the server answered, from
	// the request's goroutine; its Engine is "<server id>/api": the API server tokenizes
	// the prompt, no engine runs.
	OnCount func(Served)
	// OnRefuse, if set, is called with every generation request the server answered with an
	// error, as vLLM would (a model it does not serve, a prompt or max_tokens over
	// --max-model-len, a malformed body), from the request's goroutine.
	OnRefuse func(Refused)
}

// Refused is a generation request the server answered with an error.
type Refused struct {
	Path    string // the URL path
	Status  int    // 404 for a model the server does not serve, else 400
	Message string // the error's message, as in vLLM's answer
}

// Served is a generation request as the server accepted it.
type Served struct {
	Path   string      // the URL path, e.g. /v1/responses
	Engine string      // what the X-Vllmsim-Engine response header says: "<server id>/<rank>"
	Header http.Header // the request's headers (a copy)
	Body   []byte      // the request's body
}

// DefaultModel is the model of the seed's measurements.
const DefaultModel = "Qwen/Qwen3-4B-Instruct-2507"

// DefaultConfig is the a4000-qwen3-4b server on 127.0.0.1 with a free port.
func DefaultConfig() Config {
	return Config{
		Host:                "127.0.0.1",
		Profile:             engine.Profiles[engine.DefaultProfile],
		DataParallelSize:    1,
		LB:                  dplb.V026Dense,
		TimeScale:           1,
		Model:               DefaultModel,
		PromptTokensDetails: true,
		CountTokens:         true,
	}
}

// modelName is the name metrics and responses report.
func (c Config) modelName() string {
	if len(c.ServedModelNames) > 0 {
		return c.ServedModelNames[0]
	}
	return c.Model
}

func (c Config) servesModel(name string) bool {
	if len(c.ServedModelNames) == 0 {
		return name == c.Model
	}
	for _, n := range c.ServedModelNames {
		if n == name {
			return true
		}
	}
	return false
}

func (c Config) validate() error {
	switch {
	case c.DataParallelSize < 1:
		return fmt.Errorf("data parallel size must be at least 1, got %d", c.DataParallelSize)
	case !(c.TimeScale > 0):
		return fmt.Errorf("time scale must be positive, got %g", c.TimeScale)
	case c.Model == "":
		return errors.New("model name is empty")
	}
	if _, err := dplb.ParseMode(string(c.LB)); err != nil {
		return err
	}
	if err := c.KVEvents.validate(); err != nil {
		return err
	}
	if err := c.Faults.validate(c.ControlPort != 0); err != nil {
		return err
	}
	return c.Profile.Validate()
}

// ParseFlags reads vllmsim's command line. Profile numbers come from --profile unless a flag
// overrides them; --max-model-len left unset shrinks to the KV capacity if it exceeds it.
func ParseFlags(args []string, usage io.Writer) (Config, error) {
	// First pass: learn the profile, whose numbers are the defaults of the second pass.
	probe := DefaultConfig()
	if err := newFlagSet(&probe, new(flagValues), io.Discard).Parse(args); err != nil {
		fs := newFlagSet(&probe, new(flagValues), usage)
		return Config{}, fs.Parse(args) // prints the usage and the error
	}
	cfg := DefaultConfig()
	p, ok := engine.Profiles[probe.Profile.Name]
	if !ok {
		return Config{}, fmt.Errorf("unknown profile %q", probe.Profile.Name)
	}
	cfg.Profile = p
	var v flagValues
	fs := newFlagSet(&cfg, &v, usage)
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	maxModelLenSet := false
	fs.Visit(func(f *flag.Flag) { maxModelLenSet = maxModelLenSet || f.Name == "max-model-len" })
	if !maxModelLenSet {
		cfg.Profile.MaxModelLen = min(cfg.Profile.MaxModelLen, cfg.Profile.KVCapacityTokens())
	}
	var err error
	if cfg.OutputLen, err = ParseOutputLen(v.outputLen); err != nil {
		return Config{}, err
	}
	if cfg.LB, err = dplb.ParseMode(v.lb); err != nil {
		return Config{}, err
	}
	if v.servedModelNames != "" {
		cfg.ServedModelNames = strings.Split(v.servedModelNames, ",")
	}
	if v.kvEventsConfig != "" {
		if cfg.KVEvents, err = ParseKVEventsConfig(v.kvEventsConfig); err != nil {
			return Config{}, err
		}
	}
	cfg.Faults.Metrics = MetricsFault(v.metricsFault)
	return cfg, cfg.validate()
}

// flagValues holds flags that need parsing after flag.Parse.
type flagValues struct {
	outputLen, lb, servedModelNames, metricsFault, kvEventsConfig string
}

func newFlagSet(cfg *Config, v *flagValues, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("vllmsim", flag.ContinueOnError)
	fs.SetOutput(out)
	p := &cfg.Profile
	fs.StringVar(&cfg.Host, "host", cfg.Host, "address to listen on")
	fs.IntVar(&cfg.Port, "port", cfg.Port, "API port (0: any free port)")
	fs.IntVar(&cfg.ControlPort, "control-port", 0, "also serve /sim/faults on this port, which stays open while the API port refuses")
	fs.StringVar(&cfg.ID, "id", "", "server id in the X-Vllmsim-Engine response header (default host:port)")
	fs.IntVar(&cfg.DataParallelSize, "data-parallel-size", cfg.DataParallelSize, "engines behind the port (vLLM internal DP)")
	fs.StringVar(&v.lb, "dp-lb", string(cfg.LB), fmt.Sprintf("internal DP balancer: %v", dplb.Modes))
	fs.Float64Var(&cfg.TimeScale, "time-scale", cfg.TimeScale, "run simulated time this many times faster than the wall clock")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed of generated text and lengths")
	fs.StringVar(&cfg.Model, "model", cfg.Model, "model name")
	fs.StringVar(&v.servedModelNames, "served-model-name", "", "comma-separated names requests may use (default: --model)")
	fs.StringVar(&v.outputLen, "output-len", "max", "reply length: max (= max_tokens) or uniform:LOW:HIGH (HIGH may be max)")
	fs.BoolVar(&cfg.PromptTokensDetails, "enable-prompt-tokens-details", cfg.PromptTokensDetails, "report cached prompt tokens in usage")
	fs.BoolVar(&cfg.CountTokens, "count-tokens", cfg.CountTokens, "serve POST /v1/messages/count_tokens (false: a 404, as vLLM before early 2026)")

	fs.StringVar(&v.kvEventsConfig, "kv-events-config", "", `vLLM's KV cache events, e.g. {"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:5557", "topic": "kv-events"}`)

	p.RegisterFlags(fs)

	fs.StringVar(&v.metricsFault, "fault-metrics", "", fmt.Sprintf("make /metrics misbehave: %v", metricsFaults))
	fs.Var((*durationFlag)(&cfg.Faults.MetricsDelay), "fault-metrics-delay", "delay of a slow /metrics (default 5s)")
	fs.IntVar(&cfg.Faults.HealthStatus, "fault-health-status", 0, "status /health returns (e.g. 503)")
	fs.BoolVar(&cfg.Faults.Refuse, "fault-refuse", false, "refuse connections on the API port from the start")
	fs.Var((*durationFlag)(&cfg.Faults.RefuseFor), "fault-refuse-for", "end the refusal after this long")
	fs.BoolVar(&cfg.Faults.DieMidStream, "fault-die-mid-stream", false, "drop the connection halfway through each reply")
	return fs
}

// durationFlag lets a Duration be a flag.
type durationFlag Duration

// String shows the duration as a flag default.
func (d *durationFlag) String() string { return fmt.Sprint(Duration(*d)) }

// Set reads a duration such as "5s".
func (d *durationFlag) Set(s string) error {
	return (*Duration)(d).UnmarshalJSON([]byte(fmt.Sprintf("%q", s)))
}
