package lab

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
)

// twoModelsConfig is a short run with a side call to the small model's 2
// engines beside every turn of the main model's 2.
func twoModelsConfig() Config {
	cfg := shortConfig()
	cfg.Replicas, cfg.SmallReplicas = 2, 2
	cfg.Workload.SmallModel, cfg.Workload.SideCallEvery = "qwen3-0.6b", 1
	return cfg
}

// With a small model, each model's requests reach only its own engines,
// routed by its own instance of the policy: the engines' counters of each
// model agree with its requests, each bound with its own, and the side
// calls go beside the turns.
func TestTwoModelsKeepToTheirEngines(t *testing.T) {
	cfg := twoModelsConfig()
	for _, name := range []string{PolicyWarden, PolicyAdmission, PolicyRoundRobin, PolicyVLLM} {
		f, err := newFleet(cfg)
		if err != nil {
			t.Fatal(err)
		}
		env := newEnv(cfg, f, 3)
		policy, policies, err := newModelsPolicy(env, name)
		if err != nil || len(policies) != 2 || policies[0] == policies[1] {
			t.Fatalf("%s: policies %v, %v", name, policies, err)
		}
		out, err := simulate(env, policy, 6, 3)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range out.sim.results {
			if want := map[bool]string{false: ":80", true: ":90"}[r.Side]; !strings.Contains(r.Engine, want) {
				t.Fatalf("%s: a request (side call %v) served by %s", name, r.Side, r.Engine)
			}
		}
		rows := out.rows(name, nil)
		for m, mo := range out.models {
			where := fmt.Sprintf("%s, model %q", name, mo.name)
			row, sum := rows[m][0], mo.summary
			delta := func(f func(engine.Stats) uint64) uint64 { return f(mo.after) - f(mo.before) }
			served := delta(func(s engine.Stats) uint64 {
				return s.RequestSuccess[engine.FinishStop] + s.RequestSuccess[engine.FinishLength]
			})
			queries := delta(func(s engine.Stats) uint64 { return s.PrefixCacheQueries })
			hits := delta(func(s engine.Stats) uint64 { return s.PrefixCacheHits })
			switch {
			case row.Model != cfg.models()[m] || row.Replicas != 2:
				t.Errorf("%s: row of model %q on %d replicas", where, row.Model, row.Replicas)
			case sum.Requests == 0 || sum.Errors != 0:
				t.Errorf("%s: %d requests, %d errors", where, sum.Requests, sum.Errors)
			case served < uint64(sum.Succeeded) || served > uint64(sum.Succeeded+sum.Cut):
				t.Errorf("%s: its engines served %d; its clients saw %d succeed and %d cut", where, served, sum.Succeeded, sum.Cut)
			case out.sim.boundQueries[m] != queries || hits > out.sim.boundHits[m]:
				t.Errorf("%s: bound over %d prompt tokens with %d hits, engines counted %d with %d", where, out.sim.boundQueries[m], out.sim.boundHits[m], queries, hits)
			case row.ReplicasBusy <= 0 || row.ReplicasBusy > 2:
				t.Errorf("%s: %.2f replicas busy of 2", where, row.ReplicasBusy)
			}
			if name == PolicyWarden {
				// Each model's router keeps its conversations: a turn may
				// move for load (spilled), none is placed anew.
				for outcome, n := range policies[m].(outcomeCounter).outcomes() {
					if outcome != "placed" && outcome != "sticky" && outcome != "spilled" {
						t.Errorf("%s: %d turns %s at 6 sessions on 2 replicas", where, n, outcome)
					}
				}
			}
		}
		if main, side := out.models[0].summary.Requests, out.models[1].summary.Requests; side < main-6 || side > main+6 {
			t.Errorf("%s: %d side calls beside %d turns, want one beside each", name, side, main)
		}
	}
}

// A sweep with a small model and people gives each person's row of each
// model, the main model's first, whatever the workers.
func TestTwoModelsSweepRows(t *testing.T) {
	cfg := twoModelsConfig()
	cfg.People = []Person{{"farm", 4, 0, 0}, {"person", 1, 0, 0}}
	plan := Plan{Policies: []string{PolicyAdmission}, Levels: []int{5}, Seeds: []int64{1}}
	rows, err := Sweep(cfg, plan, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"farm " + cfg.Workload.Model, "person " + cfg.Workload.Model, "farm qwen3-0.6b", "person qwen3-0.6b"}
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d", len(rows), len(want))
	}
	for i, r := range rows {
		if got := r.Person + " " + r.Model; got != want[i] || r.Requests == 0 {
			t.Errorf("row %d: %s with %d requests, want %s", i, got, r.Requests, want[i])
		}
	}
	cfg.Workload.SmallModel = ""
	if _, err := Sweep(cfg, plan, 1, nil); err == nil {
		t.Error("small replicas without a small model were accepted")
	}
	cfg.Workload, cfg.SmallReplicas = agentload.DefaultConfig(), 0
	if _, err := Sweep(cfg, plan, 1, nil); err != nil {
		t.Error(err)
	}
}
