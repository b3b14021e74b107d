package server

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
	"github.com/lmwarden/caddy-warden/internal/testnet"
)

// rawKVEvents follows a KV events publisher with a plain ZMQ SUB socket and decodes each
// batch's events as generic maps, to check what is on the wire.
type rawKVEvents struct {
	mu      sync.Mutex
	batches [][]map[string]any
	err     error
}

func subscribeRaw(t *testing.T, endpoint, topic string) *rawKVEvents {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sock := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(50*time.Millisecond))
	if err := sock.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		t.Fatal(err)
	}
	if err := sock.Dial(endpoint); err != nil {
		t.Fatal(err)
	}
	r := &rawKVEvents{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			msg, err := sock.Recv()
			if err != nil {
				return // closed
			}
			var batch []any
			if len(msg.Frames) == 3 {
				err = msgpack.Unmarshal(msg.Frames[2], &batch)
			}
			r.mu.Lock()
			if err != nil || len(batch) != 3 {
				r.err = fmt.Errorf("batch %v: %v", batch, err)
			} else {
				var events []map[string]any
				for _, ev := range batch[1].([]any) {
					events = append(events, ev.(map[string]any))
				}
				r.batches = append(r.batches, events)
			}
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); sock.Close(); <-done })
	return r
}

// await waits until n batches have arrived and returns them.
func (r *rawKVEvents) await(t *testing.T, n uint64) [][]map[string]any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.mu.Lock()
		got, err := r.batches, r.err
		r.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if uint64(len(got)) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d batches arrived", len(got), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func hashesOf(t *testing.T, ev map[string]any) []uint64 {
	t.Helper()
	var out []uint64
	for _, h := range ev["block_hashes"].([]any) {
		switch v := h.(type) {
		case uint64:
			out = append(out, v)
		case int64:
			out = append(out, uint64(v))
		default:
			t.Fatalf("block hash %v (%T)", h, h)
		}
	}
	return out
}

