package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/testnet"
)

// TestHostTierCommand runs the README's host tier command as a process (on a free port rather
// than 8001), serves one request, and checks that /metrics shows the tier vLLM's way.
func TestHostTierCommand(t *testing.T) {
	port := testnet.Port(t)
	server := exec.Command(os.Args[0], "-test.run=^$")
	server.Env = append(os.Environ(), fmt.Sprintf("%s=--port %d --kv-offloading-size 22", serveArgsEnv, port))
	var logs strings.Builder
	server.Stderr = &logs
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	stop := func() {
		if server.ProcessState == nil {
			server.Process.Signal(syscall.SIGTERM)
			server.Wait()
		}
	}
	defer stop()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	testnet.WaitListening(t, strings.TrimPrefix(base, "http://"), 10*time.Second)

	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"model": "Qwen/Qwen3-4B-Instruct-2507", "max_tokens": 2, "messages": [{"role": "user", "content": "`+strings.Repeat("word ", 200)+`"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	metrics := string(body)
	for _, want := range []string{
		`kv_offloading_backend="native"`, `kv_offloading_size="22.0"`,
		`vllm:kv_offload_total_bytes_total{engine="0",model_name="Qwen/Qwen3-4B-Instruct-2507",transfer_type="GPU_to_CPU"}`,
		`vllm:kv_offload_load_bytes_total{engine="0",model_name="Qwen/Qwen3-4B-Instruct-2507"} 0`,
		`vllm:external_prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-4B-Instruct-2507"}`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	stop() // the log is complete once the process has ended
	if !strings.Contains(logs.String(), "host KV tier of 22 GiB per engine (10012 blocks)") {
		t.Errorf("the log does not announce the tier:\n%s", logs.String())
	}
}
