package caddymodule_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/testrun"
	"github.com/lmwarden/caddy-warden/panel"
)

// Load control through a real Caddy in front of one fake vLLM whose cache
// load control counts as 1 token, with min_residents 1: a replica with
// nothing resident takes any one conversation, so while conversation
// "resident" runs or lingers, a turn of any other conversation must wait.
// Every turn here ends in a tool call, as an agent's do, so that its
// conversation stays resident for its linger.

// loadControlSetup is the Caddy of these tests: load control on, with
// warden_stop_reason in the site, and the given load_control JSON fields
// over capacity_tokens 1, fill 1 and min_residents 1.
func loadControlSetup(fields map[string]any) caddySetup {
	lc := map[string]any{"capacity_tokens": 1, "fill": 1, "min_residents": 1}
	maps.Copy(lc, fields)
	return loadControlWith(lc)
}

// loadControlWith is load control on with exactly these load_control JSON
// fields.
func loadControlWith(fields map[string]any) caddySetup {
	setup := caddySetup{
		modelBlock:     "replicas {replicas}\n\t\t\tload_control on",
		siteDirectives: "warden_stop_reason",
		fields:         map[string]any{},
	}
	for name, v := range fields {
		setup.fields["load_control."+name] = v
	}
	return setup
}

// holdTurn keeps a turn of conv in flight (its conversation resident) until
// the returned function ends it or the test ends.
func holdTurn(t *testing.T, f *fleet, conv string) (end func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := f.send(ctx, conv, holdHeader, "1m", stopReasonHeader, "tool_use")
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s", conv, resp.Status)
	}
	end = func() {
		cancel()
		resp.Body.Close()
	}
	t.Cleanup(end)
	return end
}

// engage makes load control hold turns, as it does once a turn lacks room:
// held conversations run, each on its first turn, and lacking more arrive
// and wait; then the waiting ones leave and the held ones end their tasks,
// leaving the replicas empty. The fleet's capacity must leave no room for
// the lacking ones beside the held ones.
func engage(t *testing.T, f *fleet, held, lacking int) {
	t.Helper()
	gate, open := newGate(t)
	var running []<-chan answer
	for i := range held {
		running = append(running, sendAsync(context.Background(), f, fmt.Sprint("engage-held-", i), gateHeader, gate, stopReasonHeader, "end_turn"))
		testrun.Eventually(t, 10*time.Second, "the held conversation resident", func() bool { return residents(f.status(t)) == i+1 })
	}
	ctx, cancel := context.WithCancel(context.Background())
	var waiting []<-chan answer
	for i := range lacking {
		waiting = append(waiting, sendTurnAsync(ctx, f, fmt.Sprint("engage-lacking-", i)))
		waitingIs(t, f, i+1)
	}
	if st := f.status(t).LoadControl; st.SteppedAside {
		t.Fatalf("load_control %+v with turns lacking room, want engaged", st)
	}
	cancel()
	for _, done := range waiting {
		<-done
	}
	// Caddy notices a client left a moment after it did: a turn admitted
	// before then is sent, and its residency lingers.
	waitingIs(t, f, 0)
	open()
	for _, done := range running {
		if a := <-done; a.err != nil || a.status != http.StatusOK {
			t.Fatalf("a held conversation: %+v", a)
		}
	}
	var last panel.ModelStatus
	defer func() {
		if t.Failed() {
			t.Logf("the held conversations' ends: load_control %+v, replicas %+v", last.LoadControl, last.Replicas)
		}
	}()
	testrun.Eventually(t, 10*time.Second, "the held conversations gone", func() bool {
		last = f.status(t)
		return residents(last) == 0
	})
}

// residents counts the conversations resident on any replica.
func residents(st panel.ModelStatus) int {
	n := 0
	for _, rep := range st.Replicas {
		n += rep.Residents
	}
	return n
}

