package caddymodule_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/testrun"
	"github.com/lmwarden/caddy-warden/sessionkey"
)

// Hostile input through the real Caddy: oversized and malformed session
// headers and bodies, floods of session IDs, forged replica choices, a
// /metrics of 50 MB, and where raw session IDs may leak.

// recordingBackend stands in front of a fake vLLM: it forwards everything to
// it, keeps every /v1/messages request as it arrived (headers and exact
// body), and can serve a huge /metrics instead of the fake's.
type recordingBackend struct {
	name string
	addr string
	ln   net.Listener
	srv  *http.Server
	fake *fakeVLLM // the server behind it

	hugeMetrics atomic.Bool
	hugeServed  atomic.Int64 // huge /metrics begun

	mu       sync.Mutex
	received []receivedRequest
}

type receivedRequest struct {
	header http.Header
	body   []byte
}

// hugeMetricsBytes is the size of a huge /metrics: far past warden's limit.
const hugeMetricsBytes = 50 << 20

func startRecordingBackend(t *testing.T, name string) *recordingBackend {
	t.Helper()
	fake := startFakeVLLM(t, name, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &recordingBackend{name: name, addr: ln.Addr().String(), ln: ln, fake: fake}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: fake.addr})
	proxy.FlushInterval = -1
	b.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/metrics" && b.hugeMetrics.Load():
			b.hugeServed.Add(1)
			serveHugeMetrics(w)
			return
		case r.URL.Path == "/v1/messages":
			body, _ := io.ReadAll(r.Body)
			b.mu.Lock()
			b.received = append(b.received, receivedRequest{header: r.Header.Clone(), body: body})
			b.mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		proxy.ServeHTTP(w, r)
	})}
	go func() { _ = b.srv.Serve(ln) }()
	t.Cleanup(func() { _ = b.srv.Close() })
	return b
}

// serveHugeMetrics writes valid vLLM gauges followed by filler series.
func serveHugeMetrics(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	fmt.Fprint(w, "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0\n")
	line := []byte("vllm_filler_series{series=\"padding-padding-padding\"} 1\n")
	for written := 0; written < hugeMetricsBytes; written += len(line) {
		if _, err := w.Write(line); err != nil {
			return // warden gave up: that is the point
		}
	}
}

// stopAccepting closes the listener: new connections are refused, those
// already open (warden's metrics poller) keep working.
func (b *recordingBackend) stopAccepting() { _ = b.ln.Close() }

func (b *recordingBackend) requests() []receivedRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]receivedRequest(nil), b.received...)
}

// startRecordedFleet is startFleet with recording backends and the setup's
// options, Caddy's log kept for inspection.
func startRecordedFleet(t *testing.T, setup caddySetup, backends ...*recordingBackend) (*fleet, *testrun.Buffer) {
	t.Helper()
	addrs := make([]string, len(backends))
	for i, b := range backends {
		addrs[i] = b.addr
	}
	setup.modelBlock = "replicas {replicas}\n\t\t\t" + setup.modelBlock
	return runCaddy(t, setup, addrs...)
}

// post sends a request with the given body and headers and reads the answer.
func (f *fleet) post(t *testing.T, body []byte, header ...string) (status int, backend string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+f.site+"/v1/messages?beta=true", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Backend")
}

