package metricsfeed

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// exposition is how a fake replica writes its counters.
type exposition struct {
	name string
	// python: prometheus_client's text format: name_total, a name_created
	// gauge beside each counter, process_start_time_seconds. Otherwise
	// client_golang's: the counter's name as is, nothing else.
	python bool
	// atFirstUse: a counter's series is created by the first request that
	// counts in it (as simulators do), not when the server starts (as vLLM
	// does).
	atFirstUse bool
}

// countingReplica is a vLLM server's /metrics as the test drives it: it
// serves requests (counts tokens), restarts (counters start again) and
// answers scrapes over HTTP.
type countingReplica struct {
	style exposition

	mu       sync.Mutex
	clock    float64            // its own wall clock, Unix seconds
	started  float64            // process start
	counters map[string]float64 // by counter name; absent until created
	created  map[string]float64
}

var countingNames = []string{"vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens", "vllm:generation_tokens"}

func newCountingReplica(t *testing.T, style exposition) (*countingReplica, string) {
	r := &countingReplica{style: style, clock: 1.76e9}
	r.restart()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, r.metrics()) }))
	t.Cleanup(srv.Close)
	return r, srv.URL + "/metrics"
}

// restart is a new process: every counter gone, or back at 0 when series
// are created at start.
func (r *countingReplica) restart() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.clock += 60
	r.started = r.clock
	r.counters, r.created = map[string]float64{}, map[string]float64{}
	if !r.style.atFirstUse {
		for _, name := range countingNames {
			r.counters[name], r.created[name] = 0, r.clock
		}
	}
}

// serve counts one request: its prompt, the part found in the prefix
// cache, and ten generated tokens.
func (r *countingReplica) serve(prompt, cached float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.clock++
	for name, v := range map[string]float64{
		"vllm:prefix_cache_queries": prompt, "vllm:prefix_cache_hits": cached,
		"vllm:prompt_tokens": prompt, "vllm:generation_tokens": 10,
	} {
		if _, ok := r.counters[name]; !ok {
			r.created[name] = r.clock
		}
		r.counters[name] += v
	}
}

func (r *countingReplica) metrics() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	const labels = `{engine="0",model_name="m"}`
	var b strings.Builder
	fmt.Fprintf(&b, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running%s 0\n", labels)
	fmt.Fprintf(&b, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting%s 0\n", labels)
	fmt.Fprintf(&b, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc%s 0.5\n", labels)
	for _, name := range countingNames {
		v, ok := r.counters[name]
		switch {
		case !ok:
		case r.style.python:
			fmt.Fprintf(&b, "# TYPE %s_total counter\n%s_total%s %g\n", name, name, labels, v)
			fmt.Fprintf(&b, "# TYPE %s_created gauge\n%s_created%s %.3f\n", name, name, labels, r.created[name])
		default:
			fmt.Fprintf(&b, "# TYPE %s counter\n%s%s %g\n", name, name, labels, v)
		}
	}
	if r.style.python {
		fmt.Fprintf(&b, "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %.2f\n", r.started)
	}
	return b.String()
}

// The hit rate over a window in which a replica restarts is the one its
// own counters give, within a point, whichever way its exposition creates
// its series: a cold first request after the restart, counted in series
// that did not exist before it, must count. Before the restart the replica
// served either more tokens than it serves before the next scrape after it
// (its counters go back) or fewer (they do not: only a created or process
// start time can tell, or a scrape between the restart and its first
// request that shows the series gone).
func TestHitRateAcrossARestartMatchesTheReplica(t *testing.T) {
	styles := []exposition{
		{name: "client_golang, series at first use", atFirstUse: true},
		{name: "prometheus_client, series at start (vLLM)", python: true},
		{name: "prometheus_client, series at first use", python: true, atFirstUse: true},
	}
	for _, style := range styles {
		for _, longBefore := range []bool{true, false} {
			for _, scrapedBetween := range []bool{true, false} {
				if !style.python && !longBefore && !scrapedBetween {
					continue // nothing in the exposition says the counters started again
				}
				name := fmt.Sprintf("%s, long history %v, scraped between restart and first request %v", style.name, longBefore, scrapedBetween)
				t.Run(name, func(t *testing.T) { hitRateAcrossRestart(t, style, longBefore, scrapedBetween) })
			}
		}
	}
}

func hitRateAcrossRestart(t *testing.T, style exposition, longBefore, scrapedBetween bool) {
	replica, url := newCountingReplica(t, style)
	h := NewHistory(time.Hour, time.Second)
	at := t0
	scrape := func() {
		t.Helper()
		s, err := Fetch(t.Context(), nil, url, DefaultMaxBytes)
		if err != nil {
			t.Fatal(err)
		}
		at = at.Add(time.Second)
		h.Add(url, at, s)
	}
	var queries, hits float64
	serve := func(prompt, cached float64) {
		replica.serve(prompt, cached)
		queries, hits = queries+prompt, hits+cached
	}

	scrape() // warden starts before any traffic
	serve(8000, 0)
	scrape()
	if longBefore {
		serve(8400, 8000)
		serve(7000, 0)
		scrape()
	}
	replica.restart()
	if scrapedBetween {
		scrape()
	}
	// Both conversations come back to a cold cache; their later turns hit
	// it again.
	serve(8800, 0)
	serve(7400, 0)
	scrape()
	serve(9200, 8800)
	scrape()
	serve(7800, 7400)
	scrape()

	r, ok := h.Rates(at, time.Hour, WholeTarget(url))
	rate, known := r.HitRate()
	if !ok || !known {
		t.Fatalf("hit rate unknown: %+v", r)
	}
	if truth := hits / queries; math.Abs(rate-truth) > 0.01 {
		t.Errorf("hit rate %.3f over %v queries; the replica's counters say %.3f over %v", rate, r.PrefixQueries, truth, queries)
	}
}
