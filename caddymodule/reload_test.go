package caddymodule_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/caddyproc"
	"github.com/lmwarden/caddy-warden/internal/testnet"
	"github.com/lmwarden/caddy-warden/internal/testrun"
	"github.com/lmwarden/caddy-warden/panel"
)

// A config load is a transaction: one that Caddy rejects, wherever it
// fails, leaves warden's settings, pins, counters, pollers and the routing
// of live requests as they were; one that succeeds applies everything.
func TestRejectedReloadChangesNothing(t *testing.T) {
	a, b, c := startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1), startFakeVLLM(t, "c", 1)
	f := startFleet(t, "replicas {replicas}\n\t\t\tspill_threshold 5", a, b)
	sessions := testrun.Sessions("tx", 8)
	home := map[string]string{}
	for _, s := range sessions {
		home[s] = f.turn(t, s)
	}

	var running map[string]any
	if err := f.caddy.Do(http.MethodGet, "/config/", nil, &running); err != nil {
		t.Fatal(err)
	}
	// The new config: threshold 9, affinity off, a third replica.
	changed := func() map[string]any {
		cfg := clone(t, running)
		m := dig(cfg, "apps", "warden", "models", "m")
		m["spill_threshold"] = 9
		m["affinity"] = false
		m["replicas"] = append(m["replicas"].([]any), map[string]any{"address": c.addr})
		for _, srv := range dig(cfg, "apps", "http", "servers") {
			for _, route := range srv.(map[string]any)["routes"].([]any) {
				for _, h := range route.(map[string]any)["handle"].([]any) {
					if h := h.(map[string]any); h["handler"] == "reverse_proxy" {
						h["upstreams"] = append(h["upstreams"].([]any), map[string]any{"dial": c.addr})
					}
				}
			}
		}
		return cfg
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()

	for _, tc := range []struct {
		name    string
		breakIt func(cfg map[string]any)
	}{
		{"in another handler", func(cfg map[string]any) {
			srv := firstServer(cfg)
			srv["routes"] = append(srv["routes"].([]any), map[string]any{"handle": []any{
				map[string]any{"handler": "rewrite", "path_regexp": []any{map[string]any{"find": "([", "replace": "x"}}},
			}})
		}},
		{"in another app, at start", func(cfg map[string]any) {
			// The http app cannot listen on a port already taken: it fails
			// in Start, after the warden app may have started.
			dig(cfg, "apps", "http", "servers")["taken"] = map[string]any{"listen": []any{taken.Addr().String()}}
		}},
		{"in warden's own second model", func(cfg map[string]any) {
			// Its process's environment is refused once model m is loaded.
			dig(cfg, "apps", "warden", "models")["n"] = map[string]any{"replicas": []any{map[string]any{
				"address": "127.0.0.1:1", "process": map[string]any{"command": []any{"true"}, "env": map[string]any{"A=B": "x"}}}}}
		}},
		{"in warden's own second model's settings", func(cfg map[string]any) {
			dig(cfg, "apps", "warden", "models")["n"] = map[string]any{
				"replicas": []any{map[string]any{"address": "127.0.0.1:1"}}, "max_num_seqs": -1}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := f.status(t)
			scrapesBefore := c.scrapes.Load()
			// Apps start in map order: try enough times to meet both orders.
			for range 4 {
				bad := changed()
				tc.breakIt(bad)
				if err := f.caddy.Do(http.MethodPost, "/load", bad, nil); err == nil {
					t.Fatal("Caddy accepted the broken config")
				}
			}
			var threshold int
			if err := f.caddy.Do(http.MethodGet, "/config/apps/warden/models/m/spill_threshold", nil, &threshold); err != nil || threshold != 5 {
				t.Fatalf("Caddy's config: spill_threshold %d (%v), want 5", threshold, err)
			}
			after := f.status(t)
			if after.SpillThreshold != 5 || !after.Affinity || len(after.Replicas) != 2 ||
				after.Requests != before.Requests || after.Sessions != before.Sessions || !after.Since.Equal(before.Since) {
				t.Fatalf("warden changed by a rejected load: threshold %d, affinity %v, %d replicas, requests %d->%d, sessions %d->%d",
					after.SpillThreshold, after.Affinity, len(after.Replicas), before.Requests, after.Requests, before.Sessions, after.Sessions)
			}
			// The third server is not polled (a load that failed in Start
			// may have polled it for a moment): while the running config's
			// servers are polled twice, then three times more, it is not.
			pollRounds(t, 2, a, b)
			settled := c.scrapes.Load()
			pollRounds(t, 3, a, b)
			if got := c.scrapes.Load(); got != settled || (tc.name != "in another app, at start" && got != scrapesBefore) {
				t.Fatalf("the rejected config's server is polled: %d scrapes before, %d, then %d", scrapesBefore, settled, got)
			}
			for _, s := range sessions {
				if served := f.turn(t, s); served != home[s] {
					t.Fatalf("after a rejected load %s served by %s, pinned to %s", s, served, home[s])
				}
			}
			if st := f.status(t); sticky(st)-sticky(after) != uint64(len(sessions)) || unpinned(st) != unpinned(after) {
				t.Fatalf("live requests not routed as sticky: sticky +%d, unpinned +%d", sticky(st)-sticky(after), unpinned(st)-unpinned(after))
			}
		})
	}

	t.Run("a load that succeeds applies everything and keeps pins", func(t *testing.T) {
		before := f.status(t)
		if err := f.caddy.Do(http.MethodPost, "/load", changed(), nil); err != nil {
			t.Fatal(err)
		}
		st := f.status(t)
		if st.SpillThreshold != 9 || st.Affinity || len(st.Replicas) != 3 || st.Sessions != before.Sessions || st.Requests != before.Requests {
			t.Fatalf("after the load: threshold %d, affinity %v, %d replicas, sessions %d (was %d), requests %d (was %d)",
				st.SpillThreshold, st.Affinity, len(st.Replicas), st.Sessions, before.Sessions, st.Requests, before.Requests)
		}
		testrun.Eventually(t, 10*time.Second, "the new server polled", func() bool { return c.scrapes.Load() > 0 })
		f.turn(t, sessions[0])
		if got := unpinned(f.status(t)) - unpinned(st); got != 1 {
			t.Fatalf("affinity off: %d requests placed by load, want 1", got)
		}
	})
}

