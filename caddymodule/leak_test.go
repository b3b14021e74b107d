package caddymodule_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/goleak"

	"github.com/lmwarden/caddy-warden/internal/redisproc"
	"github.com/lmwarden/caddy-warden/internal/testnet"
	"github.com/lmwarden/caddy-warden/internal/testrun"
)

// Warden's goroutines (metrics pollers, session sweepers) end with the last
// config that uses them: load a warden config in this process, reload it
// with changes, serve through it, stop Caddy, and nothing of warden's may be
// left running.
func TestNoGoroutineLeftAfterReloadsAndStop(t *testing.T) {
	testrun.CaddyHome(t)
	backends := []*fakeVLLM{startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1)}
	redis := redisproc.StartTest(t)
	site := testnet.Addr(t)
	load := func(replicas int, spill int, pinStore string, loadControl bool) {
		t.Helper()
		if err := caddy.Load(inProcessConfig(site, backends[:replicas], spill, pinStore, loadControl), true); err != nil {
			t.Fatalf("loading: %v", err)
		}
	}

	// Caddy itself starts process-wide goroutines on its first load (its
	// logging, the certificate cache, the listener pool...). One load and
	// stop first, so that what is left is Caddy's and is ignored below.
	load(1, 0, "", false)
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	// Idle keep-alive connections (Caddy's transport to the backends, the
	// backends' side of them) outlive a stop by design; they are net/http's.
	// Certmagic refreshes a storage lock file while Caddy cleans storage.
	ignore := []goleak.Option{
		goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("github.com/caddyserver/certmagic.keepLockfileFresh"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
	}

	for i := range 4 {
		// Replicas added and removed, threshold changed, the shared pin
		// store switched off and on, load control on: it ends on.
		pinStore := ""
		if i%2 == 1 {
			pinStore = redis.Addr
		}
		load(1+i%2, 4+i, pinStore, i >= 2)
		// The first load after the stop polls its replicas anew: it serves
		// once a scrape found them healthy. A connection per request: the
		// reload closes idle ones (siteClient). caddy.Load returns once the
		// old servers' shutdowns have started, not ended: a connection the
		// kernel gave the old listener meanwhile is reset, and sent again.
		testrun.Eventually(t, 10*time.Second, fmt.Sprintf("served after reload %d", i), func() bool {
			resp, err := siteClient.Post("http://"+site+"/v1/messages", "application/json", strings.NewReader(`{"model":"m"}`))
			if err != nil {
				t.Logf("after reload %d: %v", i, err)
				return false
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
	holdForcedAndRefused(t, site)
	// The check can see warden's goroutines: while loaded, they are there.
	if err := goleak.Find(ignore...); err == nil || !strings.Contains(err.Error(), "metricsfeed") || !strings.Contains(err.Error(), "pinstore") {
		t.Fatalf("while loaded, goleak sees no metrics poller or pin store sync: %v", err)
	}
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, ignore...)
}

// holdForcedAndRefused sends, while a turn of another conversation runs,
// three new conversations to a site of two replicas whose load control
// holds one turn at most, 200 ms: one is admitted on the other replica, one
// waits and is sent anyway, one is refused.
func holdForcedAndRefused(t *testing.T, site string) {
	t.Helper()
	turn := func(conv, hold string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, "http://"+site+"/v1/messages", strings.NewReader(`{"model":"m"}`))
		req.Header.Set("X-Claude-Code-Session-Id", conv)
		req.Header.Set(holdHeader, hold)
		req.Header.Set(stopReasonHeader, "tool_use") // each stays resident after its turn
		// siteClient: the last reload's old listener may still take a connection.
		resp, err := siteClient.Do(req)
		if err != nil {
			t.Errorf("%s: %v", conv, err)
			return nil
		}
		return resp
	}
	resident := turn("resident", "600ms") // answered at once, streams until then
	if resident == nil {
		t.FailNow()
	}
	defer resident.Body.Close()
	statuses := map[int]int{}
	var mu sync.Mutex
	testrun.Concurrently(3, func(i int) {
		if resp := turn(fmt.Sprint("new-", i), "0s"); resp != nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mu.Lock()
			statuses[resp.StatusCode]++
			mu.Unlock()
		}
	})
	if statuses[http.StatusOK] != 2 || statuses[http.StatusServiceUnavailable] != 1 {
		t.Errorf("three new conversations while one runs: statuses %v, want two 200 (one after max_wait) and one 503", statuses)
	}
	_, _ = io.Copy(io.Discard, resident.Body)
}

// inProcessConfig is a JSON config without an admin endpoint (the other
// tests' Caddy processes own theirs) serving site through warden; with a
// Redis address, the model's pins are shared there; with loadControl, each
// replica's cache holds one conversation, and one other turn may wait, for
// 200 ms.
func inProcessConfig(site string, backends []*fakeVLLM, spill int, redisAddr string, loadControl bool) []byte {
	pinStore := ""
	if redisAddr != "" {
		pinStore = fmt.Sprintf(`, "pin_store": {"redis": {"address": %q}}`, redisAddr)
	}
	if loadControl {
		pinStore += `, "load_control": {"enabled": true, "capacity_tokens": 1, "fill": 1, "min_residents": 1, "max_wait": "200ms", "max_queue": 1}`
	}
	var replicas, upstreams []string
	for _, b := range backends {
		replicas = append(replicas, fmt.Sprintf(`{"address":%q}`, b.addr))
		upstreams = append(upstreams, fmt.Sprintf(`{"dial":%q}`, b.addr))
	}
	return fmt.Appendf(nil, `{
	"admin": {"disabled": true, "config": {"persist": false}},
	"logging": {"logs": {"default": {"level": "ERROR"}}},
	"apps": {
		"warden": {"models": {"m": {"replicas": [%s], "spill_threshold": %d, "metrics_interval": "50ms"%s}}},
		"http": {"servers": {"s": {
			"listen": [%q],
			"routes": [{"handle": [{"handler": "warden_stop_reason"}, {
				"handler": "reverse_proxy",
				"upstreams": [%s],
				"load_balancing": {"selection_policy": {"policy": "warden", "model": "m"}}
			}]}]
		}}}
	}
}`, strings.Join(replicas, ","), spill, pinStore, site, strings.Join(upstreams, ","))
}
