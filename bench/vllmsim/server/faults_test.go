package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/testnet"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func postFaults(t *testing.T, url, body string) (int, Faults) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var f Faults
	json.NewDecoder(resp.Body).Decode(&f)
	return resp.StatusCode, f
}

func TestMetricsFaults(t *testing.T) {
	s := startServer(t, nil)
	post(t, s, "/v1/messages", anthropicBody("s", 2, user("hi")))

	s.SetFaults(Faults{Metrics: MetricsNaN})
	if v := scrape(t, s)[`vllm:prompt_tokens_total{engine="0"}`]; !math.IsNaN(v) {
		t.Errorf("nan: prompt tokens %v", v)
	}
	s.SetFaults(Faults{Metrics: MetricsNegative})
	if v := scrape(t, s)[`vllm:num_requests_running{engine="0"}`]; v >= 0 {
		t.Errorf("negative: running %v", v)
	}
	s.SetFaults(Faults{Metrics: MetricsGarbage})
	if _, body := get(t, s.url("/metrics")); strings.Contains(body, "# TYPE") {
		t.Errorf("garbage: got a Prometheus exposition")
	}
	s.SetFaults(Faults{Metrics: MetricsMissing})
	if status, body := get(t, s.url("/metrics")); status != 200 || strings.Contains(body, "vllm:") {
		t.Errorf("missing: status %d, vllm series present", status)
	}
	s.SetFaults(Faults{Metrics: MetricsHuge})
	if _, body := get(t, s.url("/metrics")); len(body) < hugeMetricsBytes || !strings.Contains(body, "vllm:prompt_tokens_total") {
		t.Errorf("huge: %d bytes", len(body))
	}
	s.SetFaults(Faults{Metrics: MetricsSlow, MetricsDelay: Duration(150 * time.Millisecond)})
	start := time.Now()
	if status, _ := get(t, s.url("/metrics")); status != 200 || time.Since(start) < 150*time.Millisecond {
		t.Errorf("slow: status %d after %v", status, time.Since(start))
	}
	s.SetFaults(Faults{})
	if v := scrape(t, s)[`vllm:prompt_tokens_total{engine="0"}`]; v <= 0 {
		t.Errorf("cleared: prompt tokens %v", v)
	}
}

func TestFaultsEndpointMergesAndClears(t *testing.T) {
	s := startServer(t, nil)
	if status, f := postFaults(t, s.url("/sim/faults"), `{"health_status":503}`); status != 200 || f.HealthStatus != 503 {
		t.Fatalf("status %d faults %+v", status, f)
	}
	if status, _ := get(t, s.url("/health")); status != 503 {
		t.Fatalf("health %d, want 503", status)
	}
	if _, f := postFaults(t, s.url("/sim/faults"), `{"metrics":"nan"}`); f.HealthStatus != 503 || f.Metrics != MetricsNaN {
		t.Fatalf("POST must merge: %+v", f)
	}
	for _, bad := range []string{`{"metrics":"weird"}`, `{"health_status":42}`, `{"refuse":true}`, `{"metrics_delay":5}`} {
		if status, _ := postFaults(t, s.url("/sim/faults"), bad); status != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", bad, status)
		}
	}
	req, _ := http.NewRequest(http.MethodDelete, s.url("/sim/faults"), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("DELETE: status %d", resp.StatusCode)
	}
	// The answer comes after the switches changed: the very next request sees them.
	if status, _ := get(t, s.url("/health")); status != 200 || s.Faults() != (Faults{}) {
		t.Fatalf("after DELETE: health %d, faults %+v", status, s.Faults())
	}
}

func TestDieMidStreamBreaksTheStream(t *testing.T) {
	s := startServer(t, func(c *Config) { c.Faults.DieMidStream = true })
	r := post(t, s, "/v1/messages", anthropicBody("s", 10, user("hi")))
	if r.err == nil && len(r.events) > 0 && r.events[len(r.events)-1] == "message_stop" {
		t.Fatal("the stream finished although it should die")
	}
	if len(r.text) != 5*4 {
		t.Fatalf("got %q before the stream died, want 5 of 10 tokens", r.text)
	}
	s.SetFaults(Faults{})
	if r := post(t, s, "/v1/messages", anthropicBody("s", 10, user("hi"))); r.stop != "max_tokens" {
		t.Fatal("after clearing the fault the stream still breaks")
	}
}

func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// waitRefused waits until connections to addr are refused. Closing a Go
// listener releases its socket once the goroutine blocked in Accept has let
// go of it, so a dial right after the close may still be accepted.
func waitRefused(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if isRefused(err) {
			return
		}
		if c != nil {
			c.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("dial while refusing: %v, want connection refused", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRefuseClosesThePortUntilCleared(t *testing.T) {
	s := startServer(t, func(c *Config) { c.ControlPort = testnet.Port(t) })
	control := "http://" + s.ControlAddr() + "/sim/faults"
	if status, _ := postFaults(t, control, `{"refuse":true}`); status != 200 {
		t.Fatalf("refuse via the control port: status %d", status)
	}
	waitRefused(t, s.Addr())
	postFaults(t, control, `{"refuse":false}`)
	testnet.WaitListening(t, s.Addr(), 5*time.Second)
	if status, _ := get(t, s.url("/health")); status != 200 {
		t.Fatalf("health after the refusal: %d", status)
	}

	// Through the main port itself, with a timer to end it.
	if status, f := postFaults(t, s.url("/sim/faults"), `{"refuse":true,"refuse_for":"300ms"}`); status != 200 || !f.Refuse {
		t.Fatalf("refuse_for via the main port: status %d, %+v", status, f)
	}
	waitRefused(t, s.Addr())
	testnet.WaitListening(t, s.Addr(), 5*time.Second)
	if s.Faults().Refuse {
		t.Fatal("the refusal ended but is still reported")
	}
}

func TestRefusalDropsOpenStreams(t *testing.T) {
	s := startServer(t, nil)
	resp, err := http.Post(s.url("/v1/messages"), "application/json", bytes.NewReader([]byte(`{"max_tokens":3000,"stream":true,"messages":[{"role":"user","content":"x"}]}`)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := s.SetFaults(Faults{Refuse: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatal("the stream ended cleanly although the server refused")
	}
	s.SetFaults(Faults{})
	testnet.WaitListening(t, s.Addr(), 5*time.Second)
}
