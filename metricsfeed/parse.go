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
	"math/bits"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Field names one value of EngineStats; a set of them records which series a
// scrape actually contained.
type Field uint32

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
	FieldReportedHitRate
	FieldTTFT
	FieldExternalQueries
	FieldExternalHits
	FieldHostStoredBytes
)

// LoadFields are the gauges a router needs to judge an engine's load.
const LoadFields = FieldRunning | FieldWaiting | FieldKVUsage

// PrefixFields are the prefix-cache counters a hit rate is computed from.
const PrefixFields = FieldPrefixQueries | FieldPrefixHits

// EngineStats is what one vLLM engine (one data-parallel rank) reported in a
// scrape. Counters are cumulative since the server started; a series the
// body did not contain is zero and absent from Present: read Present (or
// Has) before trusting a zero.
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

	// ReportedHitRate is the server's own prefix-cache hit rate, 0..1, from
	// the V0 engine's gauge vllm:gpu_prefix_cache_hit_rate (a block hit rate
	// the engine computes itself, not over any window of warden's). Servers
	// with counters do not publish it; absent when the engine reports -1
	// (prefix caching disabled).
	ReportedHitRate float64 `json:"reported_hit_rate"`

	// TTFTSeconds and TTFTCount are the sum and count of the engine's
	// time-to-first-token histogram (vllm:time_to_first_token_seconds).
	TTFTSeconds float64 `json:"ttft_seconds"`
	TTFTCount   float64 `json:"ttft_count"`

	// ExternalQueries and ExternalHits count the prompt tokens the GPU
	// prefix cache missed that were asked of a KV connector, such as the
	// host-memory tier (--kv-offloading-size), and those it served.
	ExternalQueries float64 `json:"external_prefix_queries"`
	ExternalHits    float64 `json:"external_prefix_hits"`
	// HostStoredBytes counts the bytes of KV blocks copied to the host
	// tier, which, over the tokens written, gives the bytes of a token's KV
	// and so the tier's size in tokens.
	HostStoredBytes float64 `json:"host_stored_bytes"`

	BlockSize    int `json:"block_size"`     // tokens per KV block, from cache_config_info
	NumGPUBlocks int `json:"num_gpu_blocks"` // KV blocks on the GPU, from cache_config_info
	// HostTierGiB is the host-memory KV tier's size (--kv-offloading-size),
	// from cache_config_info; 0 without a tier or when it does not say.
	HostTierGiB float64 `json:"host_tier_gib"`

	Present Field `json:"present"`

	// created holds Created's times, indexed by the field's bit.
	created [32]float64
}

// Created is when the server created counter f's series (Unix seconds, by
// its own clock), from the <name>_created sample Python's prometheus_client
// publishes beside each counter; 0 when the exposition does not say, or
// when the counter sums several series. A changed time means the counter
// started again from zero.
func (e EngineStats) Created(f Field) float64 { return e.created[bits.TrailingZeros32(uint32(f))] }

// Has reports whether every field in f was present in the scrape.
func (e EngineStats) Has(f Field) bool { return e.Present&f == f }