// answer is what a client got for a turn.
type answer struct {
	status     int
	retryAfter string
	backend    string
	err        error
	took       time.Duration
	at         time.Time // when it was read to its end
}

// sendTurn sends a turn of conv and reads the answer to its end.
func sendTurn(ctx context.Context, f *fleet, conv string) answer {
	return send(ctx, f, conv, stopReasonHeader, "tool_use")
}

// send sends a turn of conv with these headers and reads the answer to its
// end.
func send(ctx context.Context, f *fleet, conv string, header ...string) answer {
	start := time.Now()
	resp, err := f.send(ctx, conv, header...)
	if err != nil {
		return answer{err: err, took: time.Since(start), at: time.Now()}
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"),
		backend: resp.Header.Get("X-Backend"), err: err, took: time.Since(start), at: time.Now()}
}

// sendTurnAsync is sendTurn in its own goroutine.
func sendTurnAsync(ctx context.Context, f *fleet, conv string) <-chan answer {
	return sendAsync(ctx, f, conv, stopReasonHeader, "tool_use")
}

// sendAsync is send in its own goroutine.
func sendAsync(ctx context.Context, f *fleet, conv string, header ...string) <-chan answer {
	out := make(chan answer, 1)
	go func() { out <- send(ctx, f, conv, header...) }()
	return out
}

// waitingIs waits until the admin JSON shows n turns waiting.
func waitingIs(t *testing.T, f *fleet, n int) panel.ModelStatus {
	t.Helper()
	var st panel.ModelStatus
	testrun.Eventually(t, 10*time.Second, fmt.Sprintf("load_control.waiting %d", n), func() bool {
		st = f.status(t)
		return st.LoadControl.Waiting == n
	})
	return st
}

// heldGoroutines counts Caddy's goroutines stopped in the policy (a turn
// waiting), from the admin address's goroutine profile.
func heldGoroutines(t *testing.T, f *fleet) int {
	t.Helper()
	return strings.Count(adminGet(t, f, "/debug/pprof/goroutine?debug=2"), "caddymodule.(*Policy).wait(")
}

