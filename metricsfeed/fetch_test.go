package metricsfeed

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeVLLM serves /metrics and /health on loopback with adjustable behaviour.
type fakeVLLM struct {
	srv          *httptest.Server
	running      atomic.Int64
	healthStatus atomic.Int64
	metricsDelay atomic.Int64 // nanoseconds
	metricsHits  atomic.Int64
}

func newFakeVLLM(t *testing.T) *fakeVLLM {
	t.Helper()
	f := &fakeVLLM{}
	f.healthStatus.Store(http.StatusOK)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		f.metricsHits.Add(1)
		if d := time.Duration(f.metricsDelay.Load()); d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprintf(w, "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} %d\n", f.running.Load())
		fmt.Fprintf(w, "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0\n")
		fmt.Fprintf(w, "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5\n")
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(int(f.healthStatus.Load()))
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func TestFetchParsesAndAsksForTextFormat(t *testing.T) {
	var accept string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		accept = r.Header.Get("Accept")
		http.ServeFile(w, r, "testdata/vllm_two_engines.txt")
	}))
	defer srv.Close()
	s, err := Fetch(t.Context(), srv.Client(), srv.URL+"/metrics", DefaultMaxBytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Engines) != 2 || s.Engines[1].Running != 3 {
		t.Errorf("scrape %+v", s)
	}
	if !strings.HasPrefix(accept, "text/plain;version=0.0.4") {
		t.Errorf("Accept %q does not ask for the text format", accept)
	}
}

func TestFetchTimesOutOnSlowServer(t *testing.T) {
	f := newFakeVLLM(t)
	f.metricsDelay.Store(int64(10 * time.Second))
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Fetch(ctx, f.srv.Client(), f.srv.URL+"/metrics", DefaultMaxBytes)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a deadline error", err)
	}
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("Fetch took %v despite a 100ms deadline", elapsed)
	}
}

func TestFetchRefusesOversizeBody(t *testing.T) {
	line := "vllm:num_requests_running{engine=\"0\"} 1\n"
	const limit = 1000
	bodyOfSize := func(n int) string { return line + strings.Repeat("#", n-len(line)-1) + "\n" }
	for _, tc := range []struct {
		name    string
		size    int
		chunked bool // no Content-Length: the limit must hold while reading
		wantErr bool
	}{
		{"at limit", limit, false, false},
		{"over limit, announced", limit + 1, false, true},
		{"over limit, chunked", limit + 1, true, true},
		{"far over limit, chunked", 50 * limit, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := bodyOfSize(tc.size)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.chunked {
					w.(http.Flusher).Flush()
				} else {
					w.Header().Set("Content-Length", fmt.Sprint(len(body)))
				}
				_, _ = w.Write([]byte(body))
			}))
			defer srv.Close()
			_, err := Fetch(t.Context(), srv.Client(), srv.URL, limit)
			if tc.wantErr != errors.Is(err, ErrTooLarge) {
				t.Errorf("size %d: err = %v, want too large: %v", tc.size, err, tc.wantErr)
			}
			if !tc.wantErr && err != nil {
				t.Errorf("size %d: %v", tc.size, err)
			}
		})
	}
}

func TestFetchAndProbeReportStatus(t *testing.T) {
	f := newFakeVLLM(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "engine dead", http.StatusInternalServerError)
	}))
	defer srv.Close()

	var status *StatusError
	if _, err := Fetch(t.Context(), srv.Client(), srv.URL+"/metrics", DefaultMaxBytes); !errors.As(err, &status) || status.Code != 500 {
		t.Errorf("Fetch from a 500 server: %v", err)
	}
	if err := ProbeHealth(t.Context(), f.srv.Client(), HealthURL(f.srv.URL)); err != nil {
		t.Errorf("ProbeHealth on a 200: %v", err)
	}
	f.healthStatus.Store(http.StatusServiceUnavailable)
	if err := ProbeHealth(t.Context(), f.srv.Client(), HealthURL(f.srv.URL)); !errors.As(err, &status) || status.Code != 503 {
		t.Errorf("ProbeHealth on a 503: %v", err)
	}
}

func TestTargetURLs(t *testing.T) {
	for target, want := range map[string]string{
		"127.0.0.1:8001":         "http://127.0.0.1:8001/metrics",
		"http://127.0.0.1:8001/": "http://127.0.0.1:8001/metrics",
		"https://10.0.0.2:443":   "https://10.0.0.2:443/metrics",
	} {
		if got := MetricsURL(target); got != want {
			t.Errorf("MetricsURL(%q) = %q, want %q", target, got, want)
		}
	}
	if got := HealthURL("127.0.0.1:8001"); got != "http://127.0.0.1:8001/health" {
		t.Errorf("HealthURL = %q", got)
	}
}