// Scrape is one parsed /metrics body: one entry per engine, sorted by rank.
type Scrape struct {
	Engines []EngineStats `json:"engines"`
	// ProcessStart is the server process's start time (Unix seconds), from
	// process_start_time_seconds, which Python's and Go's Prometheus clients
	// publish; 0 when absent. A changed value means the server restarted.
	ProcessStart float64 `json:"process_start,omitempty"`
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

// maxCounter bounds a token or request counter: 2^53 tokens take centuries
// to serve, and the sums of increases over an hour's samples of values near
// float64's limit overflow to infinity, which JSON cannot carry.
const maxCounter = 1 << 53

type seriesKind int

const (
	gauge   seriesKind = iota // one series per engine and name
	counter                   // summed over extra labels (e.g. finished_reason)
)

// seriesSpec maps the names under which servers publish one value to the
// EngineStats field it fills. Names are in order of preference: an engine
// takes its value from the first name that has a sample for it, and ignores
// the others, so a server publishing both a current and a deprecated name
// (vLLM 0.9 and 0.10 do) is not counted twice.
type seriesSpec struct {
	names []string
	kind  seriesKind
	field Field
	set   setter
	// negativeAbsent makes a negative sample mean "not available" (the field
	// stays absent) instead of corrupt data.
	negativeAbsent bool
	// only, when set, skips the samples whose label has another value (a
	// sample without the label is kept).
	only labelIs
}

// labelIs is a label's name and the value a sample must have, if it has it.
type labelIs struct{ name, value string }

func (l labelIs) keeps(m *dto.Metric) bool {
	if l.name == "" {
		return true
	}
	for _, lp := range m.GetLabel() {
		if lp.GetName() == l.name {
			return lp.GetValue() == l.value
		}
	}
	return true
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
		if sum > maxCounter {
			return fmt.Errorf("implausible counter %g", sum)
		}
		*field(e) = sum
		return nil
	}
}

// counterNames lists the spellings of a counter, current first.
//
// vLLM creates its counters with prometheus_client, which appends _total in
// the text exposition: vllm/v1/metrics/loggers.py names them
// vllm:prefix_cache_queries, vllm:prompt_tokens, ... and /metrics shows
// vllm:prefix_cache_queries_total, vllm:prompt_tokens_total, .... The V0
// engine (vllm/engine/metrics.py) spelled _total in the name itself, with the
// same result. Servers built on Go's client_golang publish a counter under
// exactly the name they give it: llm-d-inference-sim (its metrics.go) names
// the prefix-cache counters vllm:prefix_cache_hits and
// vllm:prefix_cache_queries, without _total. Both spellings are accepted for
// every counter warden reads.
func counterNames(base string, deprecated ...string) []string {
	names := []string{base + "_total", base}
	for _, d := range deprecated {
		names = append(names, d+"_total", d)
	}
	return names
}

// vllmSeries lists the series Parse reads.
var vllmSeries = []seriesSpec{
	{names: []string{"vllm:num_requests_running"}, kind: gauge, field: FieldRunning, set: queueLength(func(e *EngineStats) *int { return &e.Running })},
	{names: []string{"vllm:num_requests_waiting"}, kind: gauge, field: FieldWaiting, set: queueLength(func(e *EngineStats) *int { return &e.Waiting })},
	// vllm:gpu_cache_usage_perc is the V0 engine's name (vllm/engine/metrics.py),
	// kept by V1 as deprecated since 0.9 (loggers.py: "Renamed as
	// vllm:kv_cache_usage_perc"), and published by older llm-d-inference-sim.
	{names: []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}, kind: gauge, field: FieldKVUsage, set: setKVUsage},
	// vllm:gpu_prefix_cache_queries and _hits are V1's names before 0.9
	// (loggers.py: "Deprecated in 0.9 - Renamed as vllm:prefix_cache_queries").
	{names: counterNames("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"), kind: counter, field: FieldPrefixQueries, set: accumulate(func(e *EngineStats) *float64 { return &e.PrefixQueries })},
	{names: counterNames("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"), kind: counter, field: FieldPrefixHits, set: accumulate(func(e *EngineStats) *float64 { return &e.PrefixHits })},
	// A patched 0.11.0 named the connector's counters connector_prefix_cache_*.
	{names: counterNames("vllm:external_prefix_cache_queries", "vllm:connector_prefix_cache_queries"), kind: counter, field: FieldExternalQueries, set: accumulate(func(e *EngineStats) *float64 { return &e.ExternalQueries })},
	{names: counterNames("vllm:external_prefix_cache_hits", "vllm:connector_prefix_cache_hits"), kind: counter, field: FieldExternalHits, set: accumulate(func(e *EngineStats) *float64 { return &e.ExternalHits })},
	// The stores' bytes: vllm:kv_offload_store_bytes since the metrics'
	// redesign, before it vllm:kv_offload_total_bytes by transfer_type.
	{names: counterNames("vllm:kv_offload_store_bytes", "vllm:kv_offload_total_bytes"), kind: counter, field: FieldHostStoredBytes, set: accumulate(func(e *EngineStats) *float64 { return &e.HostStoredBytes }), only: labelIs{"transfer_type", "GPU_to_CPU"}},
	{names: counterNames("vllm:prompt_tokens"), kind: counter, field: FieldPromptTokens, set: accumulate(func(e *EngineStats) *float64 { return &e.PromptTokens })},
	{names: counterNames("vllm:prompt_tokens_cached"), kind: counter, field: FieldPromptTokensCached, set: accumulate(func(e *EngineStats) *float64 { return &e.PromptTokensCached })},
	{names: counterNames("vllm:generation_tokens"), kind: counter, field: FieldGenerationTokens, set: accumulate(func(e *EngineStats) *float64 { return &e.GenerationTokens })},
	{names: counterNames("vllm:num_preemptions"), kind: counter, field: FieldPreemptions, set: accumulate(func(e *EngineStats) *float64 { return &e.Preemptions })},
	{names: counterNames("vllm:request_success"), kind: counter, field: FieldRequestSuccess, set: accumulate(func(e *EngineStats) *float64 { return &e.RequestSuccess })},
	// The V0 engine's gauge (vllm/engine/metrics.py, "GPU prefix cache block
	// hit rate"); its block allocators return -1 when prefix caching is
	// unsupported or disabled.
	{names: []string{"vllm:gpu_prefix_cache_hit_rate"}, kind: gauge, field: FieldReportedHitRate, set: setReportedHitRate, negativeAbsent: true},
}

