package caddymodule_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/caddyproc"
	"github.com/lmwarden/caddy-warden/internal/testnet"
	"github.com/lmwarden/caddy-warden/internal/testrun"
	"github.com/lmwarden/caddy-warden/panel"
)

// caddyBin is Caddy built from cmd/caddy once for all tests of the package.
var caddyBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "warden-it-")
	if err != nil {
		panic(err)
	}
	caddyBin = filepath.Join(dir, "caddy")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	err = caddyproc.Build(ctx, "./cmd/caddy", caddyBin)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// fleet is a running Caddy in front of fake vLLM servers.
type fleet struct {
	caddy    *caddyproc.Process
	site     string
	backends []*fakeVLLM
}

// startFleet runs Caddy with the model block (its replicas written as
// {replicas} / {server}) in front of the given backends.
func startFleet(t *testing.T, modelBlock string, backends ...*fakeVLLM) *fleet {
	t.Helper()
	return startFleetIn(t, "", modelBlock, backends...)
}

// slowScrapes gives scrapes 900 ms before they time out, for tests that
// place conversations by load or health: a scrape that fails makes its
// replica's load unknown, scored as full (or the replica unhealthy), and
// on a loaded machine 90 ms is not always enough.
var slowScrapes = map[string]any{"metrics_interval": "1s"}

// startFleetWith is startFleet with a whole setup.
func startFleetWith(t *testing.T, setup caddySetup, backends ...*fakeVLLM) *fleet {
	t.Helper()
	f, _ := runCaddy(t, setup, addresses(backends)...)
	f.backends = backends
	return f
}

// startFleetIn is startFleet with Caddy's data directory under dataDir,
// kept for the next Caddy ("" is a temporary one).
func startFleetIn(t *testing.T, dataDir, modelBlock string, backends ...*fakeVLLM) *fleet {
	t.Helper()
	return startFleetWith(t, caddySetup{modelBlock: modelBlock, dataDir: dataDir}, backends...)
}

// caddySetup is the Caddyfile around model m: modelBlock goes inside the
// model (with {replicas} / {server} for the backends' addresses),
// proxyOptions inside reverse_proxy, globalOptions in the global block.
type caddySetup struct {
	modelBlock    string
	proxyOptions  string
	globalOptions string
	// siteDirectives go in the site block beside reverse_proxy.
	siteDirectives string
	// dynamic has reverse_proxy take its upstreams from `dynamic warden m`
	// instead of listing them.
	dynamic bool
	// dataDir is Caddy's data directory, kept for the next Caddy; "" is a
	// temporary one.
	dataDir string
	// fields are model m's JSON fields a Caddyfile does not offer
	// (caddyproc.Adapt), over metrics_interval 100ms.
	fields map[string]any
}

// runCaddy starts Caddy in front of the servers at addrs, waits until every
// replica is healthy, and stops it when the test ends; its log is printed
// if the test failed.
func runCaddy(t *testing.T, setup caddySetup, addrs ...string) (*fleet, *testrun.Buffer) {
	t.Helper()
	// The ports are found free, then given to Caddy: another process can
	// take one in between, and Caddy then exits at start; it is started
	// again on other ports.
	for try := 1; ; try++ {
		f, log, err := startCaddyOn(t, setup, testnet.Addrs(t, 2), addrs)
		if err == nil {
			return f, log
		}
		if try == 3 || !strings.Contains(log.String(), "address already in use") {
			t.Fatalf("%v\n%s", err, log.String())
		}
	}
}