// rawRequest writes a request on a new connection, byte for byte, and
// returns the status line's code.
func rawRequest(t *testing.T, addr, request string) int {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

const smallBody = `{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}`

func TestHostileSessionHeaders(t *testing.T) {
	a, b := startRecordingBackend(t, "a"), startRecordingBackend(t, "b")
	f, _ := startRecordedFleet(t, caddySetup{}, a, b)

	// Caddy reads about 16 KiB of request headers (max_header_size, plus
	// Go's 4 KiB of slack).
	for _, size := range []int{1 << 20, 64 << 10} {
		t.Run(fmt.Sprintf("a %d KiB session header is refused and Caddy keeps serving", size>>10), func(t *testing.T) {
			huge := strings.Repeat("s", size)
			code := rawRequest(t, f.site, "POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Claude-Code-Session-Id: "+huge+
				"\r\nContent-Length: "+fmt.Sprint(len(smallBody))+"\r\n\r\n"+smallBody)
			if code != http.StatusRequestHeaderFieldsTooLarge {
				t.Errorf("status %d, want 431", code)
			}
			if code, _ := f.post(t, []byte(smallBody), "X-Claude-Code-Session-Id", "after-huge"); code != http.StatusOK {
				t.Errorf("next request: status %d", code)
			}
		})
	}

	t.Run("an 8 KiB session header is a session like any other", func(t *testing.T) {
		assertPinned(t, f, strings.Repeat("L", 8<<10))
	})

	t.Run("non-UTF-8 bytes in the header", func(t *testing.T) {
		assertPinned(t, f, "\xff\xfe\x80 not utf-8 \xc3\x28")
	})

	t.Run("control characters are refused by the HTTP parser", func(t *testing.T) {
		code := rawRequest(t, f.site, "POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Claude-Code-Session-Id: a\x01b\r\nContent-Length: "+
			fmt.Sprint(len(smallBody))+"\r\n\r\n"+smallBody)
		if code != http.StatusBadRequest {
			t.Errorf("status %d, want 400", code)
		}
		if code, _ := f.post(t, []byte(smallBody), "X-Claude-Code-Session-Id", "after-ctl"); code != http.StatusOK {
			t.Errorf("next request: status %d", code)
		}
	})
}

// assertPinned sends three turns of a conversation and wants them all
// served, by one backend.
func assertPinned(t *testing.T, f *fleet, session string) {
	t.Helper()
	served := map[string]int{}
	for range 3 {
		code, backend := f.post(t, []byte(smallBody), "X-Claude-Code-Session-Id", session)
		if code != http.StatusOK {
			t.Fatalf("status %d", code)
		}
		served[backend]++
	}
	if len(served) != 1 {
		t.Errorf("three turns served by %v", served)
	}
}

// A flood of new session IDs keeps the table within max_sessions: the
// oldest conversations are evicted.
func TestSessionFloodStaysBounded(t *testing.T) {
	for _, maxSessions := range []int{128, 100} {
		t.Run(fmt.Sprintf("max_sessions %d", maxSessions), func(t *testing.T) {
			a, b := startRecordingBackend(t, "a"), startRecordingBackend(t, "b")
			f, _ := startRecordedFleet(t, caddySetup{fields: map[string]any{"max_sessions": maxSessions}}, a, b)
			const flood = 1000
			var next atomic.Int64
			testrun.Concurrently(8, func(int) {
				for i := next.Add(1); i <= flood; i = next.Add(1) {
					if code, _ := f.post(t, []byte(smallBody), "X-Claude-Code-Session-Id", fmt.Sprintf("flood-%d", i)); code != http.StatusOK {
						t.Errorf("flood request %d: status %d", i, code)
						return
					}
				}
			})
			st := f.status(t)
			if st.Sessions > int64(maxSessions) {
				t.Errorf("%d sessions in the table after %d new conversations, max_sessions %d", st.Sessions, flood, maxSessions)
			}
			if st.SessionsEvicted < uint64(flood-maxSessions) {
				t.Errorf("%d sessions evicted, want at least %d", st.SessionsEvicted, flood-maxSessions)
			}
			t.Logf("sessions %d, evicted %d", st.Sessions, st.SessionsEvicted)
		})
	}
}

// With client_pinning off (the default), a client cannot choose its
// replica: both headers are removed before the request leaves Caddy.
func TestForgedReplicaHeadersAreStripped(t *testing.T) {
	a, b := startRecordingBackend(t, "a"), startRecordingBackend(t, "b")
	f, _ := startRecordedFleet(t, caddySetup{}, a, b)
	_, home := f.post(t, []byte(smallBody), "X-Claude-Code-Session-Id", "forger")
	other := map[string]string{"a/0": b.addr, "b/0": a.addr}[home]
	for turn := range 4 {
		_, served := f.post(t, []byte(smallBody), "X-Claude-Code-Session-Id", "forger",
			"X-Warden-Replica", other, "X-data-parallel-rank", fmt.Sprint(turn))
		if served != home {
			t.Errorf("turn %d: served by %s, pinned to %s: the forged replica %s was honoured", turn, served, home, other)
		}
	}
	for _, backend := range []*recordingBackend{a, b} {
		for _, r := range backend.requests() {
			for _, h := range []string{"X-Warden-Replica", "X-data-parallel-rank"} {
				if v, ok := r.header[http.CanonicalHeaderKey(h)]; ok {
					t.Errorf("backend %s received %s: %q", backend.name, h, v)
				}
			}
		}
	}
}

// With session_from_body on, warden reads the start of the body; whatever
// it holds, the backend must receive the exact bytes.
func TestMalformedBodiesPassIntact(t *testing.T) {
	a, b := startRecordingBackend(t, "a"), startRecordingBackend(t, "b")
	// The fake counts a body's bytes as its tokens, four times what warden
	// estimates. When the last scrape before a 200 KB turn ended did not
	// count it yet, its 200,000 "tokens" show up after, as if written since
	// and enough to evict a 40,000-token cache: the conversation would be
	// rehomed (docs/research/policy.md#rehoming). Without the prefix-cache counters
	// warden never judges a conversation cold.
	a.fake.noPrefix, b.fake.noPrefix = true, true
	f, _ := startRecordedFleet(t, caddySetup{}, a, b)
	longSession := `{"metadata":{"user_id":"{\"session_id\":\"s-long\"}"},"messages":[{"role":"user","content":"` + strings.Repeat("x", 200<<10) + `"}]}`
	bodies := map[string][]byte{
		"truncated JSON":              []byte(`{"model":"m","metadata":{"user_id":"{\"session_id\":\"s-1`),
		"invalid UTF-8":               []byte("{\"user\":\"\xff\xfe\xfd\",\"messages\":[]}"),
		"deep nesting":                []byte(strings.Repeat("[", 100000) + strings.Repeat("]", 100000)),
		"not JSON":                    []byte("\x00\x01\x02 binary \xff"),
		"user_id of the wrong type":   []byte(`{"metadata":{"user_id":{"session_id":42}},"user":["x"]}`),
		"session past the scan limit": []byte(`{"messages":[{"role":"user","content":"` + strings.Repeat("y", 100<<10) + `"}],"user":"late"}`),
		"valid, 200 KB":               []byte(longSession),
		"empty":                       {},
	}
	for name, body := range bodies {
		t.Run(name, func(t *testing.T) {
			marker := "marker-" + strings.ReplaceAll(name, " ", "-")
			code, _ := f.post(t, body, "X-Test-Marker", marker)
			if code != http.StatusOK {
				t.Errorf("status %d", code)
			}
			got, ok := receivedWith(marker, a, b)
			if !ok {
				t.Fatal("no backend received the request")
			}
			if !bytes.Equal(got.body, body) {
				t.Errorf("backend received %d bytes, sent %d (differ at %d)", len(got.body), len(body), firstDifference(got.body, body))
			}
		})
	}
	t.Run("a session read from the body is pinned", func(t *testing.T) {
		served := map[string]int{}
		for range 3 {
			_, backend := f.post(t, []byte(longSession))
			served[backend]++
		}
		if len(served) != 1 {
			t.Errorf("three turns of s-long served by %v", served)
		}
	})
}

func receivedWith(marker string, backends ...*recordingBackend) (receivedRequest, bool) {
	for _, b := range backends {
		for _, r := range b.requests() {
			if r.header.Get("X-Test-Marker") == marker {
				return r, true
			}
		}
	}
	return receivedRequest{}, false
}

func firstDifference(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// A replica that refuses connections while its metrics still look fine
// (it just died, warden has not polled yet): Caddy retries the request on
// another replica. The retry must carry the same body whether the session
// came from a header or, with session_from_body, from the body itself,
// which warden has already read the start of, and with load control, which
// reads a new conversation's whole body for its prefix. Without Caddy's
// read_body_idle timeout, whose reader answers EOF where the closed body
// would fail, a body warden read whole must not be read again.
func TestBodySessionSurvivesRetryAfterDialError(t *testing.T) {
	for _, c := range []struct{ keyed, block, site string }{
		{"header", "", ""},
		{"body", "", ""},
		{"header", "load_control on", "warden_stop_reason"},
		{"body", "load_control on", "warden_stop_reason"},
	} {
		keyed := c.keyed
		t.Run("session in the "+keyed+", "+cmp.Or(c.block, "load_control off"), func(t *testing.T) {
			a, b := startRecordingBackend(t, "a"), startRecordingBackend(t, "b")
			f, _ := startRecordedFleet(t, caddySetup{
				modelBlock:     c.block,
				siteDirectives: c.site,
				proxyOptions:   "lb_retries 2\n\t\tfail_duration 30s",
				globalOptions:  "servers {\n\t\ttimeouts {\n\t\t\tread_body_idle -1s\n\t\t}\n\t}",
			}, a, b)
			b.stopAccepting()
			// A new conversation goes to the replica with fewer
			// conversations: within two, one is placed on b.
			for i := range 2 {
				session := fmt.Sprintf("dial-%s-%d", keyed, i)
				body := []byte(`{"metadata":{"user_id":"{\"session_id\":\"` + session + `\"}"},"max_tokens":8,"stream":true,"messages":[]}`)
				var header []string
				if keyed == "header" {
					header = []string{"X-Claude-Code-Session-Id", session}
				}
				code, backend := f.post(t, body, append(header, "X-Test-Marker", session)...)
				if code != http.StatusOK || backend != "a/0" {
					t.Errorf("%s: status %d from %q, want 200 from a", session, code, backend)
					continue
				}
				if got, _ := receivedWith(session, a); !bytes.Equal(got.body, body) {
					t.Errorf("%s: a received %q, sent %q", session, got.body, body)
				}
			}
			// Proof that the scenario happened: Caddy dialled b and failed
			// (load control's own moves count as re-placements too).
			var upstreams []struct {
				Address string `json:"address"`
				Fails   int    `json:"fails"`
			}
			if err := f.caddy.Do(http.MethodGet, "/reverse_proxy/upstreams", nil, &upstreams); err != nil {
				t.Fatal(err)
			}
			failed := false
			for _, u := range upstreams {
				failed = failed || u.Address == b.addr && u.Fails > 0
			}
			if !failed {
				t.Errorf("no dial to b failed (%+v): the test proves nothing", upstreams)
			}
		})
	}
}

// A replica whose /metrics grows to 50 MB is refused past warden's limit
// and treated as unhealthy: no new conversation goes there, Caddy serves on
// and its memory does not follow the body's size. (Scrapes get slowScrapes'
// time: while Caddy reads b's bodies, a's scrape can miss 90 ms on a loaded
// machine, and a would be unhealthy too.)
func TestHugeMetricsBody(t *testing.T) {
	a, b := startRecordingBackend(t, "a"), startRecordingBackend(t, "b")
	f, log := startRecordedFleet(t, caddySetup{fields: slowScrapes}, a, b)
	rssBefore := peakRSS(t, f.caddy.Pid())
	logBefore := len(log.String())
	b.hugeMetrics.Store(true)
	testrun.Eventually(t, 10*time.Second, "b unhealthy", func() bool {
		for _, r := range f.status(t).Replicas {
			if r.Address == b.addr {
				return !r.Healthy
			}
		}
		return false
	})
	served := b.hugeServed.Load()
	testrun.Eventually(t, 30*time.Second, "ten more scrapes of 50 MB", func() bool { return b.hugeServed.Load() >= served+10 })
	for i := range 10 {
		code, backend := f.post(t, []byte(smallBody), "X-Claude-Code-Session-Id", fmt.Sprintf("huge-%d", i))
		if code != http.StatusOK || backend != "a/0" {
			t.Errorf("new conversation %d: status %d from %q, want 200 from a", i, code, backend)
		}
	}
	// Refused at the size limit, or cut by the scrape timeout first when the
	// machine is slow (e.g. under the race detector): either way an error.
	for _, r := range f.status(t).Replicas {
		if r.Address == b.addr && !strings.Contains(r.Health, "too large") && !strings.Contains(r.Health, "deadline exceeded") {
			t.Errorf("b's health %q does not say its metrics are too large or too slow", r.Health)
		}
	}
	if n := strings.Count(log.String()[logBefore:], `"msg":"replica unhealthy"`); n != 1 {
		t.Errorf("%d unhealthy log lines since the metrics grew, want 1", n)
	}
	grown := peakRSS(t, f.caddy.Pid()) - rssBefore
	t.Logf("Caddy's peak RSS grew by %d MiB while b served 50 MB /metrics every second", grown>>20)
	if grown > 40<<20 {
		t.Errorf("Caddy's peak RSS grew by %d MiB", grown>>20)
	}
}

// peakRSS is a process's high-water resident set size, in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for line := range strings.Lines(string(status)) {
		var kb int64
		if _, err := fmt.Sscanf(line, "VmHWM: %d kB", &kb); err == nil {
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc status")
	return 0
}

// Raw session IDs appear in none of warden's outputs (admin JSON, /metrics,
// its log lines), nor in Caddy's own log once the recommended log filter
// hashes the headers warden reads IDs from (examples/Caddyfile.retries).
// Caddy's reverse_proxy and error logs print request headers: without the
// filter, an aborted stream writes the session ID in clear.
func TestSessionIDsDoNotLeak(t *testing.T) {
	const headerID, bodyID = "leak-check-header-5f0c8e3a", "leak-check-body-77d1b2c4"
	filter := recommendedLogFilter(t)
	// The filter hashes exactly the headers warden reads IDs from.
	var hashed []string
	for _, m := range regexp.MustCompile(`request>headers>(\S+) hash`).FindAllStringSubmatch(filter, -1) {
		hashed = append(hashed, m[1])
	}
	if want := slices.Sorted(slices.Values(sessionkey.IDHeaders)); !slices.Equal(slices.Sorted(slices.Values(hashed)), want) {
		t.Errorf("the example's log filter hashes %v, want sessionkey.IDHeaders %v", hashed, want)
	}
	// A request that carries every one of them, each with its own ID.
	var idHeaders []string
	for i, name := range sessionkey.IDHeaders {
		idHeaders = append(idHeaders, name, fmt.Sprintf("leak-check-%d-%s", i, strings.ToLower(name)))
	}
	for _, filtered := range []bool{true, false} {
		t.Run(map[bool]string{true: "recommended log filter", false: "no log filter"}[filtered], func(t *testing.T) {
			setup := caddySetup{}
			if filtered {
				setup.globalOptions = filter
			}
			a, b := startRecordingBackend(t, "a"), startRecordingBackend(t, "b")
			f, log := startRecordedFleet(t, setup, a, b)
			f.post(t, []byte(smallBody), "X-Claude-Code-Session-Id", headerID)
			f.post(t, []byte(`{"metadata":{"user_id":"{\"session_id\":\"`+bodyID+`\"}"},"messages":[]}`))
			// An aborted stream makes reverse_proxy log the request with its
			// headers: each is held open until its client leaves, once the
			// stream has begun.
			gate, _ := newGate(t)
			abort := func(header ...string) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				resp, err := f.send(ctx, "", append(header, gateHeader, gate)...)
				if err != nil {
					t.Fatal(err)
				}
				cancel()
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			abort("X-Claude-Code-Session-Id", headerID)
			abort(idHeaders...)
			scrapes := a.fake.scrapes.Load()
			testrun.Eventually(t, 10*time.Second, "both aborted streams logged and a few scrapes", func() bool {
				return strings.Count(log.String(), "aborting with incomplete response") >= 2 && a.fake.scrapes.Load() >= scrapes+3
			})
			outputs := map[string]string{}
			for _, path := range []string{"/warden/models", "/warden/models/m", "/metrics", "/config/"} {
				resp, err := http.Get("http://" + f.caddy.Admin + path)
				if err != nil {
					t.Fatal(err)
				}
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("GET %s: %s", path, resp.Status)
				}
				outputs["admin "+path] = string(raw)
			}
			caddyLog := log.String()
			if !strings.Contains(caddyLog, "aborting with incomplete response") {
				t.Fatal("the aborted stream was not logged: the check proves nothing")
			}
			ids := []string{headerID, bodyID}
			for i := 1; i < len(idHeaders); i += 2 {
				ids = append(ids, idHeaders[i])
			}
			if !filtered {
				for i := 0; i < len(idHeaders); i += 2 {
					if !strings.Contains(caddyLog, idHeaders[i+1]) {
						t.Errorf("without the filter Caddy's log does not show %s: the check proves nothing for it", idHeaders[i])
					}
				}
			} else {
				outputs["Caddy's log"] = caddyLog
			}
			for where, text := range outputs {
				for _, id := range ids {
					if strings.Contains(text, id) {
						t.Errorf("%s holds the raw session ID %s", where, id)
					}
				}
			}
		})
	}
}

// recommendedLogFilter is the global log option of the example config.
func recommendedLogFilter(t *testing.T) string {
	t.Helper()
	example, err := os.ReadFile("../examples/Caddyfile.retries")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(example), "\n\tlog {")
	block, _, closed := strings.Cut(rest, "\n\t}\n")
	if !ok || !closed {
		t.Fatal("examples/Caddyfile.retries has no global log block")
	}
	return "log {" + block + "\n\t}"
}

