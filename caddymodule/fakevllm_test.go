package caddymodule_test

import (
	"fmt"
	"net"
	"net/http"
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
// which conversation reached which engine.
type fakeVLLM struct {
	name    string
	addr    string
	engines int
	srv     *http.Server

	running []atomic.Int64 // per engine

	mu   sync.Mutex
	seen []seenRequest
}

type seenRequest struct {
	session string
	rank    string // X-data-parallel-rank as received
}

// holdHeader asks the fake to keep the stream open that long.
const holdHeader = "X-Test-Hold"

func startFakeVLLM(t *testing.T, name string, engines int) *fakeVLLM {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeVLLM{name: name, addr: ln.Addr().String(), engines: engines, running: make([]atomic.Int64, engines)}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/messages", f.messages)
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
	f.mu.Lock()
	f.seen = append(f.seen, seenRequest{session: r.Header.Get("X-Claude-Code-Session-Id"), rank: rankHeader})
	f.mu.Unlock()
	f.running[engine].Add(1)
	defer f.running[engine].Add(-1)

	hold, _ := time.ParseDuration(r.Header.Get(holdHeader))
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Backend", fmt.Sprintf("%s/%d", f.name, engine))
	flusher := w.(http.Flusher)
	fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\"}\n\n")
	flusher.Flush()
	select {
	case <-time.After(hold):
	case <-r.Context().Done():
		return
	}
	fmt.Fprint(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"ok\"}}\n\n")
	fmt.Fprint(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
}

func (f *fakeVLLM) metrics(w http.ResponseWriter, _ *http.Request) {
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
