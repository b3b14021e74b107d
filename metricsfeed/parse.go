// Package metricsfeed reads vLLM's Prometheus /metrics endpoint: it parses a
// body into per-engine snapshots (Parse), fetches one safely (Fetch), polls a
// set of servers and their /health (Poller), and turns counter samples into
// rates over a window or a time series (History).
//
// The package keeps no global state and never reads the wall clock inside a
// decision, so a virtual-time lab can drive History directly.
package metricsfeed

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Field names one value of EngineStats; a set of them records which series a
// scrape actually contained.
type Field uint16

// The fields of EngineStats that a scrape may or may not contain.
const (
	FieldRunning Field = 1 << iota
	FieldWaiting
	FieldKVUsage
	FieldPrefixQueries
	FieldPrefixHits
	FieldPromptTokens
	FieldPromptTokensCached
	FieldGenerationTokens
	FieldPreemptions
	FieldRequestSuccess
	FieldBlockSize
	FieldNumGPUBlocks
)

// LoadFields are the gauges a router needs to judge an engine's load.
const LoadFields = FieldRunning | FieldWaiting | FieldKVUsage

// EngineStats is what one vLLM engine (one data-parallel rank) reported in a
// scrape. Counters are cumulative since the server started; a counter the
// body did not contain is zero and absent from Present.
type EngineStats struct {
	Model  string `json:"model"`
	Engine int    `json:"engine"` // DP rank; 0 when the series carry no engine label

	Running int     `json:"running"`
	Waiting int     `json:"waiting"`
	KVUsage float64 `json:"kv_usage"` // 0..1

	PrefixQueries      float64 `json:"prefix_queries"` // tokens
	PrefixHits         float64 `json:"prefix_hits"`    // tokens
	PromptTokens       float64 `json:"prompt_tokens"`
	PromptTokensCached float64 `json:"prompt_tokens_cached"`
	GenerationTokens   float64 `json:"generation_tokens"`
	Preemptions        float64 `json:"preemptions"`
	RequestSuccess     float64 `json:"request_success"` // summed over finished_reason

	BlockSize    int `json:"block_size"`     // tokens per KV block, from cache_config_info
	NumGPUBlocks int `json:"num_gpu_blocks"` // KV blocks on the GPU, from cache_config_info

	Present Field `json:"present"`
}

// Has reports whether every field in f was present in the scrape.
func (e EngineStats) Has(f Field) bool { return e.Present&f == f }

// Scrape is one parsed /metrics body: one entry per engine, sorted by rank.
type Scrape struct {
	Engines []EngineStats `json:"engines"`
}

// Engine returns the stats of the engine with the given DP rank.
func (s Scrape) Engine(rank int) (EngineStats, bool) {
	i, found := slices.BinarySearchFunc(s.Engines, rank, func(e EngineStats, r int) int { return e.Engine - r })
	if !found {
		return EngineStats{}, false
	}
	return s.Engines[i], true
}

// ErrNoVLLMSeries means the body parsed but held none of the vLLM load or
// counter series, e.g. the URL points at something other than vLLM.
var ErrNoVLLMSeries = errors.New("metricsfeed: no vLLM series in /metrics body")

// kvUsageSlack tolerates float error around the 0..1 range of the KV gauge.
const kvUsageSlack = 1e-6

// maxQueueLength bounds running/waiting: larger values are corrupt data, and
// converting them to int would not be meaningful.
const maxQueueLength = 1 << 30

type seriesKind int

const (
	gauge       seriesKind = iota // one series per engine
	counter                       // summed over extra labels (e.g. finished_reason)
	legacyGauge                   // used only when the engine lacks the current name
)

// seriesSpec maps one exposed series name to the EngineStats field it fills.
type seriesSpec struct {
	name  string
	kind  seriesKind
	field Field
	set   setter
}

// setter validates a sample value and stores it into its field.
type setter func(e *EngineStats, v float64) error

// queueLength stores a running/waiting gauge.
func queueLength(field func(*EngineStats) *int) setter {
	return func(e *EngineStats, v float64) error {
		if v > maxQueueLength {
			return fmt.Errorf("implausible queue length %g", v)
		}
		*field(e) = int(math.Round(v))
		return nil
	}
}

// accumulate adds a counter sample, so that series differing only in extra
// labels (finished_reason) sum up per engine.
func accumulate(field func(*EngineStats) *float64) setter {
	return func(e *EngineStats, v float64) error {
		sum := *field(e) + v
		if math.IsInf(sum, 0) {
			return errors.New("counter sum overflows")
		}
		*field(e) = sum
		return nil
	}
}