func setKVUsage(e *EngineStats, v float64) error {
	if v > 1+kvUsageSlack {
		return fmt.Errorf("KV usage %g outside [0, 1]", v)
	}
	e.KVUsage = min(v, 1)
	return nil
}

func setReportedHitRate(e *EngineStats, v float64) error {
	if v > 1+kvUsageSlack {
		return fmt.Errorf("prefix-cache hit rate %g outside [0, 1]", v)
	}
	e.ReportedHitRate = min(v, 1)
	return nil
}

const (
	cacheConfigInfo  = "vllm:cache_config_info"
	processStartTime = "process_start_time_seconds"
	ttftHistogram    = "vllm:time_to_first_token_seconds"
)

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
		// source records, per engine, which of spec's names filled the field.
		source := map[*EngineStats]int{}
		for i, name := range spec.names {
			family := families[name]
			if family == nil {
				continue
			}
			found = true
			for _, m := range family.GetMetric() {
				if err := applySample(spec, i, source, m, engineFor); err != nil {
					return Scrape{}, fmt.Errorf("metricsfeed: %s: %w", name, err)
				}
			}
		}
		if spec.kind == counter {
			readCreated(spec, source, families)
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
			// "None" without a tier, as Python prints it.
			if gib, err := strconv.ParseFloat(labelValue(m, "kv_offloading_size"), 64); err == nil && gib > 0 && !math.IsInf(gib, 0) {
				e.HostTierGiB = gib
			}
		}
	}

	if family := families[ttftHistogram]; family != nil {
		for _, m := range family.GetMetric() {
			h := m.GetHistogram()
			if h == nil {
				continue
			}
			sum, count := h.GetSampleSum(), float64(h.GetSampleCount())
			if math.IsNaN(sum) || math.IsInf(sum, 0) || sum < 0 || sum > maxCounter || count > maxCounter {
				return Scrape{}, fmt.Errorf("metricsfeed: %s: invalid sum %g or count %g", ttftHistogram, sum, count)
			}
			e, err := engineFor(m)
			if err != nil {
				return Scrape{}, fmt.Errorf("metricsfeed: %s: %w", ttftHistogram, err)
			}
			e.TTFTSeconds, e.TTFTCount, e.Present = e.TTFTSeconds+sum, e.TTFTCount+count, e.Present|FieldTTFT
		}
	}

	scrape := Scrape{Engines: make([]EngineStats, 0, len(engines))}
	if family := families[processStartTime]; family != nil && len(family.GetMetric()) == 1 {
		if v, ok := sampleValue(family.GetMetric()[0]); ok && v > 0 && !math.IsInf(v, 0) {
			scrape.ProcessStart = v
		}
	}
	for _, e := range engines {
		scrape.Engines = append(scrape.Engines, *e)
	}
	slices.SortFunc(scrape.Engines, func(a, b EngineStats) int { return a.Engine - b.Engine })
	return scrape, nil
}

