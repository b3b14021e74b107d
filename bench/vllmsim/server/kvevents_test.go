package server

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
	"github.com/lmwarden/caddy-warden/internal/testnet"
	"github.com/lmwarden/caddy-warden/kvevents"
)

func TestParseKVEventsConfig(t *testing.T) {
	c, err := ParseKVEventsConfig(`{"enable_kv_cache_events": true, "topic": "kv-events"}`)
	if err != nil || c.Publisher != "zmq" || c.Endpoint != defaultKVEventsEndpoint {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	if c.endpoint(2) != "tcp://127.0.0.1:5559" {
		t.Fatalf("rank 2 must publish on port+2, got %s", c.endpoint(2))
	}
	for _, bad := range []string{
		`{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}`,
		`{"enable_kv_cache_events": true, "endpoint": "tcp://0.0.0.0:5557"}`,
		`{"enable_kv_cache_events": true, "endpoint": "ipc:///tmp/kv"}`,
		`{"enable_kv_cache_events": true, "publisher": "nats"}`,
		`{"enable_kv_cache_events": true, "replay_endpoint": "tcp://127.0.0.1:5558"}`,
		`not json`,
	} {
		if _, err := ParseKVEventsConfig(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	if c, err := ParseKVEventsConfig(`{"enable_kv_cache_events": true, "publisher": "null"}`); err != nil || c.enabled() {
		t.Fatalf("the null publisher must turn events off: %+v, %v", c, err)
	}
}

func TestNoKVEventsSocketByDefault(t *testing.T) {
	s := startServer(t, nil)
	if ep := s.KVEventsEndpoint(0); ep != "" {
		t.Fatalf("events are off by default, yet published on %s", ep)
	}
}

// TestKVEventsFollowTheEngineCache runs the server with KV events on a loopback port and a
// cache of 64 blocks, follows it with the kvevents consumer, and checks after each request
// that the consumer's view of a prompt's chain is what the engine itself reports as cached
// when the prompt comes again; then that prompts evicted by later ones disappear from it.
func TestKVEventsFollowTheEngineCache(t *testing.T) {
	const blockSize, numBlocks = 16, 64
	s := startServer(t, func(c *Config) {
		c.TimeScale = 50
		c.Profile.BlockSize = blockSize
		c.Profile.NumGPUBlocks = numBlocks
		c.Profile.MaxModelLen = blockSize * numBlocks
		c.KVEvents = KVEventsConfig{EnableKVCacheEvents: true, Publisher: "zmq",
			Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", testnet.Port(t)), Topic: "kv-events"}
	})
	sub, err := kvevents.Subscribe(kvevents.Options{Endpoint: s.KVEventsEndpoint(0), Topic: "kv-events"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	pub := s.engines[0].kvEvents
	awaitSubscription(t, pub)

	// synced waits until the consumer has applied every batch published so far.
	synced := func() {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for sub.Stats().Batches < pub.published.Load() {
			if time.Now().After(deadline) {
				t.Fatalf("consumer stuck at %+v, %d batches published", sub.Stats(), pub.published.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// check sends body again and compares the engine's cached blocks with the consumer's view
	// of the moment before, returning that number of blocks.
	check := func(name string, body map[string]any) int {
		t.Helper()
		synced()
		viewed := sub.Cached(hitChain(t, body, blockSize))
		again := post(t, s, "/v1/chat/completions", body)
		if again.status != 200 {
			t.Fatalf("%s: status %d", name, again.status)
		}
		if again.cached%blockSize != 0 || again.cached/blockSize != viewed {
			t.Fatalf("%s: the engine served %d cached tokens, the consumer saw %d blocks of %d", name, again.cached, viewed, blockSize)
		}
		return viewed
	}

	system := words(1, 60)
	prompts := make([]map[string]any, 10)
	for i := range prompts {
		prompts[i] = openAIBody(system, 8, user(words(100+i, 120)))
	}
	post(t, s, "/v1/chat/completions", prompts[0])
	if n := check("first prompt, repeated", prompts[0]); n == 0 {
		t.Fatal("a repeated prompt must hit the cache")
	}
	if n := check("second prompt, sharing the system prompt", prompts[1]); n == 0 {
		t.Fatal("the shared system prompt must hit")
	}
	firstHit := check("first prompt, third time", prompts[0])
	for _, p := range prompts[2:] { // eight more prompts overflow the 64-block cache
		post(t, s, "/v1/chat/completions", p)
	}
	synced()
	if n := check("first prompt, after evictions", prompts[0]); n >= firstHit {
		t.Fatalf("the first prompt kept %d of its %d cached blocks: nothing was evicted", n, firstHit)
	}
	if st := sub.Stats(); st.Gaps != 0 || st.Garbage != 0 || st.Blocks > numBlocks {
		t.Fatalf("consumer stats %+v (cache of %d blocks)", st, numBlocks)
	}
}

// hitChain is the part of body's block-hash chain a prefix hit can use: the full blocks before
// the prompt's last token, which the engine always computes.
func hitChain(t *testing.T, body map[string]any, blockSize int) []uint64 {
	t.Helper()
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := PromptTokens("/v1/chat/completions", raw)
	if err != nil {
		t.Fatal(err)
	}
	return engine.BlockHashes(tokens[:len(tokens)-1], blockSize)
}

// awaitSubscription waits until a subscriber's subscription reached the publisher: PUB drops
// what it sends before that.
func awaitSubscription(t *testing.T, pub *kvPublisher) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(pub.sock.(interface{ Topics() []string }).Topics()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no subscriber reached the publisher")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