// adminGet is the body of an admin address's GET of path, as sent.
func adminGet(t *testing.T, f *fleet, path string) string {
	t.Helper()
	resp, err := http.Get("http://" + f.caddy.Admin + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

func TestLoadControlHoldsCancelsAndRefuses(t *testing.T) {
	backend := startFakeVLLM(t, "a", 1)
	setup := loadControlSetup(map[string]any{"linger": "1s", "max_wait": "1m", "max_queue": 5})
	setup.proxyOptions = "lb_retries 2" // a turn turned away must stay so on Caddy's retries
	f, _ := runCaddy(t, setup, backend.addr)
	endResident := holdTurn(t, f, "resident")
	before := f.status(t)
	if kv := before.Replicas[0].KVCapacityTokens; kv == nil || *kv != 1 {
		t.Fatalf("kv_capacity_tokens %v, want capacity_tokens 1", kv)
	}
	if !before.LoadControl.Enabled || before.Replicas[0].Residents != 1 || before.InFlight != 1 {
		t.Fatalf("before: load_control %+v, %d residents, %d in flight; want on, the resident alone",
			before.LoadControl, before.Replicas[0].Residents, before.InFlight)
	}

	t.Run("a queued turn whose client leaves leaves no trace", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		done := sendTurnAsync(ctx, f, "leaves")
		waitingIs(t, f, 1)
		cancel()
		if a := <-done; a.err == nil {
			t.Fatalf("the cancelled client got an answer: %+v", a)
		}
		st := waitingIs(t, f, 0)
		testrun.Eventually(t, 10*time.Second, "the cancellation counted", func() bool {
			st = f.status(t)
			return st.LoadControl.Cancelled == before.LoadControl.Cancelled+1
		})
		rep, was := st.Replicas[0], before.Replicas[0]
		if st.InFlight != 1 || st.Requests != before.Requests || rep.Residents != was.Residents || rep.ResidentTokens != was.ResidentTokens {
			t.Errorf("after the client left: %d in flight, %d requests, %d residents (%d tokens); before: 1, %d, %d (%d)",
				st.InFlight, st.Requests, rep.Residents, rep.ResidentTokens, before.Requests, was.Residents, was.ResidentTokens)
		}
		if st.LoadControl.Admitted != before.LoadControl.Admitted {
			t.Errorf("admitted %d, was %d", st.LoadControl.Admitted, before.LoadControl.Admitted)
		}
		if _, sent := sessionsSeen(backend)["leaves"]; sent {
			t.Error("the cancelled turn reached the replica")
		}
	})

	t.Run("a flood of new conversations cannot grow the queue past max_queue", func(t *testing.T) {
		start := f.status(t).LoadControl
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var mu sync.Mutex
		var refused, other []answer
		var wg sync.WaitGroup
		for _, conv := range testrun.Sessions("flood", 200) {
			wg.Go(func() {
				a := sendTurn(ctx, f, conv)
				mu.Lock()
				defer mu.Unlock()
				if a.status == http.StatusServiceUnavailable {
					refused = append(refused, a)
				} else {
					other = append(other, a)
				}
			})
		}
		testrun.Eventually(t, 20*time.Second, "195 turns refused", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(refused) == 195
		})
		if st := waitingIs(t, f, 5).LoadControl; st.Refused-start.Refused != 195 || st.Queued-start.Queued != 5 {
			t.Errorf("counters after the flood: %+v (before %+v), want 195 refused, 5 queued", st, start)
		}
		cancel() // the five waiting clients leave
		wg.Wait()
		for _, a := range refused {
			if a.retryAfter != "1" {
				t.Errorf("a refused turn's Retry-After %q, want 1 (the linger)", a.retryAfter)
				break
			}
		}
		if len(other) != 5 {
			t.Fatalf("%d turns not refused, want the 5 queued", len(other))
		}
		for _, a := range other {
			if a.err == nil {
				t.Errorf("a queued turn was answered %d while the resident ran", a.status)
			}
		}
		waitingIs(t, f, 0)
		testrun.Eventually(t, 10*time.Second, "no request goroutine left waiting in Caddy", func() bool {
			return heldGoroutines(t, f) == 0
		})
	})

	t.Run("a held turn is admitted when the resident's linger ends", func(t *testing.T) {
		start := f.status(t).LoadControl
		endResident()
		a := sendTurn(context.Background(), f, "next")
		if a.err != nil || a.status != http.StatusOK || a.backend != "a/0" {
			t.Fatalf("the next conversation: %+v, want served", a)
		}
		// The resident lingers 1 s after its turn, swept every second.
		if a.took < 500*time.Millisecond {
			t.Errorf("served after %v, before the resident's linger could end", a.took)
		}
		st := f.status(t).LoadControl
		if st.Queued != start.Queued+1 || st.Forced != start.Forced {
			t.Errorf("counters %+v (before %+v), want 1 more queued, none forced", st, start)
		}
	})

	t.Run("its series are documented and agree with the admin JSON", func(t *testing.T) {
		families := scrapeMetrics(t, f)
		checkMetricsDocumented(t, families, loadControlSeries)
		st := f.status(t).LoadControl
		turns := map[string]float64{}
		for _, m := range families["caddy_warden_load_control_turns_total"].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" {
					turns[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
		want := map[string]float64{"admitted": float64(st.Admitted), "queued": float64(st.Queued), "forced": float64(st.Forced),
			"refused": float64(st.Refused), "cancelled": float64(st.Cancelled), "task_ended": float64(st.TaskEnded),
			"side_call": float64(st.SideCalls)}
		if !maps.Equal(turns, want) {
			t.Errorf("turns_total %v, admin JSON %v", turns, want)
		}
		waits := families["caddy_warden_load_control_wait_seconds"].GetMetric()
		if len(waits) != 1 || float64(waits[0].GetHistogram().GetSampleCount()) != want["queued"] {
			t.Errorf("wait_seconds %v, want one observation per queued turn (%v)", waits, want["queued"])
		}
	})
}

// With the farm preset's touch and a fill range too, which the admin JSON
// shows.
func TestLoadControlMaxWaitSendsTheTurnAnyway(t *testing.T) {
	backend := startFakeVLLM(t, "a", 1)
	f := startFleetWith(t, loadControlSetup(map[string]any{"max_wait": "300ms", "fill_min": 0.5, "fill_max": 1, "touch": true}), backend)
	st := f.status(t)
	if lc := st.LoadControl; !lc.Touch || lc.FillMin != 0.5 || lc.FillMax != 1 || st.Replicas[0].Fill != 1 {
		t.Fatalf("load_control touch %v, fill_min %v, fill_max %v, the replica's fill %v; want on, 0.5, 1 and fill (1) until a reply reports its cached part",
			lc.Touch, lc.FillMin, lc.FillMax, st.Replicas[0].Fill)
	}
	holdTurn(t, f, "resident")
	a := sendTurn(context.Background(), f, "next")
	if a.err != nil || a.status != http.StatusOK || a.backend != "a/0" {
		t.Fatalf("the held turn: %+v, want served after max_wait", a)
	}
	if a.took < 300*time.Millisecond {
		t.Errorf("served after %v, before max_wait", a.took)
	}
	if st := f.status(t).LoadControl; st.Forced != 1 || st.Waiting != 0 {
		t.Errorf("load_control %+v, want 1 forced, none waiting", st)
	}
}

// Conversations that come back only after their linger make load control
// step aside, and the admin JSON says so: a turn that would wait behind a
// resident is then sent at once.
func TestLoadControlStepsAsideForLateConversations(t *testing.T) {
	backend := startFakeVLLM(t, "a", 1)
	f := startFleetWith(t, loadControlSetup(map[string]any{"linger": "100ms", "max_wait": "3s"}), backend)
	engage(t, f, 1, 3)
	engaged := f.status(t).LoadControl
	for i := 0; !f.status(t).LoadControl.SteppedAside; i++ {
		if i == 20 {
			t.Fatalf("not stepped aside after 20 turns back after their linger: %+v", f.status(t).LoadControl)
		}
		if a := sendTurn(context.Background(), f, "late"); a.err != nil || a.status != http.StatusOK {
			t.Fatalf("turn %d: %+v", i, a)
		}
		testrun.Eventually(t, 10*time.Second, "the conversation's residency over", func() bool {
			return f.status(t).Replicas[0].Residents == 0
		})
	}
	if st := f.status(t).LoadControl; st.LateShare <= 0.5 || st.Queued != engaged.Queued {
		t.Errorf("load_control %+v, want late_share over a half and no turn queued", st)
	}
	holdTurn(t, f, "resident")
	if a := sendTurn(context.Background(), f, "next"); a.err != nil || a.status != http.StatusOK {
		t.Fatalf("the next turn: %+v", a)
	}
	if st := f.status(t).LoadControl; st.Queued != engaged.Queued || !st.SteppedAside {
		t.Errorf("load_control %+v, want nothing queued while stepped aside", st)
	}
}

// With load control off nothing is held, whatever the capacity, and the KV
// capacity shown is the replica's own (cache_config_info).
func TestLoadControlOffHoldsNothing(t *testing.T) {
	backend := startFakeVLLM(t, "a", 1)
	off := loadControlSetup(nil)
	off.modelBlock = "replicas {replicas}\n\t\t\tload_control off"
	f := startFleetWith(t, off, backend)
	holdTurn(t, f, "resident")
	for _, conv := range testrun.Sessions("free", 3) {
		if a := sendTurn(context.Background(), f, conv); a.err != nil || a.status != http.StatusOK {
			t.Errorf("%s with load control off: %+v", conv, a)
		}
	}
	st := f.status(t)
	if lc := st.LoadControl; lc.Enabled || lc.Admitted+lc.Queued != 0 || lc.Waiting != 0 || st.Replicas[0].Residents != 0 {
		t.Errorf("load control off: %+v, %d residents; want nothing counted", lc, st.Replicas[0].Residents)
	}

	g := startFleet(t, "replicas {replicas}", backend)
	if kv := g.status(t).Replicas[0].KVCapacityTokens; kv == nil || *kv != 40000 {
		t.Errorf("kv_capacity_tokens %v, want 40000 from the replica's cache_config_info", kv)
	}
}

// With stagger, once load control holds turns, a replica filling from
// empty takes a new conversation at most once per stagger, though it has
// room for all (three, min_residents): the second conversation waits for
// the first's stagger, the third for the second's, and a turn of a
// resident conversation is never held.
func TestLoadControlStaggersNewConversations(t *testing.T) {
	const stagger = 2 * time.Second
	backend := startFakeVLLM(t, "a", 1)
	f := startFleetWith(t, loadControlWith(map[string]any{"capacity_tokens": 1, "fill": 1, "min_residents": 3, "linger": "1m", "stagger": "2s"}), backend)
	if st := f.status(t).LoadControl; st.StaggerSeconds != 2 {
		t.Fatalf("stagger_s %v, want 2", st.StaggerSeconds)
	}
	engage(t, f, 3, 1)
	engaged := f.status(t).LoadControl
	start := time.Now()
	if a := sendTurn(context.Background(), f, "first"); a.err != nil || a.status != http.StatusOK || f.status(t).LoadControl.Queued != engaged.Queued {
		t.Fatalf("the first conversation on an empty replica: %+v, want served at once (none queued: %+v)", a, f.status(t).LoadControl)
	}
	if next := f.status(t).Replicas[0].NextNewcomer; next == nil || next.Before(time.Now()) || next.After(time.Now().Add(stagger)) {
		t.Errorf("next_newcomer %v after the first conversation, want within the coming stagger", next)
	}
	second := sendTurnAsync(context.Background(), f, "second")
	waitingIs(t, f, 1) // the third queues behind the second
	third := sendTurnAsync(context.Background(), f, "third")
	if a := sendTurn(context.Background(), f, "first"); a.err != nil || a.status != http.StatusOK {
		t.Errorf("the resident's next turn: %+v", a)
	}
	for i, done := range []<-chan answer{second, third} {
		a := <-done
		if a.err != nil || a.status != http.StatusOK {
			t.Fatalf("newcomer %d: %+v", i+1, a)
		}
		// Admitted at most once per stagger (less a millisecond for the
		// ticks' jitter): the n-th newcomer no sooner than n staggers after
		// the first conversation, which came after start.
		if since := a.at.Sub(start); since < time.Duration(i+1)*(stagger-time.Millisecond) {
			t.Errorf("newcomer %d served %v after the first conversation, before %d staggers", i+1, since, i+1)
		}
	}
	st := f.status(t)
	if lc := st.LoadControl; lc.Queued != engaged.Queued+2 || lc.Forced != 0 || st.Replicas[0].Residents != 3 {
		t.Errorf("load_control %+v, %d residents; want the two newcomers queued, all three resident", lc, st.Replicas[0].Residents)
	}
}

// Two people share one replica through Caddy: while a resident runs, one
// person's three turns wait, then the other's one; once the resident
// leaves, the queue takes the people in turn (a1, b1, a2, a3), not in the
// order they came, whether their API keys tell them apart or the
// flow_header a Caddyfile names does (there over the keys, which then
// cross). The admin JSON and the metrics count each flow under its hashed
// ID, never in clear.
func TestLoadControlSharesTheQueueBetweenPeople(t *testing.T) {
	for _, c := range []struct {
		name, block string
		a, b        func(turn int) []string // a person's headers for a turn
		secrets     []string
	}{
		{"api keys", "load_control on",
			func(int) []string { return []string{"X-Api-Key", "key-a"} },
			func(int) []string { return []string{"Authorization", "Bearer key-b"} },
			[]string{"key-a", "key-b"}},
		{"flow_header", "load_control on {\n\t\t\t\tflow_header X-Team\n\t\t\t}",
			func(turn int) []string { return []string{"X-Team", "team-red", "X-Api-Key", fmt.Sprint("key-", turn)} },
			func(int) []string { return []string{"X-Team", "team-blue", "X-Api-Key", "key-1"} },
			[]string{"team-red", "team-blue", "key-1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			backend := startFakeVLLM(t, "a", 1)
			setup := loadControlSetup(map[string]any{"linger": "1s", "max_wait": "1m"})
			setup.modelBlock = "replicas {replicas}\n\t\t\t" + c.block
			f := startFleetWith(t, setup, backend)
			ctx, endResident := context.WithCancel(context.Background())
			defer endResident()
			resp, err := f.send(ctx, "resident", append(c.a(0), holdHeader, "1m", stopReasonHeader, "tool_use")...)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("the resident: %v, %v", resp, err)
			}
			defer resp.Body.Close()
			var answers []<-chan answer
			send := func(conv string, headers []string) {
				done := make(chan answer, 1)
				go func() {
					// Each turn ends its agent's task: its conversation
					// leaves as it ends, and the next turn is admitted.
					resp, err := f.send(context.Background(), conv, headers...)
					if err != nil {
						done <- answer{err: err}
						return
					}
					defer resp.Body.Close()
					_, err = io.Copy(io.Discard, resp.Body)
					done <- answer{status: resp.StatusCode, err: err}
				}()
				answers = append(answers, done)
				waitingIs(t, f, len(answers))
			}
			for turn := 1; turn <= 3; turn++ {
				send(fmt.Sprint("a", turn), c.a(turn))
			}
			send("b1", c.b(1))

			body := adminGet(t, f, "/warden/models/m")
			for _, secret := range c.secrets {
				if strings.Contains(body, secret) {
					t.Errorf("the admin JSON shows %q", secret)
				}
			}
			flows := f.status(t).LoadControl.Flows
			if len(flows) != 2 || flows[0].Waiting != 1 || flows[1].Waiting != 3 || flows[1].Admitted != 1 ||
				len(flows[0].Flow) != 16 || len(flows[1].Flow) != 16 || flows[0].Flow == flows[1].Flow {
				t.Fatalf("flows %+v, want b's with 1 waiting, then a's with 3 waiting and the resident admitted, each by a 16-digit ID", flows)
			}

			endResident() // it lingers 1 s, then the queue moves
			for _, done := range answers {
				if a := <-done; a.err != nil || a.status != http.StatusOK {
					t.Fatalf("a queued turn: %+v", a)
				}
			}
			if got, want := seenInOrder(backend), []string{"resident", "a1", "b1", "a2", "a3"}; !slices.Equal(got, want) {
				t.Errorf("the replica saw %v, want %v", got, want)
			}
			lc := f.status(t).LoadControl
			byID := map[string]panel.FlowStatus{}
			for _, fl := range lc.Flows {
				byID[fl.Flow] = fl
			}
			a, b := byID[flows[1].Flow], byID[flows[0].Flow]
			if a.Admitted != 4 || a.Queued != 3 || a.Waiting != 0 || a.WaitedSeconds <= 0 || b.Admitted != 1 || b.Queued != 1 || b.WaitedSeconds <= 0 {
				t.Errorf("after the queue emptied: a %+v, b %+v", a, b)
			}

			families := scrapeMetrics(t, f)
			checkMetricsDocumented(t, families, loadControlSeries)
			for _, m := range families["caddy_warden_load_control_flow_turns_total"].GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				fl, ok := byID[labels["flow"]]
				if labels["flow"] == "other" {
					fl, ok = lc.OtherFlows, true
				}
				want := map[string]uint64{"admitted": fl.Admitted, "queued": fl.Queued, "refused": fl.Refused}[labels["result"]]
				if !ok || m.GetCounter().GetValue() != float64(want) {
					t.Errorf("flow_turns_total%v = %v, the admin JSON's flows %+v", labels, m.GetCounter().GetValue(), lc.Flows)
				}
			}
		})
	}
}