func keysOf(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestHostTierOverHTTP runs a server with a GPU cache of 64 blocks and a host tier of 96, with
// KV events on. A prompt pushed off the GPU by others comes back from the host tier: the
// reply's cached tokens, the vllm:external_prefix_cache_*, vllm:prompt_tokens_by_source and
// vllm:kv_offload_* series and the CPU events on the wire must all tell that story, as vLLM's
// do. More prompts then overflow the host tier too: its evictions are events as well.
func TestHostTierOverHTTP(t *testing.T) {
	const blockSize, numBlocks, hostBlocks = 16, 64, 96
	s := startServer(t, func(c *Config) {
		c.TimeScale = 50
		c.Profile.BlockSize = blockSize
		c.Profile.NumGPUBlocks = numBlocks
		c.Profile.MaxModelLen = blockSize * numBlocks
		c.Profile.KVOffloadingSize = (hostBlocks + 0.5) * c.Profile.BlockBytes() / (1 << 30)
		c.KVEvents = KVEventsConfig{EnableKVCacheEvents: true, Publisher: "zmq",
			Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", testnet.Port(t)), Topic: "kv-events"}
	})
	p := s.cfg.Profile
	if p.NumHostBlocks() != hostBlocks {
		t.Fatalf("host tier of %d blocks, want %d", p.NumHostBlocks(), hostBlocks)
	}
	raw := subscribeRaw(t, s.KVEventsEndpoint(0), "kv-events")
	pub := s.engines[0].kvEvents
	awaitSubscription(t, pub)

	system := words(1, 60)
	body := func(i int) map[string]any { return openAIBody(system, 8, user(words(100+i, 120))) }
	for i := range 10 { // about 80 blocks: more than the GPU holds, less than the host tier
		post(t, s, "/v1/chat/completions", body(i))
	}
	rawBody, err := json.Marshal(body(0))
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := PromptTokens("/v1/chat/completions", rawBody)
	if err != nil {
		t.Fatal(err)
	}
	s.engines[0].mu.Lock()
	gpu, host := s.engines[0].eng.CachedTokens(tokens), s.engines[0].eng.HostCachedTokens(tokens)
	s.engines[0].mu.Unlock()
	if host == 0 || gpu+host != len(tokens)/blockSize*blockSize {
		t.Fatalf("the first prompt has %d tokens on the GPU and %d more in the host tier, want all %d full blocks' worth", gpu, host, len(tokens)/blockSize)
	}

	before := scrape(t, s)
	again := post(t, s, "/v1/chat/completions", body(0))
	after := scrape(t, s)
	delta := func(key string) float64 { return after[key] - before[key] }
	external := delta(`vllm:external_prefix_cache_hits_total{engine="0"}`)
	if again.cached != gpu+host || delta(`vllm:prefix_cache_hits_total{engine="0"}`) != float64(gpu) || external != float64(host) {
		t.Fatalf("reply cached %d tokens; hits grew by %v on the GPU and %v from the host; want %d = %d + %d",
			again.cached, delta(`vllm:prefix_cache_hits_total{engine="0"}`), external, gpu+host, gpu, host)
	}
	if q := delta(`vllm:external_prefix_cache_queries_total{engine="0"}`); q != float64(len(tokens)-gpu) {
		t.Errorf("external queries grew by %v, want the %d tokens after the GPU hit", q, len(tokens)-gpu)
	}
	if got := delta(`vllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer"}`); got != external {
		t.Errorf("external_kv_transfer grew by %v, want %v", got, external)
	}
	loaded := external * p.KVBytesPerToken
	for key, want := range map[string]float64{
		`vllm:kv_offload_total_bytes_total{engine="0",transfer_type="CPU_to_GPU"}`: loaded,
		`vllm:kv_offload_load_bytes_total{engine="0"}`:                             loaded,
		`vllm:kv_offload_size{engine="0",transfer_type="CPU_to_GPU"}`:              1, // one load
		`vllm:kv_offload_load_size{engine="0"}`:                                    1,
		// in wall seconds: the simulated transfer time over the time scale
		`vllm:kv_offload_total_time_total{engine="0",transfer_type="CPU_to_GPU"}`: p.TransferTime(loaded).Seconds() / s.cfg.TimeScale,
	} {
		if got := delta(key); got != want {
			t.Errorf("%s grew by %v, want %v", key, got, want)
		}
	}
	stored := after[`vllm:kv_offload_store_bytes_total{engine="0"}`]
	if stored == 0 || after[`vllm:kv_offload_total_bytes_total{engine="0",transfer_type="GPU_to_CPU"}`] != stored {
		t.Errorf("stores: %v bytes, by transfer_type %v", stored, after[`vllm:kv_offload_total_bytes_total{engine="0",transfer_type="GPU_to_CPU"}`])
	}
	info := fmt.Sprintf(`vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",kv_cache_size_tokens="1024",kv_offloading_backend="native",kv_offloading_size="%s",num_cpu_blocks="0",num_gpu_blocks="64",prefix_caching_hash_algo="sha256"}`,
		offloadingSizeLabel(p))
	if after[info] != 1 {
		t.Errorf("missing %s", info)
	}

	for i := 10; i < 20; i++ { // overflow the host tier as well
		post(t, s, "/v1/chat/completions", body(i))
	}
	checkHostEventsOnTheWire(t, raw.await(t, pub.published.Load()), hostBlocks, engine.BlockHashes(tokens, blockSize))
}

// checkHostEventsOnTheWire replays the CPU events of every batch: they must have the
// OffloadingConnector's fields, follow the GPU's in each batch, replay without contradiction
// to at most the tier's size, include evictions, and have stored every full block of prompt.
func checkHostEventsOnTheWire(t *testing.T, batches [][]map[string]any, capacity int, prompt []uint64) {
	t.Helper()
	storedKeys := []string{"block_hashes", "block_size", "lora_id", "lora_name", "medium", "parent_block_hash", "token_ids", "type"}
	host := map[uint64]bool{}
	everStored := map[uint64]bool{}
	removals := 0
	for _, events := range batches {
		sawCPU := false
		for _, ev := range events {
			if ev["medium"] != "CPU" {
				if sawCPU {
					t.Fatalf("a GPU event after a CPU event in one batch: %v", events)
				}
				if _, ok := ev["group_idx"]; !ok {
					t.Fatalf("a GPU event without group_idx: %v", ev)
				}
				continue
			}
			sawCPU = true
			hashes := hashesOf(t, ev)
			switch ev["type"] {
			case "BlockStored":
				if keys := keysOf(ev); !slices.Equal(keys, storedKeys) || ev["parent_block_hash"] != nil || len(ev["token_ids"].([]any)) != 0 {
					t.Fatalf("CPU BlockStored %v: want keys %v, no parent, no tokens", ev, storedKeys)
				}
				for _, h := range hashes {
					if host[h] {
						t.Fatalf("CPU block %x stored twice", h)
					}
					host[h], everStored[h] = true, true
				}
			case "BlockRemoved":
				if keys := keysOf(ev); !slices.Equal(keys, []string{"block_hashes", "medium", "type"}) {
					t.Fatalf("CPU BlockRemoved %v", ev)
				}
				for _, h := range hashes {
					if !host[h] {
						t.Fatalf("CPU block %x removed, never stored", h)
					}
					delete(host, h)
				}
				removals++
			}
		}
	}
	if removals == 0 || len(host) > capacity {
		t.Fatalf("%d CPU removals, %d blocks left in a tier of %d", removals, len(host), capacity)
	}
	for i, h := range prompt {
		if !everStored[h] {
			t.Fatalf("the prompt's block %d never had a CPU BlockStored", i)
		}
	}
}
