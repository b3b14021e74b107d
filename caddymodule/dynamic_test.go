package caddymodule_test

import (
	"net/http"
	"testing"

	"github.com/lmwarden/caddy-warden/internal/testrun"
)

// `dynamic warden m` routes conversations to the model's replicas and
// keeps them pinned, with no upstream written in reverse_proxy; a replica
// added to the model through the config API becomes an upstream too.
func TestDynamicUpstreams(t *testing.T) {
	a, b, c := startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1), startFakeVLLM(t, "c", 1)
	f, _ := runCaddy(t, caddySetup{modelBlock: "replicas {replicas}", dynamic: true, fields: slowScrapes}, a.addr, b.addr)
	f.backends = []*fakeVLLM{a, b}

	var running any
	if err := f.caddy.Do(http.MethodGet, "/config/apps/http", nil, &running); err != nil {
		t.Fatal(err)
	}
	proxies := handlers(running, "reverse_proxy")
	if len(proxies) != 1 {
		t.Fatalf("%d reverse_proxy handlers running, want 1: %v", len(proxies), running)
	}
	proxy := proxies[0]
	if _, static := proxy["upstreams"]; static {
		t.Fatalf("want a reverse_proxy without static upstreams, running %v", proxy)
	}
	if src, _ := proxy["dynamic_upstreams"].(map[string]any); src["source"] != "warden" || src["model"] != "m" {
		t.Fatalf("dynamic_upstreams %v, want source warden, model m", proxy["dynamic_upstreams"])
	}

	convs := testrun.Sessions("dyn", 8)
	home := pinAll(t, f, convs)
	for range 3 {
		for _, conv := range convs {
			if served := f.turn(t, conv); served != home[conv] {
				t.Errorf("%s served by %s, pinned to %s", conv, served, home[conv])
			}
		}
	}
	perBackend := map[string]int{}
	for conv, engines := range sessionsSeen(a, b) {
		if len(engines) != 1 {
			t.Errorf("%s reached %v", conv, engines)
		}
		for e := range engines {
			perBackend[e]++
		}
	}
	if len(perBackend) != 2 {
		t.Errorf("8 conversations reached %v, want both replicas", perBackend)
	}
	if st := f.status(t); st.StickyPercent != 100 || st.Sessions != int64(len(convs)) {
		t.Errorf("sticky %.1f%%, sessions %d", st.StickyPercent, st.Sessions)
	}

	// A third replica, written once: in the model.
	if err := f.caddy.Do(http.MethodPost, "/config/apps/warden/models/m/replicas", map[string]string{"address": c.addr}, nil); err != nil {
		t.Fatal(err)
	}
	f.waitHealthy(t)
	if n := len(f.status(t).Replicas); n != 3 {
		t.Fatalf("%d replicas after adding c", n)
	}
	// Conversations spread by load: new ones fill c, which has none.
	for _, conv := range testrun.Sessions("dyn-new", 4) {
		f.turn(t, conv)
	}
	if seen := sessionsSeen(c); len(seen) == 0 {
		t.Error("no new conversation reached the added replica c")
	}
	for _, conv := range convs {
		if served := f.turn(t, conv); served != home[conv] {
			t.Errorf("after adding c, %s served by %s, pinned to %s", conv, served, home[conv])
		}
	}
}

// handlers finds the handlers of a kind anywhere in a JSON config.
func handlers(cfg any, kind string) []map[string]any {
	var out []map[string]any
	switch v := cfg.(type) {
	case map[string]any:
		if v["handler"] == kind {
			out = append(out, v)
		}
		for _, child := range v {
			out = append(out, handlers(child, kind)...)
		}
	case []any:
		for _, child := range v {
			out = append(out, handlers(child, kind)...)
		}
	}
	return out
}