// vllmSeries lists the series Parse reads. Current names come before the
// legacy ones so that a legacy series only fills what the current one did not.
var vllmSeries = []seriesSpec{
	{"vllm:num_requests_running", gauge, FieldRunning, queueLength(func(e *EngineStats) *int { return &e.Running })},
	{"vllm:num_requests_waiting", gauge, FieldWaiting, queueLength(func(e *EngineStats) *int { return &e.Waiting })},
	{"vllm:kv_cache_usage_perc", gauge, FieldKVUsage, setKVUsage},
	{"vllm:gpu_cache_usage_perc", legacyGauge, FieldKVUsage, setKVUsage},
	{"vllm:prefix_cache_queries_total", counter, FieldPrefixQueries, accumulate(func(e *EngineStats) *float64 { return &e.PrefixQueries })},
	{"vllm:prefix_cache_hits_total", counter, FieldPrefixHits, accumulate(func(e *EngineStats) *float64 { return &e.PrefixHits })},
	{"vllm:prompt_tokens_total", counter, FieldPromptTokens, accumulate(func(e *EngineStats) *float64 { return &e.PromptTokens })},
	{"vllm:prompt_tokens_cached_total", counter, FieldPromptTokensCached, accumulate(func(e *EngineStats) *float64 { return &e.PromptTokensCached })},
	{"vllm:generation_tokens_total", counter, FieldGenerationTokens, accumulate(func(e *EngineStats) *float64 { return &e.GenerationTokens })},
	{"vllm:num_preemptions_total", counter, FieldPreemptions, accumulate(func(e *EngineStats) *float64 { return &e.Preemptions })},
	{"vllm:request_success_total", counter, FieldRequestSuccess, accumulate(func(e *EngineStats) *float64 { return &e.RequestSuccess })},
}

func setKVUsage(e *EngineStats, v float64) error {
	if v > 1+kvUsageSlack {
		return fmt.Errorf("KV usage %g outside [0, 1]", v)
	}
	e.KVUsage = min(v, 1)
	return nil
}

const cacheConfigInfo = "vllm:cache_config_info"

// Parse reads a Prometheus text exposition from a vLLM server and returns its
// per-engine stats. It returns an error, and no partial result, when the text
// does not parse, holds no vLLM series, or holds a value no healthy server
// reports (NaN, infinite, negative, KV usage above 1): the caller must then
// treat the server as unknown, never as idle.
func Parse(r io.Reader) (Scrape, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	// The text format requires a final newline; a missing one is harmless,
	// and an extra empty line is ignored.
	families, err := parser.TextToMetricFamilies(io.MultiReader(r, strings.NewReader("\n")))
	if err != nil {
		return Scrape{}, fmt.Errorf("metricsfeed: parse /metrics: %w", err)
	}

	engines := map[int]*EngineStats{}
	engineFor := func(m *dto.Metric) (*EngineStats, error) {
		rank, err := engineRank(m)
		if err != nil {
			return nil, err
		}
		e := engines[rank]
		if e == nil {
			e = &EngineStats{Engine: rank, Model: labelValue(m, "model_name")}
			engines[rank] = e
		}
		return e, nil
	}

	found := false
	for _, spec := range vllmSeries {
		family := families[spec.name]
		if family == nil {
			continue
		}
		found = true
		for _, m := range family.GetMetric() {
			if err := applySample(spec, m, engineFor); err != nil {
				return Scrape{}, fmt.Errorf("metricsfeed: %s: %w", spec.name, err)
			}
		}
	}
	if !found {
		return Scrape{}, ErrNoVLLMSeries
	}
	if family := families[cacheConfigInfo]; family != nil {
		for _, m := range family.GetMetric() {
			e, err := engineFor(m)
			if err != nil {
				return Scrape{}, fmt.Errorf("metricsfeed: %s: %w", cacheConfigInfo, err)
			}
			if n, ok := positiveIntLabel(m, "block_size"); ok {
				e.BlockSize, e.Present = n, e.Present|FieldBlockSize
			}
			if n, ok := positiveIntLabel(m, "num_gpu_blocks"); ok {
				e.NumGPUBlocks, e.Present = n, e.Present|FieldNumGPUBlocks
			}
		}
	}

	scrape := Scrape{Engines: make([]EngineStats, 0, len(engines))}
	for _, e := range engines {
		scrape.Engines = append(scrape.Engines, *e)
	}
	slices.SortFunc(scrape.Engines, func(a, b EngineStats) int { return a.Engine - b.Engine })
	return scrape, nil
}

func applySample(spec seriesSpec, m *dto.Metric, engineFor func(*dto.Metric) (*EngineStats, error)) error {
	v, ok := sampleValue(m)
	if !ok {
		return errors.New("not a gauge, counter or untyped sample")
	}
	e, err := engineFor(m)
	if err != nil {
		return err
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return fmt.Errorf("engine %d: invalid value %g", e.Engine, v)
	}
	switch {
	case spec.kind == legacyGauge && e.Present&spec.field != 0:
		return nil
	case spec.kind == gauge && e.Present&spec.field != 0:
		return fmt.Errorf("engine %d: duplicate series", e.Engine)
	}
	if err := spec.set(e, v); err != nil {
		return fmt.Errorf("engine %d: %w", e.Engine, err)
	}
	e.Present |= spec.field
	return nil
}

func sampleValue(m *dto.Metric) (float64, bool) {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true
	}
	return 0, false
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// engineRank reads the engine label; servers without data parallelism (or
// older ones) omit it, which means rank 0.
func engineRank(m *dto.Metric) (int, error) {
	raw := labelValue(m, "engine")
	if raw == "" {
		return 0, nil
	}
	rank, err := strconv.Atoi(raw)
	if err != nil || rank < 0 {
		return 0, fmt.Errorf("invalid engine label %q", raw)
	}
	return rank, nil
}

// positiveIntLabel reads an info-gauge label such as num_gpu_blocks, which
// vLLM renders as "None" before the KV cache is profiled.
func positiveIntLabel(m *dto.Metric, name string) (int, bool) {
	n, err := strconv.Atoi(labelValue(m, name))
	return n, err == nil && n > 0
}
