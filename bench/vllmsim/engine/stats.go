package engine

import "time"

// TTFTBuckets are the upper bounds, in seconds, of vLLM's time-to-first-token histogram.
var TTFTBuckets = [...]float64{
	0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
	1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
}

// Histogram is a Prometheus histogram over TTFTBuckets.
type Histogram struct {
	// Cumulative[i] counts observations <= TTFTBuckets[i].
	Cumulative [len(TTFTBuckets)]uint64
	// Count counts all observations (the +Inf bucket).
	Count uint64
	// Sum adds up all observed values, in seconds.
	Sum float64
}

func (h *Histogram) observe(seconds float64) {
	observeBuckets(h.Cumulative[:], TTFTBuckets[:], seconds)
	h.Count++
	h.Sum += seconds
}

// observeBuckets counts v in every cumulative bucket whose upper bound it does not exceed.
func observeBuckets(cumulative []uint64, bounds []float64, v float64) {
	for i := len(bounds) - 1; i >= 0 && v <= bounds[i]; i-- {
		cumulative[i]++
	}
}

// OffloadSizeBuckets are the upper bounds, in bytes, of vLLM's vllm:kv_offload_size histogram.
var OffloadSizeBuckets = [...]float64{1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6}

// SizeHistogram is a Prometheus histogram over OffloadSizeBuckets.
type SizeHistogram struct {
	// Cumulative[i] counts observations <= OffloadSizeBuckets[i].
	Cumulative [len(OffloadSizeBuckets)]uint64
	// Count counts all observations (the +Inf bucket).
	Count uint64
	// Sum adds up all observed values, in bytes.
	Sum float64
}

// Direction is the way a copy between the GPU and the host tier goes.
type Direction uint8

// The directions, as vLLM's transfer_type label names them.
const (
	GPUToCPU Direction = iota // a store
	CPUToGPU                  // a load
	numDirections
)

// Directions lists both directions, for exporting counters.
var Directions = []Direction{GPUToCPU, CPUToGPU}

var transferTypes = [numDirections]string{GPUToCPU: "GPU_to_CPU", CPUToGPU: "CPU_to_GPU"}

// String returns vLLM's transfer_type label value.
func (d Direction) String() string { return transferTypes[d] }

// Transfers add up the copies in one direction, as vLLM's OffloadingConnector records them:
// one per store job (a request's new blocks in a step) or load (a request's host hit).
type Transfers struct {
	// Bytes is vllm:kv_offload_total_bytes_total.
	Bytes float64
	// Seconds is vllm:kv_offload_total_time_total: the copies' own durations.
	Seconds float64
	// Sizes is vllm:kv_offload_size, one observation per copy, in bytes.
	Sizes SizeHistogram
}

func (t *Transfers) record(bytes float64, dur time.Duration) {
	t.Bytes += bytes
	t.Seconds += dur.Seconds()
	observeBuckets(t.Sizes.Cumulative[:], OffloadSizeBuckets[:], bytes)
	t.Sizes.Count++
	t.Sizes.Sum += bytes
}

// PromptSource says where a prompt token's KV came from, as vLLM's
// vllm:prompt_tokens_by_source counts it.
type PromptSource uint8

// The sources, in the order vLLM declares them (PromptTokenStats.ALL_SOURCES).
const (
	SourceLocalCompute       PromptSource = iota // computed by the engine
	SourceLocalCacheHit                          // the GPU prefix cache
	SourceExternalKVTransfer                     // loaded from the host tier
	numPromptSources
)

// PromptSources lists the sources, for exporting counters.
var PromptSources = []PromptSource{SourceLocalCompute, SourceLocalCacheHit, SourceExternalKVTransfer}

var sourceNames = [numPromptSources]string{
	SourceLocalCompute: "local_compute", SourceLocalCacheHit: "local_cache_hit", SourceExternalKVTransfer: "external_kv_transfer",
}

// String returns vLLM's source label value.
func (s PromptSource) String() string { return sourceNames[s] }

// Stats are the gauges and counters vLLM exports for one engine. Counters count tokens unless
// their name says otherwise; times are in the caller's clock.
type Stats struct {
	// Running is vllm:num_requests_running.
	Running int
	// Waiting is vllm:num_requests_waiting (preempted requests included).
	Waiting int
	// KVUsage is vllm:kv_cache_usage_perc: the share of blocks in use by requests (0..1).
	KVUsage float64
	// PrefixCacheQueries is vllm:prefix_cache_queries_total.
	PrefixCacheQueries uint64
	// PrefixCacheHits is vllm:prefix_cache_hits_total.
	PrefixCacheHits uint64
	// PromptTokens is vllm:prompt_tokens_total.
	PromptTokens uint64
	// PromptTokensCached is vllm:prompt_tokens_cached_total (GPU and host tier).
	PromptTokensCached uint64
	// PromptTokensBySource is vllm:prompt_tokens_by_source_total, indexed by PromptSource.
	PromptTokensBySource [numPromptSources]uint64
	// ExternalPrefixCacheQueries is vllm:external_prefix_cache_queries_total: the tokens
	// after each GPU hit that the host tier was asked for (0 without a tier).
	ExternalPrefixCacheQueries uint64
	// ExternalPrefixCacheHits is vllm:external_prefix_cache_hits_total: the tokens loaded
	// from the host tier.
	ExternalPrefixCacheHits uint64
	// Offload are the copies to (GPUToCPU) and from (CPUToGPU) the host tier.
	Offload [numDirections]Transfers
	// GenerationTokens is vllm:generation_tokens_total.
	GenerationTokens uint64
	// Preemptions is vllm:num_preemptions_total (a count of preemptions).
	Preemptions uint64
	// RequestSuccess is vllm:request_success_total (requests), indexed by FinishReason.
	RequestSuccess [numFinishReasons]uint64
	// TTFT is vllm:time_to_first_token_seconds.
	TTFT Histogram
}

// Stats returns the engine's current gauges and counters.
func (e *Engine) Stats() Stats {
	s := e.counters
	s.Running = len(e.running)
	s.Waiting = len(e.waiting)
	s.KVUsage = 1 - float64(e.pool.numFree)/float64(e.profile.NumGPUBlocks)
	return s
}
