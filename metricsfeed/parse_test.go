package metricsfeed

import (
	"errors"
	"math"
	"os"
	"strings"
	"testing"
)

func parseFile(t *testing.T, name string) Scrape {
	t.Helper()
	f, err := os.Open("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s, err := Parse(f)
	if err != nil {
		t.Fatalf("Parse(%s): %v", name, err)
	}
	return s
}

func TestParseTwoEngines(t *testing.T) {
	s := parseFile(t, "vllm_two_engines.txt")
	if len(s.Engines) != 2 {
		t.Fatalf("got %d engines, want 2", len(s.Engines))
	}
	const model = "Qwen/Qwen3-4B-Instruct-2507"
	want := []EngineStats{
		{
			Model: model, Engine: 0, Running: 5, Waiting: 2, KVUsage: 0.45,
			PrefixQueries: 120000, PrefixHits: 96000, PromptTokens: 118000, PromptTokensCached: 95000,
			GenerationTokens: 7300, Preemptions: 1, RequestSuccess: 30, BlockSize: 16, NumGPUBlocks: 2500,
			TTFTSeconds: 11.2, TTFTCount: 30,
		},
		{
			Model: model, Engine: 1, Running: 3, Waiting: 0, KVUsage: 0.32,
			PrefixQueries: 80000, PrefixHits: 40000, PromptTokens: 79000, PromptTokensCached: 39500,
			GenerationTokens: 5100, Preemptions: 0, RequestSuccess: 12, BlockSize: 16, NumGPUBlocks: 2496,
			TTFTSeconds: 19.5, TTFTCount: 12,
		},
	}
	allFields := FieldRunning | FieldWaiting | FieldKVUsage | FieldPrefixQueries | FieldPrefixHits |
		FieldPromptTokens | FieldPromptTokensCached | FieldGenerationTokens | FieldPreemptions |
		FieldRequestSuccess | FieldBlockSize | FieldNumGPUBlocks | FieldTTFT
	for i, got := range s.Engines {
		want[i].Present = allFields
		if withoutCreated(got) != want[i] {
			t.Errorf("engine %d:\n got %+v\nwant %+v", i, got, want[i])
		}
		// prometheus_client's _created samples, for the counters that are
		// one series an engine; request_success sums three.
		for _, f := range []Field{FieldPrefixQueries, FieldPrefixHits, FieldPromptTokens, FieldGenerationTokens} {
			if c := got.Created(f); c != 1.7601e9 {
				t.Errorf("engine %d: counter %b created at %v, want 1.7601e9", i, f, c)
			}
		}
		for _, f := range []Field{FieldPromptTokensCached, FieldRequestSuccess, FieldRunning} {
			if c := got.Created(f); c != 0 {
				t.Errorf("engine %d: field %b created at %v, want unknown", i, f, c)
			}
		}
	}
}

// withoutCreated is e without its counters' creation times.
func withoutCreated(e EngineStats) EngineStats {
	e.created = [len(e.created)]float64{}
	return e
}

func TestParseLegacyGaugeNameAndNoEngineLabel(t *testing.T) {
	s := parseFile(t, "vllm_legacy_single.txt")
	if len(s.Engines) != 1 {
		t.Fatalf("got %d engines, want 1", len(s.Engines))
	}
	e := s.Engines[0]
	if e.Engine != 0 || e.Model != "meta-llama/Llama-3.1-8B-Instruct" {
		t.Errorf("engine %d model %q", e.Engine, e.Model)
	}
	if e.Running != 1 || e.Waiting != 4 || e.KVUsage != 0.875 || !e.Has(LoadFields) {
		t.Errorf("load: %+v", e)
	}
	if e.RequestSuccess != 135 || !e.Has(FieldRequestSuccess) {
		t.Errorf("request success %v, present %v", e.RequestSuccess, e.Has(FieldRequestSuccess))
	}
	for _, f := range []Field{FieldPrefixQueries, FieldPrefixHits, FieldPromptTokens, FieldPromptTokensCached, FieldGenerationTokens, FieldPreemptions} {
		if e.Has(f) {
			t.Errorf("field %b reported present but the body lacks it", f)
		}
	}
	if e.BlockSize != 32 || !e.Has(FieldBlockSize) || e.Has(FieldNumGPUBlocks) {
		t.Errorf("cache config: block %d, present %b", e.BlockSize, e.Present)
	}
}

// hostTierStats is what the host-tier fixtures hold: the stores' bytes
// come from kv_offload_store_bytes or, in 0.11's names, from
// kv_offload_total_bytes's GPU_to_CPU series alone.
var hostTierStats = EngineStats{
	Model:         "Qwen/Qwen3-4B-Instruct-2507",
	PrefixQueries: 9500, PrefixHits: 720, PromptTokens: 9500, PromptTokensCached: 1680,
	ExternalQueries: 8780, ExternalHits: 960, HostStoredBytes: 1.14425856e9,
	GenerationTokens: 20, RequestSuccess: 5, TTFTSeconds: 1.614795885, TTFTCount: 5,
	BlockSize: 16, NumGPUBlocks: 400, HostTierGiB: 1,
	Present: LoadFields | PrefixFields | FieldPromptTokens | FieldPromptTokensCached | FieldGenerationTokens |
		FieldPreemptions | FieldRequestSuccess | FieldBlockSize | FieldNumGPUBlocks | FieldTTFT |
		FieldExternalQueries | FieldExternalHits | FieldHostStoredBytes,
}

// TestParseNameVariants reads saved /metrics bodies of the servers warden
// meets: each must give the same kind of stats whatever the series are
// called, and a series a server does not publish must stay absent.
func TestParseNameVariants(t *testing.T) {
	cases := []struct {
		file string
		want EngineStats
	}{
		{
			// client_golang counters without _total
			file: "llmd_sim_no_total.txt",
			want: EngineStats{
				Model: "Qwen/Qwen2.5-1.5B-Instruct", Running: 2, KVUsage: 0.1875,
				PrefixQueries: 2000, PrefixHits: 750, PromptTokens: 2000, GenerationTokens: 1536, RequestSuccess: 12,
				BlockSize: 16, NumGPUBlocks: 1024,
				Present: LoadFields | PrefixFields | FieldPromptTokens | FieldGenerationTokens | FieldRequestSuccess | FieldBlockSize | FieldNumGPUBlocks,
			},
		},
		{
			// current and deprecated names side by side: counted once
			file: "vllm_v1_both_prefix_names.txt",
			want: EngineStats{
				Model: "Qwen/Qwen3-8B", Running: 4, KVUsage: 0.21,
				PrefixQueries: 64000, PrefixHits: 48000, PromptTokens: 63500, GenerationTokens: 4100, RequestSuccess: 42,
				BlockSize: 16, NumGPUBlocks: 8192,
				Present: LoadFields | PrefixFields | FieldPromptTokens | FieldGenerationTokens | FieldPreemptions | FieldRequestSuccess | FieldBlockSize | FieldNumGPUBlocks,
			},
		},
		{
			// only the deprecated gpu_ names
			file: "vllm_v1_pre09_gpu_prefix.txt",
			want: EngineStats{
				Model: "Qwen/Qwen3-8B", Running: 4, KVUsage: 0.21,
				PrefixQueries: 64000, PrefixHits: 48000, PromptTokens: 63500, GenerationTokens: 4100, RequestSuccess: 42,
				BlockSize: 16, NumGPUBlocks: 8192,
				Present: LoadFields | PrefixFields | FieldPromptTokens | FieldGenerationTokens | FieldPreemptions | FieldRequestSuccess | FieldBlockSize | FieldNumGPUBlocks,
			},
		},
		{
			// V0: a hit-rate gauge instead of counters
			file: "vllm_v0_gpu_names.txt",
			want: EngineStats{
				Model: "meta-llama/Llama-3.1-8B-Instruct", Running: 3, Waiting: 1, KVUsage: 0.3125,
				PromptTokens: 48211, GenerationTokens: 9102, Preemptions: 2, RequestSuccess: 61, ReportedHitRate: 0.4375,
				BlockSize: 16, NumGPUBlocks: 27690,
				Present: LoadFields | FieldPromptTokens | FieldGenerationTokens | FieldPreemptions | FieldRequestSuccess | FieldReportedHitRate | FieldBlockSize | FieldNumGPUBlocks,
			},
		},
		{
			// a host-memory KV tier (vllmsim --kv-offloading-size 1, after five
			// requests): the tokens the GPU missed that the tier was asked for
			// and served
			file: "vllmsim_host_tier.txt",
			want: hostTierStats,
		},
		{
			// a patched 0.11.0's names for the same counters
			file: "vllm_v011_connector_names.txt",
			want: hostTierStats,
		},
		{
			// nothing about the prefix cache at all
			file: "no_prefix_counters.txt",
			want: EngineStats{
				Model: "Qwen/Qwen2.5-1.5B-Instruct", Running: 1, KVUsage: 0.0625,
				PromptTokens: 3200, GenerationTokens: 640, RequestSuccess: 5,
				BlockSize: 16, NumGPUBlocks: 1024,
				Present: LoadFields | FieldPromptTokens | FieldGenerationTokens | FieldRequestSuccess | FieldBlockSize | FieldNumGPUBlocks,
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			s := parseFile(t, tc.file)
			if len(s.Engines) != 1 {
				t.Fatalf("got %d engines, want 1: %+v", len(s.Engines), s.Engines)
			}
			if got := withoutCreated(s.Engines[0]); got != tc.want {
				t.Errorf("\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestParseCounterSpellings checks every counter under each of its names,
// with and without _total, typed or untyped.
func TestParseCounterSpellings(t *testing.T) {
	cases := map[string]Field{
		"vllm:prefix_cache_queries": FieldPrefixQueries, "vllm:gpu_prefix_cache_queries": FieldPrefixQueries,
		"vllm:prefix_cache_hits": FieldPrefixHits, "vllm:gpu_prefix_cache_hits": FieldPrefixHits,
		"vllm:prompt_tokens": FieldPromptTokens, "vllm:prompt_tokens_cached": FieldPromptTokensCached,
		"vllm:generation_tokens": FieldGenerationTokens, "vllm:num_preemptions": FieldPreemptions,
		"vllm:request_success": FieldRequestSuccess,
	}
	for name, field := range cases {
		for _, spelling := range []string{name, name + "_total"} {
			for _, typed := range []bool{false, true} {
				body := spelling + `{engine="0"} 7` + "\n"
				if typed {
					body = "# TYPE " + spelling + " counter\n" + body
				}
				s, err := Parse(strings.NewReader(body))
				if err != nil {
					t.Errorf("%q: %v", body, err)
					continue
				}
				if e := s.Engines[0]; e.Present != field {
					t.Errorf("%q: present %b, want only %b", body, e.Present, field)
				}
			}
		}
	}
}

func TestParseReportedHitRate(t *testing.T) {
	s, err := Parse(strings.NewReader(`vllm:gpu_prefix_cache_hit_rate{model_name="m"} -1.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
`))
	if err != nil {
		t.Fatalf("-1 (prefix caching disabled) rejected the scrape: %v", err)
	}
	if e := s.Engines[0]; e.Has(FieldReportedHitRate) || !e.Has(FieldKVUsage) {
		t.Errorf("-1 hit rate: present %b, want KV usage only", e.Present)
	}
	for _, bad := range []string{"NaN", "1.5"} {
		if _, err := Parse(strings.NewReader("vllm:gpu_prefix_cache_hit_rate " + bad + "\n")); err == nil {
			t.Errorf("hit rate %s accepted", bad)
		}
	}
}

func TestParsePrefersCurrentKVName(t *testing.T) {
	body := `vllm:gpu_cache_usage_perc{engine="0"} 0.9
vllm:kv_cache_usage_perc{engine="0"} 0.2
vllm:gpu_cache_usage_perc{engine="1"} 0.7
`
	s, err := Parse(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if s.Engines[0].KVUsage != 0.2 || s.Engines[1].KVUsage != 0.7 {
		t.Errorf("KV usage %v, %v; want 0.2 (current name wins), 0.7 (legacy fallback)", s.Engines[0].KVUsage, s.Engines[1].KVUsage)
	}
}

func TestParseToleratesFloatErrorAndMissingNewline(t *testing.T) {
	s, err := Parse(strings.NewReader(`vllm:kv_cache_usage_perc{engine="3"} 1.0000000001`))
	if err != nil {
		t.Fatal(err)
	}
	e, ok := s.Engine(3)
	if !ok || e.KVUsage != 1 {
		t.Errorf("Engine(3) = %+v, %v; want KV usage clamped to 1", e, ok)
	}
	if _, ok := s.Engine(0); ok {
		t.Error("Engine(0) found in a scrape that only has engine 3")
	}
}

func TestParseRejects(t *testing.T) {
	cases := map[string]string{
		"empty":            "",
		"garbage":          "<html><body>502 Bad Gateway</body></html>\n",
		"no vLLM series":   "# TYPE python_gc_objects_collected_total counter\npython_gc_objects_collected_total 3\n",
		"only cache info":  `vllm:cache_config_info{block_size="16",num_gpu_blocks="2500"} 1` + "\n",
		"NaN running":      `vllm:num_requests_running{engine="0"} NaN` + "\n",
		"negative waiting": `vllm:num_requests_waiting{engine="0"} -1` + "\n",
		"infinite KV":      `vllm:kv_cache_usage_perc{engine="0"} +Inf` + "\n",
		"KV above one":     `vllm:kv_cache_usage_perc{engine="0"} 1.5` + "\n",
		"NaN counter":      `vllm:prompt_tokens_total{engine="0"} NaN` + "\n",
		"huge queue":       `vllm:num_requests_running{engine="0"} 1e300` + "\n",
		"huge counter":     `vllm:num_requests_running{engine="0"} 1` + "\n" + `vllm:generation_tokens_total{engine="0"} 1.7e308` + "\n",
		"counters summing past the bound": `vllm:num_requests_running{engine="0"} 1` + "\n" +
			`vllm:request_success_total{engine="0",finished_reason="stop"} 5e15` + "\n" + `vllm:request_success_total{engine="0",finished_reason="length"} 5e15` + "\n",
		"bad engine label":  `vllm:num_requests_running{engine="zero"} 1` + "\n",
		"negative engine":   `vllm:num_requests_running{engine="-1"} 1` + "\n",
		"engine past bound": `vllm:num_requests_running{engine="256"} 1` + "\n",
		"duplicate gauge":   `vllm:num_requests_running{engine="0",model_name="a"} 1` + "\n" + `vllm:num_requests_running{engine="0",model_name="b"} 2` + "\n",
		"histogram running": "# TYPE vllm:num_requests_running histogram\n" + `vllm:num_requests_running_count{engine="0"} 2` + "\n",
		"truncated line":    `vllm:num_requests_running{engine="0"`,
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			s, err := Parse(strings.NewReader(body))
			if err == nil {
				t.Fatalf("Parse accepted %q: %+v", body, s)
			}
			if len(s.Engines) != 0 {
				t.Errorf("error %v came with a partial result %+v", err, s)
			}
		})
	}
	if _, err := Parse(strings.NewReader("")); !errors.Is(err, ErrNoVLLMSeries) {
		t.Errorf("empty body: %v, want ErrNoVLLMSeries", err)
	}
}

// FuzzParse checks that no input panics Parse and that every accepted scrape
// holds only values a router may trust. Its seeds (testdata/fuzz/FuzzParse)
// are kept small so that minimizing new inputs stays quick.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte) {
		s, err := Parse(strings.NewReader(string(body)))
		if err != nil {
			return
		}
		if len(s.Engines) == 0 {
			t.Fatal("accepted scrape has no engine")
		}
		for i, e := range s.Engines {
			if i > 0 && e.Engine <= s.Engines[i-1].Engine {
				t.Fatalf("engines not strictly sorted: %d after %d", e.Engine, s.Engines[i-1].Engine)
			}
			if e.Running < 0 || e.Waiting < 0 || !(e.KVUsage >= 0 && e.KVUsage <= 1) || !(e.ReportedHitRate >= 0 && e.ReportedHitRate <= 1) {
				t.Fatalf("invalid load accepted: %+v", e)
			}
			for _, v := range []float64{e.PrefixQueries, e.PrefixHits, e.PromptTokens, e.PromptTokensCached, e.GenerationTokens, e.Preemptions, e.RequestSuccess} {
				if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
					t.Fatalf("invalid counter accepted: %+v", e)
				}
			}
		}
	})
}

func BenchmarkParseTwoEngines(b *testing.B) {
	body, err := os.ReadFile("testdata/vllm_two_engines.txt")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := Parse(strings.NewReader(string(body))); err != nil {
			b.Fatal(err)
		}
	}
}

// The process start time tells a restart; a body without it says nothing.
func TestParseProcessStart(t *testing.T) {
	body := "vllm:num_requests_running{engine=\"0\"} 1\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds 1.76012345e+09\n"
	s, err := Parse(strings.NewReader(body))
	if err != nil || s.ProcessStart != 1.76012345e9 {
		t.Errorf("process start %v (%v), want 1.76012345e9", s.ProcessStart, err)
	}
	if s := parseFile(t, "llmd_sim_no_total.txt"); s.ProcessStart != 0 {
		t.Errorf("process start %v from a body without it", s.ProcessStart)
	}
}