// pollRounds waits until each of the servers has been scraped n times more.
func pollRounds(t *testing.T, n int64, servers ...*fakeVLLM) {
	t.Helper()
	from := make([]int64, len(servers))
	for i, s := range servers {
		from[i] = s.scrapes.Load()
	}
	testrun.Eventually(t, 10*time.Second, fmt.Sprintf("%d more scrapes of each server", n), func() bool {
		for i, s := range servers {
			if s.scrapes.Load() < from[i]+n {
				return false
			}
		}
		return true
	})
}

// Affinity and spill threshold are configuration: the admin shortcuts and
// PATCH on Caddy's config API change the same thing, and keep the pins.
func TestRuntimeTogglesAreConfig(t *testing.T) {
	f := startFleet(t, "replicas {replicas}", startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1))
	home := f.turn(t, "toggle")
	var st panel.ModelStatus
	if err := f.caddy.Do(http.MethodPost, "/warden/models/m/affinity", map[string]bool{"enabled": false}, &st); err != nil {
		t.Fatal(err)
	}
	var affinity bool
	if err := f.caddy.Do(http.MethodGet, "/config/apps/warden/models/m/affinity", nil, &affinity); err != nil || affinity || st.Affinity {
		t.Fatalf("after POST affinity false: config says %v (%v), panel says %v", affinity, err, st.Affinity)
	}
	if err := f.caddy.Do(http.MethodPatch, "/config/apps/warden/models/m/affinity", true, nil); err != nil {
		t.Fatal(err)
	}
	if err := f.caddy.Do(http.MethodPatch, "/config/apps/warden/models/m/spill_threshold", 3, nil); err != nil {
		t.Fatal(err)
	}
	st = f.status(t)
	if !st.Affinity || st.SpillThreshold != 3 || st.SpillThresholdAuto || st.Sessions != 1 {
		t.Fatalf("after PATCH: affinity %v, threshold %d auto=%v, sessions %d", st.Affinity, st.SpillThreshold, st.SpillThresholdAuto, st.Sessions)
	}
	if served := f.turn(t, "toggle"); served != home {
		t.Fatalf("pin lost across toggles: served by %s, pinned to %s", served, home)
	}
	for _, bad := range []struct {
		path string
		body any
		want string
	}{
		{"/warden/models/m/affinity", map[string]any{"enabled": "yes"}, "400"},
		{"/warden/models/m/affinity", map[string]any{}, "400"},
		{"/warden/models/m/spill_threshold", map[string]any{"value": 0}, "400"},
		{"/warden/models/m/spill_threshold", map[string]any{"value": 2, "auto": true}, "400"},
		{"/warden/models/nope/affinity", map[string]any{"enabled": true}, "404"},
	} {
		err := f.caddy.Do(http.MethodPost, bad.path, bad.body, nil)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("POST %s %v: %v, want %s", bad.path, bad.body, err, bad.want)
		}
	}
	if err := f.caddy.Do(http.MethodGet, "/warden/models/nope", nil, nil); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("GET unknown model: %v, want 404", err)
	}
}

