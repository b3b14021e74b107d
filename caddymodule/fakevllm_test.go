package caddymodule_test

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeVLLM is a minimal vLLM stand-in for the integration tests: it streams
// Anthropic SSE responses, serves /health and a /metrics body in vLLM's
// format whose running counts are its real in-flight requests, and records
// which conversation reached which engine. Its token counters take one token
// per request body byte, count a conversation's previous prompt on the same
// engine as cached, and one generated token per response. Each engine's KV
// cache is fakeKVBlocks blocks of fakeBlockSize tokens (cache_config_info).
type fakeVLLM struct {
	name    string
	addr    string
	engines int
	srv     *http.Server

	running []atomic.Int64 // per engine
	scrapes atomic.Int64   // GET /metrics served

	// Set before the first scrape: noTotal names the counters without
	// _total (as llm-d-inference-sim does), noPrefix leaves out the
	// prefix-cache counters and prompt_tokens_cached.
	noTotal, noPrefix bool

	mu         sync.Mutex
	seen       []seenRequest
	tokens     []engineTokens // per engine
	lastPrompt map[string]int // by engine and session: the prefix that engine holds
}

type engineTokens struct {
	prompt, cached, generated int
	ttft                      float64 // seconds, summed: the uncached part at fakePrefillRate
}

// fakePrefillRate is the rate at which the fake's time to first token
// grows with the uncached part of a prompt, in tokens (bytes) per second.
const fakePrefillRate = 200000

// The KV cache each fake engine reports: 40,000 tokens, as an A4000's.
const (
	fakeKVBlocks  = 2500
	fakeBlockSize = 16
)

type seenRequest struct {
	session string
	rank    string // X-data-parallel-rank as received
	apiKey  string // X-Api-Key as received
	// oneToken: the body asked for one token and no stream, as a refresh
	// does; said is its first message's content.
	oneToken bool
	said     string
}

// holdHeader asks the fake to keep the stream open that long before its
// reply; gateHeader, until the test opens the gate it names (newGate);
// lingerGateHeader, after its last event until the gate it names opens.
const (
	holdHeader       = "X-Test-Hold"
	gateHeader       = "X-Test-Gate"
	lingerGateHeader = "X-Test-Linger-Gate"
)

// gates are the gates of gateHeader by name, each a channel closed when it
// opens.
var (
	gates     sync.Map
	gateCount atomic.Int64
)

// newGate is a gate for gateHeader: requests that name it are held, after
// their first event, until open is called or the test ends.
func newGate(t *testing.T) (name string, open func()) {
	name = fmt.Sprint("gate-", gateCount.Add(1))
	ch := make(chan struct{})
	gates.Store(name, ch)
	open = sync.OnceFunc(func() { close(ch) })
	t.Cleanup(func() {
		open()
		gates.Delete(name)
	})
	return name, open
}

// inFlight is the number of requests the backends are serving.
func inFlight(backends ...*fakeVLLM) int64 {
	var n int64
	for _, b := range backends {
		for e := range b.running {
			n += b.running[e].Load()
		}
	}
	return n
}

// stopReasonHeader sets the reply's stop_reason (end_turn without it): a
// tool_use turn keeps its conversation resident for linger under load
// control, as an agent's tool call does.
const stopReasonHeader = "X-Test-Stop-Reason"

// conversationHeader names the conversation for sessionsSeen, for clients
// that send no X-Claude-Code-Session-Id; warden does not read it.
const conversationHeader = "X-Test-Conversation"