// startCaddyOn runs runCaddy's Caddy with its admin API and site on ports.
func startCaddyOn(t *testing.T, setup caddySetup, ports, addrs []string) (*fleet, *testrun.Buffer, error) {
	t.Helper()
	admin, site := ports[0], ports[1]
	block := strings.NewReplacer("{replicas}", strings.Join(addrs, " "), "{server}", addrs[0]).Replace(setup.modelBlock)
	upstreams := strings.Join(addrs, " ")
	if setup.dynamic {
		upstreams = ""
		setup.proxyOptions = "dynamic warden m\n\t\t" + setup.proxyOptions
	}
	caddyfile := fmt.Sprintf(`{
	admin %s
	default_bind 127.0.0.1
	%s
	warden {
		model m {
			%s
		}
	}
}
http://%s {
	%s
	reverse_proxy %s {
		lb_policy warden m
		flush_interval -1
		%s
	}
}
`, admin, setup.globalOptions, block, site, setup.siteDirectives, upstreams, setup.proxyOptions)
	fields := map[string]any{"metrics_interval": "100ms"}
	maps.Copy(fields, setup.fields)
	config, err := caddyproc.Adapt(caddyBin, caddyfile, map[string]map[string]any{"m": fields})
	if err != nil {
		t.Fatal(err)
	}
	log := &testrun.Buffer{}
	p, err := caddyproc.StartIn(setup.dataDir, caddyBin, config, admin, log)
	if err != nil {
		return nil, log, err
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("caddy log:\n%s", log.String())
		}
	})
	f := &fleet{caddy: p, site: site}
	f.waitHealthy(t)
	return f, log, nil
}

func addresses(backends []*fakeVLLM) []string {
	out := make([]string, len(backends))
	for i, b := range backends {
		out[i] = b.addr
	}
	return out
}

// pinAll sends the first turns of convs together, held open until all are
// placed, so that they are placed side by side, and returns the engine
// each went to.
func pinAll(t *testing.T, f *fleet, convs []string) map[string]string {
	t.Helper()
	home := map[string]string{}
	var mu sync.Mutex
	heldTogether(t, f, len(convs), func(i int, hold ...string) {
		served := f.turn(t, convs[i], hold...)
		mu.Lock()
		home[convs[i]] = served
		mu.Unlock()
	})
	return home
}

// heldTogether runs n requests at once, each sent by send with the header
// that holds it open: all are held at their replica until warden has
// routed every one of them.
func heldTogether(t *testing.T, f *fleet, n int, send func(i int, hold ...string)) {
	t.Helper()
	gate, open := newGate(t)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { send(i, gateHeader, gate) })
	}
	testrun.Eventually(t, 10*time.Second, fmt.Sprintf("%d requests in flight", n), func() bool { return f.status(t).InFlight == int64(n) })
	open()
	wg.Wait()
}