// applySample stores one sample of spec's name number nameIndex, unless an
// earlier name already gave the engine its value.
func applySample(spec seriesSpec, nameIndex int, source map[*EngineStats]int, m *dto.Metric, engineFor func(*dto.Metric) (*EngineStats, error)) error {
	if !spec.only.keeps(m) {
		return nil
	}
	v, ok := sampleValue(m)
	if !ok {
		return errors.New("not a gauge, counter or untyped sample")
	}
	e, err := engineFor(m)
	if err != nil {
		return err
	}
	if from, filled := source[e]; filled {
		switch {
		case from < nameIndex:
			return nil // a preferred name already gave this engine its value
		case spec.kind == gauge:
			return fmt.Errorf("engine %d: duplicate series", e.Engine)
		}
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("engine %d: invalid value %g", e.Engine, v)
	}
	if v < 0 {
		if spec.negativeAbsent {
			return nil
		}
		return fmt.Errorf("engine %d: invalid value %g", e.Engine, v)
	}
	if err := spec.set(e, v); err != nil {
		return fmt.Errorf("engine %d: %w", e.Engine, err)
	}
	source[e] = nameIndex
	e.Present |= spec.field
	return nil
}

// readCreated fills the Created time of spec's counter for each engine in
// source, from the _created family of the name that gave the engine its
// value: prometheus_client names it after the counter without _total
// (vllm:prompt_tokens_total, vllm:prompt_tokens_created). An engine with
// several series of the counter (summed over extra labels) or an invalid
// time gets none: a creation time is a hint, not a reason to refuse a scrape.
func readCreated(spec seriesSpec, source map[*EngineStats]int, families map[string]*dto.MetricFamily) {
	for e, nameIndex := range source {
		name := spec.names[nameIndex]
		if len(engineSamples(families[name], e.Engine)) != 1 {
			continue
		}
		created := engineSamples(families[strings.TrimSuffix(name, "_total")+"_created"], e.Engine)
		if len(created) != 1 {
			continue
		}
		if v, ok := sampleValue(created[0]); ok && v > 0 && !math.IsInf(v, 0) {
			e.created[bits.TrailingZeros32(uint32(spec.field))] = v
		}
	}
}

// engineSamples are the samples of family for the engine of the given rank.
func engineSamples(family *dto.MetricFamily, rank int) []*dto.Metric {
	var out []*dto.Metric
	for _, m := range family.GetMetric() {
		if r, err := engineRank(m); err == nil && r == rank {
			out = append(out, m)
		}
	}
	return out
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

// MaxEngines bounds the data-parallel ranks a server may report: a scrape
// naming a rank past it is garbage, and each rank costs a history ring.
const MaxEngines = 256

// engineRank reads the engine label; servers without data parallelism (or
// older ones) omit it, which means rank 0.
func engineRank(m *dto.Metric) (int, error) {
	raw := labelValue(m, "engine")
	if raw == "" {
		return 0, nil
	}
	rank, err := strconv.Atoi(raw)
	if err != nil || rank < 0 || rank >= MaxEngines {
		return 0, fmt.Errorf("invalid engine label %q (ranks 0 to %d)", raw, MaxEngines-1)
	}
	return rank, nil
}

// positiveIntLabel reads an info-gauge label such as num_gpu_blocks, which
// vLLM renders as "None" before the KV cache is profiled.
func positiveIntLabel(m *dto.Metric, name string) (int, bool) {
	n, err := strconv.Atoi(labelValue(m, name))
	return n, err == nil && n > 0
}
