package server

import (
	"bytes"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
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
		[]string{"block_size", "cache_dtype", "enable_prefix_caching", "gpu_memory_utilization", "kv_cache_size_tokens", "kv_offloading_backend", "kv_offloading_size", "num_cpu_blocks", "num_gpu_blocks", "prefix_caching_hash_algo", "engine"}, nil)

	// The KV connector's prefix cache and the prompt's sources, which vLLM exports with or
	// without a connector.
	externalQueriesDesc = prometheus.NewDesc("vllm:external_prefix_cache_queries_total", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.", engineLabels, nil)
	externalHitsDesc    = prometheus.NewDesc("vllm:external_prefix_cache_hits_total", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.", engineLabels, nil)
	bySourceDesc        = prometheus.NewDesc("vllm:prompt_tokens_by_source_total", "Number of prompt tokens by source.", append(engineLabels[:len(engineLabels):len(engineLabels)], "source"), nil)

	// The OffloadingConnector's transfers, only with a host tier: by transfer_type (PR
	// #27942), and by direction in the name (the later redesign, RFC #44008).
	transferLabels   = append(engineLabels[:len(engineLabels):len(engineLabels)], "transfer_type")
	offloadBytesDesc = prometheus.NewDesc("vllm:kv_offload_total_bytes_total", "Number of bytes offloaded by KV connector", transferLabels, nil)
	offloadTimeDesc  = prometheus.NewDesc("vllm:kv_offload_total_time_total", "Total time measured by all KV offloading operations", transferLabels, nil)
	offloadSizeDesc  = prometheus.NewDesc("vllm:kv_offload_size", "Histogram of KV offload transfer size, in bytes.", transferLabels, nil)
	directionDescs   = [...]offloadDescs{engine.GPUToCPU: newOffloadDescs("store"), engine.CPUToGPU: newOffloadDescs("load")}
)

// offloadDescs are one direction's series named by direction.
type offloadDescs struct{ bytes, time, size *prometheus.Desc }

func newOffloadDescs(op string) offloadDescs {
	return offloadDescs{
		bytes: prometheus.NewDesc("vllm:kv_offload_"+op+"_bytes_total", "Bytes of KV offloading "+op+"s.", engineLabels, nil),
		time:  prometheus.NewDesc("vllm:kv_offload_"+op+"_time_total", "Seconds taken by KV offloading "+op+"s.", engineLabels, nil),
		size:  prometheus.NewDesc("vllm:kv_offload_"+op+"_size", "Histogram of KV offloading "+op+" sizes, in bytes.", engineLabels, nil),
	}
}

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
	// Times are reported in wall seconds, as the clients and warden see
	// them: a server running simulated time faster is, to them, a faster
	// GPU, and a rate learnt from simulated seconds would be that much off.
	wall := func(simSeconds float64) float64 { return simSeconds / c.s.cfg.TimeScale }
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
		counter(externalQueriesDesc, st.ExternalPrefixCacheQueries)
		counter(externalHitsDesc, st.ExternalPrefixCacheHits)
		for _, src := range engine.PromptSources {
			ch <- prometheus.MustNewConstMetric(bySourceDesc, prometheus.CounterValue, value(float64(st.PromptTokensBySource[src])), model, rank, src.String())
		}
		if p.HostTier() {
			c.collectOffload(ch, st, value, wall, model, rank)
		}
		for _, reason := range engine.FinishReasons {
			ch <- prometheus.MustNewConstMetric(successDesc, prometheus.CounterValue, value(float64(st.RequestSuccess[reason])), reason.String(), model, rank)
		}
		buckets := make(map[float64]uint64, len(engine.TTFTBuckets))
		for i, le := range engine.TTFTBuckets {
			buckets[wall(le)] = st.TTFT.Cumulative[i]
		}
		ch <- prometheus.MustNewConstHistogram(ttftDesc, st.TTFT.Count, value(wall(st.TTFT.Sum)), buckets, model, rank)
		ch <- prometheus.MustNewConstMetric(cacheConfigDesc, prometheus.GaugeValue, 1,
			strconv.Itoa(p.BlockSize), "auto", "True", strconv.FormatFloat(p.GPUMemoryUtilization, 'g', -1, 64),
			strconv.Itoa(p.KVCapacityTokens()), p.KVOffloadingBackend, offloadingSizeLabel(p), "0", strconv.Itoa(p.NumGPUBlocks), "sha256", rank)
	}
}

// collectOffload sends an engine's host-tier transfer series. Those labelled by transfer_type
// appear with the first transfer of their type, as in vLLM.
func (c vllmCollector) collectOffload(ch chan<- prometheus.Metric, st engine.Stats, value, wall func(float64) float64, model, rank string) {
	for _, dir := range engine.Directions {
		t := st.Offload[dir]
		buckets := make(map[float64]uint64, len(engine.OffloadSizeBuckets))
		for i, le := range engine.OffloadSizeBuckets {
			buckets[le] = t.Sizes.Cumulative[i]
		}
		d := directionDescs[dir]
		ch <- prometheus.MustNewConstMetric(d.bytes, prometheus.CounterValue, value(t.Bytes), model, rank)
		ch <- prometheus.MustNewConstMetric(d.time, prometheus.CounterValue, value(wall(t.Seconds)), model, rank)
		ch <- prometheus.MustNewConstHistogram(d.size, t.Sizes.Count, t.Sizes.Sum, buckets, model, rank)
		if t.Sizes.Count == 0 {
			continue
		}
		ch <- prometheus.MustNewConstMetric(offloadBytesDesc, prometheus.CounterValue, value(t.Bytes), model, rank, dir.String())
		ch <- prometheus.MustNewConstMetric(offloadTimeDesc, prometheus.CounterValue, value(wall(t.Seconds)), model, rank, dir.String())
		ch <- prometheus.MustNewConstHistogram(offloadSizeDesc, t.Sizes.Count, t.Sizes.Sum, buckets, model, rank, dir.String())
	}
}

// offloadingSizeLabel is cache_config_info's kv_offloading_size as Python prints the float,
// or None without a host tier.
func offloadingSizeLabel(p engine.Profile) string {
	if !p.HostTier() {
		return "None"
	}
	s := strconv.FormatFloat(p.KVOffloadingSize, 'g', -1, 64)
	if !strings.ContainsAny(s, ".e") {
		s += ".0"
	}
	return s
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
