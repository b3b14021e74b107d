package server

import (
	"bytes"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
)

var engineLabels = []string{"model_name", "engine"}

var (
	runningDesc     = prometheus.NewDesc("vllm:num_requests_running", "Number of requests in model execution batches.", engineLabels, nil)
	waitingDesc     = prometheus.NewDesc("vllm:num_requests_waiting", "Number of requests waiting to be processed.", engineLabels, nil)
	kvUsageDesc     = prometheus.NewDesc("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", engineLabels, nil)
	queriesDesc     = prometheus.NewDesc("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", engineLabels, nil)
	hitsDesc        = prometheus.NewDesc("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", engineLabels, nil)
	promptDesc      = prometheus.NewDesc("vllm:prompt_tokens_total", "Number of prefill tokens processed.", engineLabels, nil)
	promptCacheDesc = prometheus.NewDesc("vllm:prompt_tokens_cached_total", "Number of cached prompt tokens (local + external).", engineLabels, nil)
	generationDesc  = prometheus.NewDesc("vllm:generation_tokens_total", "Number of generation tokens processed.", engineLabels, nil)
	preemptionsDesc = prometheus.NewDesc("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", engineLabels, nil)
	successDesc     = prometheus.NewDesc("vllm:request_success_total", "Count of successfully processed requests.", append([]string{"finished_reason"}, engineLabels...), nil)
	ttftDesc        = prometheus.NewDesc("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", engineLabels, nil)
	cacheConfigDesc = prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
		[]string{"block_size", "cache_dtype", "enable_prefix_caching", "gpu_memory_utilization", "kv_cache_size_tokens", "num_cpu_blocks", "num_gpu_blocks", "prefix_caching_hash_algo", "engine"}, nil)
)

// vllmCollector exports every engine's stats with vLLM's names and labels.
type vllmCollector struct{ s *Server }

// Describe sends the descriptors of the series Collect sends.
func (c vllmCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

// Collect sends every engine's series, altered by a nan or negative metrics fault.
func (c vllmCollector) Collect(ch chan<- prometheus.Metric) {
	value := func(v float64) float64 { return v }
	switch c.s.Faults().Metrics {
	case MetricsNaN:
		value = func(float64) float64 { return math.NaN() }
	case MetricsNegative:
		value = func(v float64) float64 { return -v - 1 }
	}
	model := c.s.cfg.modelName()
	p := c.s.cfg.Profile
	for _, r := range c.s.engines {
		st := r.stats()
		rank := strconv.Itoa(r.rank)
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, value(v), model, rank)
		}
		counter := func(d *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, value(float64(v)), model, rank)
		}
		gauge(runningDesc, float64(st.Running))
		gauge(waitingDesc, float64(st.Waiting))
		gauge(kvUsageDesc, st.KVUsage)
		counter(queriesDesc, st.PrefixCacheQueries)
		counter(hitsDesc, st.PrefixCacheHits)
		counter(promptDesc, st.PromptTokens)
		counter(promptCacheDesc, st.PromptTokensCached)
		counter(generationDesc, st.GenerationTokens)
		counter(preemptionsDesc, st.Preemptions)
		for _, reason := range engine.FinishReasons {
			ch <- prometheus.MustNewConstMetric(successDesc, prometheus.CounterValue, value(float64(st.RequestSuccess[reason])), reason.String(), model, rank)
		}
		buckets := make(map[float64]uint64, len(engine.TTFTBuckets))
		for i, le := range engine.TTFTBuckets {
			buckets[le] = st.TTFT.Cumulative[i]
		}
		ch <- prometheus.MustNewConstHistogram(ttftDesc, st.TTFT.Count, st.TTFT.Sum, buckets, model, rank)
		ch <- prometheus.MustNewConstMetric(cacheConfigDesc, prometheus.GaugeValue, 1,
			strconv.Itoa(p.BlockSize), "auto", "True", strconv.FormatFloat(p.GPUMemoryUtilization, 'g', -1, 64),
			strconv.Itoa(p.KVCapacityTokens()), "0", strconv.Itoa(p.NumGPUBlocks), "sha256", rank)
	}
}

// hugeMetricsBytes is how much filler a "huge" /metrics appends.
const hugeMetricsBytes = 16 << 20

// handleMetrics serves the Prometheus text exposition, or the configured misbehaviour.
func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	fault := s.Faults()
	switch fault.Metrics {
	case MetricsSlow:
		select {
		case <-time.After(fault.metricsDelay()):
		case <-r.Context().Done():
			return
		}
	case MetricsGarbage:
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Write([]byte("<html><body>upstream error</body></html>\n\x00\xff{vllm:num_requests_running{engine=\"0\" 1 2 3\n"))
		return
	case MetricsMissing:
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Write([]byte("# vllmsim: no engine metrics\n"))
		return
	}
	families, err := s.registry.Gather()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var body bytes.Buffer
	format := expfmt.NewFormat(expfmt.TypeTextPlain)
	enc := expfmt.NewEncoder(&body, format)
	for _, mf := range families {
		if err := enc.Encode(mf); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	w.Header().Set("Content-Type", string(format))
	w.Write(body.Bytes())
	if fault.Metrics == MetricsHuge {
		w.Write(hugeFiller())
	}
}

// hugeFiller is the valid but useless series a "huge" /metrics appends, built once.
var hugeFiller = sync.OnceValue(func() []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < hugeMetricsBytes; i++ {
		fmt.Fprintf(&b, "vllmsim_filler{series=\"%d\"} %d\n", i, i)
	}
	return b.Bytes()
})

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	if status := s.Faults().HealthStatus; status != 0 {
		w.WriteHeader(status)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// Version is what GET /version reports.
const Version = "0.26.0+vllmsim"

func (s *Server) handleVersion(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"version": Version})
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	names := s.cfg.ServedModelNames
	if len(names) == 0 {
		names = []string{s.cfg.Model}
	}
	created := s.clock.start.Unix()
	data := make([]any, len(names))
	for i, name := range names {
		data[i] = map[string]any{
			"id": name, "object": "model", "created": created, "owned_by": "vllm",
			"root": s.cfg.Model, "parent": nil, "max_model_len": s.cfg.Profile.MaxModelLen,
			"permission": []any{},
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}