// Malformed options fail at load, naming the file, the line and what was
// expected.
func TestCaddyfileErrorsNameTheLine(t *testing.T) {
	cases := []struct {
		caddyfile string
		line      int
		want      string
	}{
		{"{\n\twarden {\n\t\tmodel m {\n\t\t\treplicas 127.0.0.1:1\n\t\t\tmax_num_seqs -5\n\t\t}\n\t}\n}\n", 5, `max_num_seqs: expected a positive integer, got "-5"`},
		{"{\n\twarden {\n\t\tmodel m {\n\t\t\treplicas 127.0.0.1:1\n\n\t\t\tmetrics_interval 0s\n\t\t}\n\t}\n}\n", 6, `metrics_interval is no longer a Caddyfile option: set "metrics_interval" in the model's JSON`},
		{"{\n\twarden {\n\t\tmodel m {\n\t\t\treplicas 127.0.0.1:1\n\t\t\taffinity yes\n\t\t}\n\t}\n}\n", 5, `affinity: expected on or off, got "yes"`},
		{"{\n\twarden {\n\t\tmodel m {\n\t\t\treplicas 127.0.0.1:1\n\t\t\tspill_threshold 4k\n\t\t}\n\t}\n}\n", 5, `spill_threshold: expected auto or a positive integer, got "4k"`},
		{"{\n\twarden {\n\t\tnot_a_model\n\t}\n}\n", 3, `unrecognized warden option "not_a_model"; expected model`},
		{"{\n\twarden\n}\n:8080 {\n\treverse_proxy 127.0.0.1:1 {\n\t\tlb_policy warden\n\t}\n}\n", 6, "expected: lb_policy warden <model>"},
	}
	for _, c := range cases {
		path := filepath.Join(t.TempDir(), "Caddyfile")
		if err := os.WriteFile(path, []byte(c.caddyfile), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(caddyBin, "adapt", "--config", path).CombinedOutput()
		msg := strings.ReplaceAll(string(out), `\"`, `"`)
		if err == nil {
			t.Errorf("%q adapted without error", c.want)
			continue
		}
		if where := fmt.Sprintf("Caddyfile:%d", c.line); !strings.Contains(msg, c.want) || !strings.Contains(msg, where) {
			t.Errorf("error does not say %q at %s:\n%s", c.want, where, out)
		}
	}
}
