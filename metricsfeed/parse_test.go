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
		},
		{
			Model: model, Engine: 1, Running: 3, Waiting: 0, KVUsage: 0.32,
			PrefixQueries: 80000, PrefixHits: 40000, PromptTokens: 79000, PromptTokensCached: 39500,
			GenerationTokens: 5100, Preemptions: 0, RequestSuccess: 12, BlockSize: 16, NumGPUBlocks: 2496,
		},
	}
	allFields := FieldRunning | FieldWaiting | FieldKVUsage | FieldPrefixQueries | FieldPrefixHits |
		FieldPromptTokens | FieldPromptTokensCached | FieldGenerationTokens | FieldPreemptions |
		FieldRequestSuccess | FieldBlockSize | FieldNumGPUBlocks
	for i, got := range s.Engines {
		want[i].Present = allFields
		if got != want[i] {
			t.Errorf("engine %d:\n got %+v\nwant %+v", i, got, want[i])
		}
	}
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
		"empty":             "",
		"garbage":           "<html><body>502 Bad Gateway</body></html>\n",
		"no vLLM series":    "# TYPE python_gc_objects_collected_total counter\npython_gc_objects_collected_total 3\n",
		"only cache info":   `vllm:cache_config_info{block_size="16",num_gpu_blocks="2500"} 1` + "\n",
		"NaN running":       `vllm:num_requests_running{engine="0"} NaN` + "\n",
		"negative waiting":  `vllm:num_requests_waiting{engine="0"} -1` + "\n",
		"infinite KV":       `vllm:kv_cache_usage_perc{engine="0"} +Inf` + "\n",
		"KV above one":      `vllm:kv_cache_usage_perc{engine="0"} 1.5` + "\n",
		"NaN counter":       `vllm:prompt_tokens_total{engine="0"} NaN` + "\n",
		"huge queue":        `vllm:num_requests_running{engine="0"} 1e300` + "\n",
		"bad engine label":  `vllm:num_requests_running{engine="zero"} 1` + "\n",
		"negative engine":   `vllm:num_requests_running{engine="-1"} 1` + "\n",
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
			if e.Running < 0 || e.Waiting < 0 || !(e.KVUsage >= 0 && e.KVUsage <= 1) {
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
