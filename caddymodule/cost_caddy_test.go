package caddymodule_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/caddymodule"
	"github.com/lmwarden/caddy-warden/internal/testrun"
	"github.com/lmwarden/caddy-warden/panel"
)

// bigBody is a 50,000-byte request: 12,500 tokens as warden estimates it
// (4 bytes a token), 50,000 as the fake counts it.
var bigBody = []byte(`{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("x", 50000-84) + `"}]}`)

// learnt waits until the model's admin JSON shows the prefill rate the
// replicas' counters tell (the fake's 200,000 tokens a second).
func learnt(t *testing.T, f *fleet) panel.ModelStatus {
	t.Helper()
	var st panel.ModelStatus
	testrun.Eventually(t, 10*time.Second, "the prefill rate learnt", func() bool {
		st = f.status(t)
		return st.PrefillTokensPerSecond != nil && st.TurnSeconds != nil
	})
	if got := *st.PrefillTokensPerSecond; got != fakePrefillRate {
		t.Fatalf("prefill rate %g, want the fake's %d", got, fakePrefillRate)
	}
	return st
}

// A conversation's turns stay on its replica while its KV cache holds
// them; the turn that would have to wait for one of them to end (the fake's
// 40,000-token cache holds three 12,500-token prompts) moves to the idle
// replica, where it starts at once even counting the prompt it recomputes,
// and the conversation stays there. The admin JSON shows the move and what
// it was costed with.
func TestTurnMovesOffAFullReplicaThroughCaddy(t *testing.T) {
	backends := []*fakeVLLM{startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1)}
	f := startFleet(t, "replicas {replicas}\n\t\t\tmax_num_seqs 32", backends...)
	status, home := f.post(t, bigBody, "X-Claude-Code-Session-Id", "big", holdHeader, "2s") // turns take 2 s
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	st := learnt(t, f)
	if st.SpillThreshold != 0 || !st.SpillThresholdAuto {
		t.Errorf("threshold %d auto=%v, want 0 auto", st.SpillThreshold, st.SpillThresholdAuto)
	}
	if got := scrapeMetrics(t, f)["caddy_warden_prefill_tokens_per_second"]; got == nil || got.GetMetric()[0].GetGauge().GetValue() != fakePrefillRate {
		t.Errorf("caddy_warden_prefill_tokens_per_second: %v", got)
	}

	served := make([]string, 5)
	gate, open := newGate(t)
	var wg sync.WaitGroup
	for i := range served {
		wg.Go(func() { _, served[i] = f.post(t, bigBody, "X-Claude-Code-Session-Id", "big", gateHeader, gate) })
		testrun.Eventually(t, 10*time.Second, "the request in flight", func() bool { return f.status(t).InFlight == int64(i+1) })
	}
	open()
	wg.Wait()
	moved := served[3]
	if moved == home || served[0] != home || served[1] != home || served[2] != home || served[4] != moved {
		t.Fatalf("served by %v: want the first three on %s, the fourth and fifth on the other replica", served, home)
	}
	if next := f.turn(t, "big"); next != moved {
		t.Errorf("the next turn went to %s, the conversation moved to %s", next, moved)
	}
	for _, r := range f.status(t).Replicas {
		if want := uint64(0); r.Address == backendAddr(backends, moved) {
			if r.SpilledIn != 1 {
				t.Errorf("replica %s: spilled_in %d, want 1", r.ID, r.SpilledIn)
			}
		} else if r.SpilledIn != want {
			t.Errorf("replica %s: spilled_in %d, want 0", r.ID, r.SpilledIn)
		}
	}
}

// A conversation whose replica wrote more KV tokens than it had free since
// the conversation's last turn (its /metrics counters say so) has lost its
// cache there: while that replica runs another request in its only
// sequence slot, its next turn goes to the idle one (rehomed), counted in
// the admin JSON and on /metrics, and it stays there. (A slot, not a
// prefill backlog, keeps the replica busy: warden drains a backlog at the
// learnt rate, here in milliseconds, so a slow test machine would see it
// gone.)
func TestEvictedConversationMovesThroughCaddy(t *testing.T) {
	backends := []*fakeVLLM{startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1)}
	f := startFleetWith(t, caddySetup{modelBlock: "replicas {replicas}\n\t\t\tmax_num_seqs 1", fields: map[string]any{"client_pinning": true}}, backends...)
	home := f.turn(t, "conv")
	pin := backends[0]
	if backendAddr(backends, home) != pin.addr {
		pin = backends[1]
	}
	// Another client writes 50,000 uncached tokens (the fake counts bytes)
	// on conv's replica, whose 40,000-token cache is 90% free.
	scrapes := pin.scrapes.Load()
	if status, served := f.post(t, bigBody, "X-Claude-Code-Session-Id", "filler", caddymodule.ReplicaHeader, pin.addr); status != http.StatusOK || served != home {
		t.Fatalf("filler: status %d on %s, want 200 on %s", status, served, home)
	}
	testrun.Eventually(t, 10*time.Second, "two scrapes after the filler", func() bool { return pin.scrapes.Load() >= scrapes+2 })
	learnt(t, f)
	if again := f.turn(t, "conv"); again != home {
		t.Fatalf("with both replicas idle the evicted conversation moved to %s: a tie keeps it on %s", again, home)
	}

	scrapes = pin.scrapes.Load()
	if status, served := f.post(t, bigBody, "X-Claude-Code-Session-Id", "filler-2", caddymodule.ReplicaHeader, pin.addr); status != http.StatusOK || served != home {
		t.Fatalf("second filler: status %d on %s, want 200 on %s", status, served, home)
	}
	testrun.Eventually(t, 10*time.Second, "two scrapes after the second filler", func() bool { return pin.scrapes.Load() >= scrapes+2 })
	gate, open := newGate(t)
	busy := make(chan struct{})
	go func() {
		defer close(busy)
		f.post(t, bigBody, "X-Claude-Code-Session-Id", "busy", caddymodule.ReplicaHeader, pin.addr, gateHeader, gate)
	}()
	testrun.Eventually(t, 10*time.Second, "the busy request in flight", func() bool { return f.status(t).InFlight == 1 })
	moved := f.turn(t, "conv")
	open()
	<-busy
	if moved == home {
		t.Fatalf("with its cache evicted and its replica's slot taken, conv stayed on %s", home)
	}
	if again := f.turn(t, "conv"); again != moved {
		t.Errorf("the turn after the move went to %s, rehomed to %s", again, moved)
	}
	for _, r := range f.status(t).Replicas {
		want := uint64(0)
		if r.Address == backendAddr(backends, moved) {
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

// backendAddr is the address of the backend a response's X-Backend names
// ("name/rank").
func backendAddr(backends []*fakeVLLM, served string) string {
	for _, b := range backends {
		if strings.HasPrefix(served, b.name+"/") {
			return b.addr
		}
	}
	return ""
}
