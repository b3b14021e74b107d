package caddymodule_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/caddymodule"
	"github.com/lmwarden/caddy-warden/internal/testrun"
)

// A conversation whose replica wrote more KV tokens than it had free since
// the conversation's last turn (its /metrics counters say so) is rehomed:
// its next turn goes to the other replica, counted in the admin JSON and on
// /metrics, and it stays there.
func TestColdConversationIsRehomedThroughCaddy(t *testing.T) {
	backends := []*fakeVLLM{startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1)}
	f := startFleetWith(t, caddySetup{modelBlock: "replicas {replicas}", fields: map[string]any{"client_pinning": true}}, backends...)
	addr := map[string]string{}
	for _, b := range backends {
		addr[b.name+"/0"] = b.addr
	}
	home := f.turn(t, "conv")
	var pin *fakeVLLM
	for _, b := range backends {
		if b.addr == addr[home] {
			pin = b
		}
	}
	// Rehoming needs the replica's write counters, which a replica that
	// has written nothing yet shows as 0.
	scrapes := pin.scrapes.Load()
	testrun.Eventually(t, 5*time.Second, "two scrapes after the first turn", func() bool { return pin.scrapes.Load() >= scrapes+2 })
	if f.turn(t, "conv") != home {
		t.Fatal("the second turn left its replica with nothing written")
	}

	// Another client writes 50,000 uncached tokens (the fake counts bytes)
	// on conv's replica, whose 40,000-token cache is 90% free.
	scrapes = pin.scrapes.Load()
	body := `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"` + strings.Repeat("x", 50000) + `"}]}`
	if status, served := f.post(t, []byte(body), "X-Claude-Code-Session-Id", "filler", caddymodule.ReplicaHeader, addr[home]); status != http.StatusOK || served != home {
		t.Fatalf("filler: status %d on %s, want 200 on %s", status, served, home)
	}
	testrun.Eventually(t, 5*time.Second, "two scrapes after the filler", func() bool { return pin.scrapes.Load() >= scrapes+2 })

	moved := f.turn(t, "conv")
	if moved == home {
		t.Fatalf("after 50,000 tokens written on %s, conv stayed", home)
	}
	if again := f.turn(t, "conv"); again != moved {
		t.Errorf("the turn after the move went to %s, rehomed to %s", again, moved)
	}
	for _, r := range f.status(t).Replicas {
		want := uint64(0)
		if r.Address == addr[moved] {
			want = 1
		}
		if r.Rehomed != want {
			t.Errorf("replica %s: rehomed %d, want %d", r.ID, r.Rehomed, want)
		}
	}
	family := scrapeMetrics(t, f)["caddy_warden_sessions_rehomed_total"]
	if family == nil {
		t.Fatal("caddy_warden_sessions_rehomed_total is not exported")
	}
	var total float64
	for _, m := range family.GetMetric() {
		total += m.GetCounter().GetValue()
	}
	if total != 1 {
		t.Errorf("caddy_warden_sessions_rehomed_total sums to %v, want 1", total)
	}
}