// seenInOrder is the conversations of the requests b got, in order.
func seenInOrder(b *fakeVLLM) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, s := range b.seen {
		out = append(out, s.session)
	}
	return out
}

// A person's conversation that load control keeps beside a farm has its
// cache refreshed while it is idle: its last request goes again to its
// replica, for one token and no stream, with the person's credential. The
// farm's conversations get no refresh.
func TestLoadControlRefreshesAPersonsKeptConversation(t *testing.T) {
	backends := []*fakeVLLM{startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1)}
	f := startFleetWith(t, loadControlSetup(map[string]any{"capacity_tokens": 120, "linger": "1s", "max_wait": "1m"}), backends...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Two farm turns of 400 bytes (100 tokens by the default 4 bytes per
	// token) hold both replicas; the person's turn lacks room and waits
	// until one of them ends.
	large := strings.Repeat("x", 400)
	farm := func(ctx context.Context, conv string) <-chan answer {
		out := make(chan answer, 1)
		go func() {
			resp, err := f.sendSaying(ctx, conv, large, "X-Api-Key", "key-farm", holdHeader, "1m", stopReasonHeader, "tool_use")
			if err != nil {
				out <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			_, err = io.Copy(io.Discard, resp.Body)
			out <- answer{status: resp.StatusCode, err: err}
		}()
		return out
	}
	farm1 := farm(ctx, "farm-1")
	testrun.Eventually(t, 10*time.Second, "farm-1 resident", func() bool { return residents(f.status(t)) == 1 })
	ctx2, end2 := context.WithCancel(ctx)
	farm2 := farm(ctx2, "farm-2")
	testrun.Eventually(t, 10*time.Second, "farm-2 resident", func() bool { return residents(f.status(t)) == 2 })
	person := make(chan answer, 1)
	go func() {
		resp, err := f.sendSaying(context.Background(), "person", "the person's prompt", "X-Api-Key", "key-person", stopReasonHeader, "end_turn")
		if err != nil {
			person <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		person <- answer{status: resp.StatusCode, backend: resp.Header.Get("X-Backend"), err: err}
	}()
	waitingIs(t, f, 1)
	end2()
	<-farm2
	got := <-person
	if got.err != nil || got.status != http.StatusOK {
		t.Fatalf("the person's turn: %+v", got)
	}

	// refreshes counts the refreshes a replica got with apiKey, all saying
	// the person's prompt.
	refreshes := func(b *fakeVLLM, apiKey string) int {
		b.mu.Lock()
		defer b.mu.Unlock()
		n := 0
		for _, s := range b.seen {
			if s.oneToken && s.apiKey == apiKey {
				if s.said != "the person's prompt" {
					t.Errorf("%s: a refresh saying %q", b.name, s.said)
				}
				n++
			}
		}
		return n
	}
	home := backends[0]
	if got.backend == "b/0" {
		home = backends[1]
	}
	testrun.Eventually(t, 10*time.Second, "two refreshes of the person's conversation on its replica", func() bool {
		return refreshes(home, "key-person") >= 2
	})
	for _, b := range backends {
		if n := refreshes(b, "key-farm"); n > 0 {
			t.Errorf("%s: %d refreshes of the farm's conversations, want none", b.name, n)
		}
		if n := refreshes(b, "key-person"); b != home && n > 0 {
			t.Errorf("%s: %d refreshes of the person's conversation away from its replica", b.name, n)
		}
	}
	cancel()
	<-farm1
}
