package engine

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
	for i := len(TTFTBuckets) - 1; i >= 0 && seconds <= TTFTBuckets[i]; i-- {
		h.Cumulative[i]++
	}
	h.Count++
	h.Sum += seconds
}

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
	// PromptTokensCached is vllm:prompt_tokens_cached_total.
	PromptTokensCached uint64
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