func (f *fleet) status(t *testing.T) panel.ModelStatus {
	t.Helper()
	var st panel.ModelStatus
	if err := f.caddy.Do(http.MethodGet, "/warden/models/m", nil, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func (f *fleet) waitHealthy(t *testing.T) {
	t.Helper()
	testrun.Eventually(t, 10*time.Second, "every replica healthy", func() bool {
		for _, r := range f.status(t).Replicas {
			if !r.Healthy || !r.MetricsKnown {
				return false
			}
		}
		return true
	})
}

// turn sends one streaming request of a conversation and reads it to the
// end; it returns the engine that served it ("name/rank").
func (f *fleet) turn(t *testing.T, session string, header ...string) string {
	t.Helper()
	resp, err := f.send(context.Background(), session, header...)
	if err != nil {
		t.Error(err)
		return ""
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Error(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Errorf("session %s: status %s", session, resp.Status)
	}
	return resp.Header.Get("X-Backend")
}

func (f *fleet) send(ctx context.Context, session string, header ...string) (*http.Response, error) {
	return f.sendSaying(ctx, session, "hi", header...)
}

// sendSaying is send with content as the user's message.
func (f *fleet) sendSaying(ctx context.Context, session, content string, header ...string) (*http.Response, error) {
	body := fmt.Sprintf(`{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":%q}]}`, content)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.site+"/v1/messages?beta=true", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	if session != "" {
		req.Header.Set("X-Claude-Code-Session-Id", session)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return siteClient.Do(req)
}

// siteClient opens a connection per request: a config change reloads Caddy,
// which closes idle keep-alive connections, and a POST that races that
// close fails with EOF (Go does not retry a POST), as any client's would.
// A new connection can still be reset: the replaced config's listener may
// accept it just before it closes. siteClient then sends the request again,
// as Anthropic's and OpenAI's SDKs do.
var siteClient = &http.Client{Transport: resending{&http.Transport{DisableKeepAlives: true}}}

// resending sends a request again, up to twice, when its connection broke
// before any response.
type resending struct{ http.RoundTripper }

func (rt resending) RoundTrip(req *http.Request) (*http.Response, error) {
	for try := 0; ; try++ {
		resp, err := rt.RoundTripper.RoundTrip(req)
		if err == nil || try == 2 || req.Context().Err() != nil || !caddyproc.ConnectionBroke(err) {
			return resp, err
		}
		if req.GetBody != nil {
			body, berr := req.GetBody()
			if berr != nil {
				return nil, err
			}
			req = req.Clone(req.Context())
			req.Body = body
		}
	}
}

func TestReplicasMode(t *testing.T) {
	backends := []*fakeVLLM{startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1), startFakeVLLM(t, "c", 1)}
	// Auto threshold 32: 40 concurrent conversations on 3 replicas do not spill.
	f := startFleetWith(t, caddySetup{modelBlock: "replicas {replicas}\n\t\t\tmax_num_seqs 128", fields: slowScrapes}, backends...)
	convs := testrun.Sessions("conv", 40)
	var home map[string]string

	t.Run("conversations stay and new ones spread evenly", func(t *testing.T) {
		home = pinAll(t, f, convs)
		for range 4 {
			testrun.Concurrently(len(convs), func(i int) {
				if served := f.turn(t, convs[i]); served != home[convs[i]] {
					t.Errorf("%s served by %s, pinned to %s", convs[i], served, home[convs[i]])
				}
			})
		}
		perBackend := map[string]int{}
		for session, engines := range sessionsSeen(backends...) {
			if len(engines) != 1 {
				t.Errorf("%s reached %d engines: %v", session, len(engines), engines)
			}
			for e := range engines {
				perBackend[e]++
			}
		}
		lo, hi := len(convs), 0
		for _, b := range backends {
			n := perBackend[b.name+"/"]
			lo, hi = min(lo, n), max(hi, n)
		}
		if hi-lo > 1 {
			t.Errorf("conversations per backend %v: max-min = %d", perBackend, hi-lo)
		}
		if st := f.status(t); st.StickyPercent != 100 || st.Sessions != 40 {
			t.Errorf("sticky %.1f%%, sessions %d", st.StickyPercent, st.Sessions)
		}
	})

	t.Run("a busy replica spills above the threshold", func(t *testing.T) {
		if err := f.caddy.Do(http.MethodPost, "/warden/models/m/spill_threshold", map[string]int{"value": 2}, nil); err != nil {
			t.Fatal(err)
		}
		before := spilled(f.status(t))
		pin := f.turn(t, "spill")
		heldTogether(t, f, 6, func(_ int, hold ...string) { f.turn(t, "spill", hold...) })
		engines := sessionsSeen(backends...)["spill"]
		if len(engines) < 2 {
			t.Errorf("6 concurrent requests over threshold 2 stayed on %v", engines)
		}
		if got := spilled(f.status(t)) - before; got < 1 {
			t.Errorf("admin JSON counted %d spills", got)
		}
		// A spill moves the conversation: it stays where it went.
		after := f.turn(t, "spill")
		if again := f.turn(t, "spill"); again != after {
			t.Errorf("after the burst served by %s, then %s (first pinned to %s)", after, again, pin)
		}
		var st panel.ModelStatus
		if err := f.caddy.Do(http.MethodPost, "/warden/models/m/spill_threshold", map[string]bool{"auto": true}, &st); err != nil {
			t.Fatal(err)
		}
		if st.SpillThreshold != 0 || !st.SpillThresholdAuto {
			t.Errorf("back to auto: threshold %d auto=%v, want 0 auto", st.SpillThreshold, st.SpillThresholdAuto)
		}
	})

	t.Run("affinity off spreads by load, on again keeps the pins", func(t *testing.T) {
		if err := f.caddy.Do(http.MethodPost, "/warden/models/m/affinity", map[string]bool{"enabled": false}, nil); err != nil {
			t.Fatal(err)
		}
		servedBy := map[string]int{}
		var mu sync.Mutex
		heldTogether(t, f, 6, func(_ int, hold ...string) {
			served := f.turn(t, convs[0], hold...)
			mu.Lock()
			servedBy[served]++
			mu.Unlock()
		})
		if len(servedBy) != len(backends) {
			t.Errorf("affinity off: 6 concurrent requests went to %v, want all 3 backends", servedBy)
		}
		if err := f.caddy.Do(http.MethodPost, "/warden/models/m/affinity", map[string]bool{"enabled": true}, nil); err != nil {
			t.Fatal(err)
		}
		for _, c := range convs {
			if served := f.turn(t, c); served != home[c] {
				t.Errorf("affinity back on: %s served by %s, pinned to %s", c, served, home[c])
			}
		}
	})

	t.Run("a config reload keeps pins and counters", func(t *testing.T) {
		before := f.status(t)
		if err := f.caddy.Reload(); err != nil {
			t.Fatal(err)
		}
		after := f.status(t)
		if after.Requests != before.Requests || after.Sessions != before.Sessions || !after.Since.Equal(before.Since) {
			t.Errorf("reload reset counters: requests %d -> %d, sessions %d -> %d, since %v -> %v",
				before.Requests, after.Requests, before.Sessions, after.Sessions, before.Since, after.Since)
		}
		f.waitHealthy(t)
		for _, c := range convs {
			if served := f.turn(t, c); served != home[c] {
				t.Errorf("after reload %s served by %s, pinned to %s", c, served, home[c])
			}
		}
	})

	t.Run("in-flight counts return to zero after aborts", func(t *testing.T) {
		testrun.Concurrently(12, func(i int) {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			resp, err := f.send(ctx, convs[i], holdHeader, "5s")
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body) // cut by the timeout
				resp.Body.Close()
			}
		})
		testrun.Eventually(t, 10*time.Second, "in flight back to 0", func() bool {
			st := f.status(t)
			for _, r := range st.Replicas {
				if r.InFlight != 0 {
					return false
				}
			}
			return st.InFlight == 0
		})
	})
}

func spilled(st panel.ModelStatus) (n uint64) {
	for _, r := range st.Replicas {
		n += r.SpilledIn
	}
	return n
}

func TestRanksMode(t *testing.T) {
	server := startFakeVLLM(t, "dp", 4)
	f := startFleetWith(t, caddySetup{modelBlock: "server {server} ranks 4", fields: slowScrapes}, server)
	convs := testrun.Sessions("rank", 12)
	for turn := range 3 {
		// A forged rank must be replaced by warden's own choice. The turns
		// are held until all are routed, so that the first ones are placed
		// side by side, as in the replicas test.
		heldTogether(t, f, len(convs), func(i int, hold ...string) {
			f.turn(t, convs[i], append([]string{"X-data-parallel-rank", fmt.Sprint((i + turn) % 4)}, hold...)...)
		})
	}
	perRank := map[string]int{}
	for session, engines := range sessionsSeen(server) {
		if len(engines) != 1 {
			t.Errorf("%s reached ranks %v: not stable, or a forged rank got through", session, engines)
		}
		for e := range engines {
			perRank[e]++
		}
	}
	if len(perRank) != 4 {
		t.Errorf("12 conversations over 4 ranks used %v", perRank)
	}
	for rank, n := range perRank {
		if n != 3 {
			t.Errorf("rank %s holds %d conversations, want 3 each: %v", rank, n, perRank)
		}
	}
}
