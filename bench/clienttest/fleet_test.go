package clienttest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/server"
	"github.com/lmwarden/caddy-warden/internal/caddyproc"
	"github.com/lmwarden/caddy-warden/internal/testnet"
	"github.com/lmwarden/caddy-warden/internal/testrun"
)

// model is the name every client asks for, the simulators serve and warden routes.
const model = "qwen3"

// replicas is three, not two: a client may open conversations of its own
// beside the user's (Qwen Code's memory extraction, one per conversation),
// which count as load; with two replicas the user's second conversation
// could then tie with the first one's replica and land there by load alone.
const replicas = 3

// caddyBin is Caddy with the plugin, built once for the package from the root module's
// cmd/caddy.
var caddyBin = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "clienttest-caddy-")
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := filepath.Join(dir, "caddy")
	return bin, caddyproc.Build(ctx, "./cmd/caddy", bin)
})

func TestMain(m *testing.M) {
	code := m.Run()
	if bin, err := caddyBin(); err == nil && bin != "" {
		os.RemoveAll(filepath.Dir(bin))
	}
	os.Exit(code)
}

// fleet is Caddy with `lb_policy warden` and the model's default keying in front of
// simulated vLLM replicas run in the test, each recording what it served.
type fleet struct {
	url   string // Caddy's site, http://host:port
	admin string // Caddy's admin API, host:port
	rec   *recorder
	log   *testrun.Buffer // Caddy's log, with an access log line per request
}

// fleetOptions change the fleet from its defaults.
type fleetOptions struct {
	// loadControl turns the model's load control on, with residencies that outlast the
	// test's pauses, and puts warden_stop_reason in the site.
	loadControl bool
}

// startFleet starts the replicas (named r0, r1...) and Caddy for the test's duration.
func startFleet(t *testing.T, opts fleetOptions) *fleet {
	t.Helper()
	bin, err := caddyBin()
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	var addrs []string
	for i := range replicas {
		cfg := server.DefaultConfig()
		cfg.ID = fmt.Sprintf("r%d", i)
		cfg.Model = model
		// Agents send long tool lists and ask for up to 32k output tokens: room for both.
		cfg.Profile = engine.Profiles[engine.DefaultProfile]
		cfg.Profile.MaxModelLen = 256 << 10
		cfg.Profile.NumGPUBlocks = 40_000
		// Short replies, fast: a turn takes well under a second of wall time.
		cfg.TimeScale = 20
		cfg.OutputLen, err = server.ParseOutputLen("uniform:8:24")
		if err != nil {
			t.Fatal(err)
		}
		cfg.OnRequest = rec.add
		sim, err := server.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := sim.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sim.Close() })
		addrs = append(addrs, sim.Addr())
	}
	ports := testnet.Addrs(t, 2)
	admin, site := ports[0], ports[1]
	loadControl, stopReason := "", ""
	// A conversation counts as load on its replica for the whole test. The window learnt
	// from the gaps between a conversation's requests (three of them) is shortened by a
	// client's title request sent a moment before its main one: a CLI slower to start
	// than that would find conversation A's replica idle, and the cheapest for B, whose
	// prompt begins as A's does.
	fields := map[string]any{"metrics_interval": "100ms", "active_window": "1h"}
	if opts.loadControl {
		loadControl, stopReason = "load_control on", "warden_stop_reason"
		fields["load_control.linger"] = "1m"
	}
	caddyfile := fmt.Sprintf(`{
	admin %[1]s
	default_bind 127.0.0.1
	warden {
		model %[2]s {
			replicas %[3]s
			max_num_seqs 32
			%[5]s
		}
	}
}
http://%[4]s {
	log {
		output stderr
		format json
	}
	%[6]s
	reverse_proxy %[3]s {
		lb_policy warden %[2]s
		flush_interval -1
	}
}
`, admin, model, strings.Join(addrs, " "), site, loadControl, stopReason)
	config, err := caddyproc.Adapt(bin, caddyfile, map[string]map[string]any{model: fields})
	if err != nil {
		t.Fatal(err)
	}
	return runFleet(t, bin, config, admin, site, rec)
}

// runFleet starts Caddy with config, which sets admin as its admin address and serves
// site, for the test's duration, and waits until it proxies to a healthy replica. Its log
// is printed if the test failed.
func runFleet(t *testing.T, bin, config, admin, site string, rec *recorder) *fleet {
	t.Helper()
	log := &testrun.Buffer{}
	proc, err := caddyproc.Start(bin, config, admin, log)
	if err != nil {
		t.Fatalf("starting Caddy: %v\n%s", err, log.String())
	}
	t.Cleanup(func() {
		_ = proc.Stop()
		if t.Failed() {
			t.Logf("Caddy's log:\n%s", log.String())
		}
	})
	f := &fleet{url: "http://" + site, admin: admin, rec: rec, log: log}
	f.waitReady(t)
	return f
}

// waitReady waits until Caddy proxies to a healthy replica.
func (f *fleet) waitReady(t *testing.T) {
	t.Helper()
	ctx := untilTimeout(t)
	for {
		resp, err := http.Get(f.url + "/health")
		last := fmt.Sprint(err)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = resp.Status
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Caddy did not proxy /health before go test's -timeout (last answer: %s)", last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// recorder keeps every request the replicas served, in order.
type recorder struct {
	mu   sync.Mutex
	reqs []server.Served
}

func (r *recorder) add(s server.Served) {
	r.mu.Lock()
	r.reqs = append(r.reqs, s)
	r.mu.Unlock()
}

// mark is the number of requests so far; since(mark) returns those that came after.
func (r *recorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reqs)
}

func (r *recorder) since(mark int) []server.Served {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]server.Served(nil), r.reqs[mark:]...)
}

// requestCounts counts the requests of Caddy's access log by method, URI and status, e.g.
// "GET /v1/models 200": 3, leaving out the test's own (GET /health).
func (f *fleet) requestCounts() map[string]int {
	counts := map[string]int{}
	for line := range strings.Lines(f.log.String()) {
		var entry struct {
			Msg     string `json:"msg"`
			Status  int    `json:"status"`
			Request struct {
				Method string `json:"method"`
				URI    string `json:"uri"`
			} `json:"request"`
		}
		if json.Unmarshal([]byte(line), &entry) != nil || entry.Msg != "handled request" || entry.Request.URI == "/health" {
			continue
		}
		counts[fmt.Sprintf("%s %s %d", entry.Request.Method, entry.Request.URI, entry.Status)]++
	}
	return counts
}