func startFakeVLLM(t *testing.T, name string, engines int) *fakeVLLM {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeVLLM{name: name, addr: ln.Addr().String(), engines: engines, running: make([]atomic.Int64, engines),
		tokens: make([]engineTokens, engines), lastPrompt: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/messages", f.messages)
	mux.HandleFunc("POST /v1/chat/completions", f.messages)
	mux.HandleFunc("POST /v1/responses", f.messages)
	mux.HandleFunc("POST /v1/messages/count_tokens", f.countTokens)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("GET /metrics", f.metrics)
	f.srv = &http.Server{Handler: mux}
	go func() { _ = f.srv.Serve(ln) }()
	t.Cleanup(func() { _ = f.srv.Close() })
	return f
}

func (f *fakeVLLM) messages(w http.ResponseWriter, r *http.Request) {
	rankHeader := r.Header.Get("X-data-parallel-rank")
	engine := 0
	if n, err := strconv.Atoi(rankHeader); err == nil {
		if n < 0 || n >= f.engines {
			http.Error(w, `{"error":"data_parallel_rank out of range"}`, http.StatusBadRequest)
			return
		}
		engine = n
	}
	body, _ := io.ReadAll(r.Body)
	session := r.Header.Get("X-Claude-Code-Session-Id")
	if conv := r.Header.Get(conversationHeader); conv != "" {
		session = conv // the test's own name for a conversation whatever the client sends
	}
	f.mu.Lock()
	var asked struct {
		MaxTokens int   `json:"max_tokens"`
		Stream    *bool `json:"stream"`
		Messages  []struct {
			Content any `json:"content"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(body, &asked)
	said := ""
	if len(asked.Messages) > 0 {
		said = fmt.Sprint(asked.Messages[0].Content)
	}
	f.seen = append(f.seen, seenRequest{session: session, rank: rankHeader, apiKey: r.Header.Get("X-Api-Key"),
		oneToken: asked.MaxTokens == 1 && asked.Stream != nil && !*asked.Stream, said: said})
	held := fmt.Sprintf("%d/%s", engine, session)
	cached := min(len(body), f.lastPrompt[held])
	f.tokens[engine].prompt += len(body)
	f.tokens[engine].cached += cached
	f.tokens[engine].generated++
	f.tokens[engine].ttft += float64(len(body)-cached) / fakePrefillRate
	f.lastPrompt[held] = len(body)
	f.mu.Unlock()
	f.running[engine].Add(1)
	defer f.running[engine].Add(-1)

	hold, _ := time.ParseDuration(r.Header.Get(holdHeader))
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Backend", fmt.Sprintf("%s/%d", f.name, engine))
	flusher := w.(http.Flusher)
	fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\"}\n\n")
	flusher.Flush()
	if !waitGate(r, gateHeader) {
		return
	}
	select {
	case <-time.After(hold):
	case <-r.Context().Done():
		return
	}
	fmt.Fprint(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"ok\"}}\n\n")
	stop := cmp.Or(r.Header.Get(stopReasonHeader), "end_turn")
	fmt.Fprintf(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":%q},"+
		"\"usage\":{\"input_tokens\":%d,\"cache_read_input_tokens\":%d,\"output_tokens\":1}}\n\n", stop, len(body)-cached, cached)
	fmt.Fprint(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	if r.Header.Get(lingerGateHeader) != "" {
		flusher.Flush()
		waitGate(r, lingerGateHeader)
	}
}

// waitGate waits until the gate the request's header names opens, and
// reports false if its client left first. A gate not named, or unknown, is
// open.
func waitGate(r *http.Request, header string) bool {
	gate, ok := gates.Load(r.Header.Get(header))
	if !ok {
		return true
	}
	select {
	case <-gate.(chan struct{}):
		return true
	case <-r.Context().Done():
		return false
	}
}

// countTokens answers Anthropic's count_tokens, one token per body byte, as vLLM answers
// it: no engine runs, no in-flight count or token counter moves.
func (f *fakeVLLM) countTokens(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Backend", f.name+"/api")
	fmt.Fprintf(w, `{"input_tokens":%d,"context_management":{"original_input_tokens":%d}}`, len(body), len(body))
}

func (f *fakeVLLM) metrics(w http.ResponseWriter, _ *http.Request) {
	f.scrapes.Add(1)
	var b strings.Builder
	b.WriteString("# TYPE vllm:num_requests_running gauge\n")
	for e := range f.engines {
		fmt.Fprintf(&b, "vllm:num_requests_running{engine=\"%d\",model_name=\"m\"} %d\n", e, f.running[e].Load())
	}
	b.WriteString("# TYPE vllm:num_requests_waiting gauge\n")
	for e := range f.engines {
		fmt.Fprintf(&b, "vllm:num_requests_waiting{engine=\"%d\",model_name=\"m\"} 0\n", e)
	}
	b.WriteString("# TYPE vllm:kv_cache_usage_perc gauge\n")
	for e := range f.engines {
		fmt.Fprintf(&b, "vllm:kv_cache_usage_perc{engine=\"%d\",model_name=\"m\"} 0.1\n", e)
	}
	b.WriteString("# TYPE vllm:cache_config_info gauge\n")
	for e := range f.engines {
		fmt.Fprintf(&b, "vllm:cache_config_info{block_size=\"%d\",engine=\"%d\",model_name=\"m\",num_gpu_blocks=\"%d\"} 1\n", fakeBlockSize, e, fakeKVBlocks)
	}
	f.mu.Lock()
	tokens := slices.Clone(f.tokens)
	f.mu.Unlock()
	for _, c := range []struct {
		name  string
		value func(engineTokens) int
	}{
		{"vllm:prompt_tokens_total", func(t engineTokens) int { return t.prompt }},
		{"vllm:prompt_tokens_cached_total", func(t engineTokens) int { return t.cached }},
		{"vllm:prefix_cache_queries_total", func(t engineTokens) int { return t.prompt }},
		{"vllm:prefix_cache_hits_total", func(t engineTokens) int { return t.cached }},
		{"vllm:generation_tokens_total", func(t engineTokens) int { return t.generated }},
	} {
		name := c.name
		if f.noPrefix && (strings.Contains(name, "prefix_cache") || strings.Contains(name, "cached")) {
			continue
		}
		if f.noTotal {
			name = strings.TrimSuffix(name, "_total")
		}
		fmt.Fprintf(&b, "# TYPE %s counter\n", name)
		for e, t := range tokens {
			fmt.Fprintf(&b, "%s{engine=\"%d\",model_name=\"m\"} %d\n", name, e, c.value(t))
		}
	}
	b.WriteString("# TYPE vllm:time_to_first_token_seconds histogram\n")
	for e, t := range tokens {
		fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_bucket{engine=\"%d\",model_name=\"m\",le=\"+Inf\"} %d\n", e, t.generated)
		fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_sum{engine=\"%d\",model_name=\"m\"} %g\n", e, t.ttft)
		fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_count{engine=\"%d\",model_name=\"m\"} %d\n", e, t.generated)
	}
	fmt.Fprint(w, b.String())
}

// sessionsSeen maps each conversation to the engines ("name/rank") it reached.
func sessionsSeen(backends ...*fakeVLLM) map[string]map[string]int {
	out := map[string]map[string]int{}
	for _, f := range backends {
		f.mu.Lock()
		for _, s := range f.seen {
			if out[s.session] == nil {
				out[s.session] = map[string]int{}
			}
			out[s.session][f.name+"/"+s.rank]++
		}
		f.mu.Unlock()
	}
	return out
}