// A model named as Hugging Face names them (org/name), which a config path
// cannot address: the admin shortcuts still change its options, in the
// config, and leave the other models alone.
func TestRuntimeTogglesOfAModelNamedWithASlash(t *testing.T) {
	backend := startFakeVLLM(t, "a", 1)
	ports := testnet.Addrs(t, 2)
	caddyfile := fmt.Sprintf(`{
	admin %s
	default_bind 127.0.0.1
	warden {
		model Qwen/Qwen3-4B {
			replicas %s
		}
		model other {
			replicas %s
		}
	}
}
http://%s {
	reverse_proxy %s {
		lb_policy warden Qwen/Qwen3-4B
	}
}
`, ports[0], backend.addr, backend.addr, ports[1], backend.addr)
	log := &testrun.Buffer{}
	p, err := caddyproc.Start(caddyBin, caddyfile, ports[0], log)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	t.Cleanup(func() { _ = p.Stop() })
	var before map[string]json.RawMessage
	if err := p.Do(http.MethodGet, "/config/apps/warden/models", nil, &before); err != nil {
		t.Fatal(err)
	}
	var st panel.ModelStatus
	if err := p.Do(http.MethodPost, "/warden/models/Qwen%2FQwen3-4B/affinity", map[string]bool{"enabled": false}, &st); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if err := p.Do(http.MethodPost, "/warden/models/Qwen%2FQwen3-4B/spill_threshold", map[string]int{"value": 5}, &st); err != nil {
		t.Fatal(err)
	}
	var after map[string]json.RawMessage
	if err := p.Do(http.MethodGet, "/config/apps/warden/models", nil, &after); err != nil {
		t.Fatal(err)
	}
	var m struct {
		Affinity       *bool `json:"affinity"`
		SpillThreshold int   `json:"spill_threshold"`
	}
	if err := json.Unmarshal(after["Qwen/Qwen3-4B"], &m); err != nil || m.Affinity == nil || *m.Affinity || m.SpillThreshold != 5 || st.Affinity || st.SpillThreshold != 5 {
		t.Errorf("after the shortcuts: config %s, panel affinity %v threshold %d; want affinity off and threshold 5",
			after["Qwen/Qwen3-4B"], st.Affinity, st.SpillThreshold)
	}
	if string(after["other"]) != string(before["other"]) {
		t.Errorf("the other model changed: %s, was %s", after["other"], before["other"])
	}
}

func sticky(st panel.ModelStatus) (n uint64) {
	for _, r := range st.Replicas {
		n += r.Sticky
	}
	return n
}

func unpinned(st panel.ModelStatus) (n uint64) {
	for _, r := range st.Replicas {
		n += r.Unpinned
	}
	return n
}

func clone(t *testing.T, v map[string]any) map[string]any {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// dig walks nested JSON objects.
func dig(v map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		v = v[k].(map[string]any)
	}
	return v
}

func firstServer(cfg map[string]any) map[string]any {
	for _, srv := range dig(cfg, "apps", "http", "servers") {
		return srv.(map[string]any)
	}
	return nil
}
