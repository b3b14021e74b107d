package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/lab"
)

// Two people through Caddy with load control on: each person's agents send
// its own API key, each gets its row, and load control counts their turns
// in two flows.
func TestRunPeople(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Caddy and the simulator")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	w := agentload.DefaultConfig()
	w.Turns = 4
	people := []lab.Person{{Name: "farm", Sessions: 4}, {Name: "person", Sessions: 1, ThinkTime: 5 * time.Second}}
	dir := t.TempDir()
	rows, err := Run(ctx, Options{
		Topology:   TopologyServers,
		Replicas:   2,
		MaxNumSeqs: 32,
		Sessions:   []int{lab.Sessions(people)},
		People:     people,
		Warmup:     10 * time.Second,
		Duration:   40 * time.Second,
		BlockSize:  16,
		TimeScale:  10,
		Policies:   []string{"warden-admission"},
		Seed:       1,
		Workload:   w,
		WorkDir:    dir,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(people) {
		t.Fatalf("%d rows, want one per person", len(rows))
	}
	for i, r := range rows {
		t.Logf("%+v", r)
		p := people[i]
		if r.Person != p.Name || r.Sessions != p.Sessions || r.ThinkTimeS != p.ThinkTime.Seconds() {
			t.Errorf("row %d: person %q with %d sessions and %gs think time, want %+v", i, r.Person, r.Sessions, r.ThinkTimeS, p)
		}
		if r.Requests == 0 || r.Errors != 0 || r.OutputTokensPerMin <= 0 || r.TTFBP50S <= 0 {
			t.Errorf("%s: implausible row %+v", r.Person, r)
		}
	}
	if rows[0].Requests <= rows[1].Requests {
		t.Errorf("the farm's 4 agents without pauses sent %d requests, the person's one conversation %d", rows[0].Requests, rows[1].Requests)
	}
	lc := adminStatus(t, filepath.Join(dir, "admin-warden-admission-5.json")).LoadControl
	if len(lc.Flows) != 2 {
		t.Fatalf("load control counted %d flows, want one per person's key: %+v", len(lc.Flows), lc.Flows)
	}
	for _, f := range lc.Flows {
		if f.Admitted == 0 || len(f.Flow) != 16 {
			t.Errorf("flow %+v: want turns admitted under a hashed id", f)
		}
	}
}

// Two models behind one Caddy site: the main turns reach the model's
// replicas and the side calls the small model's, each served by its own
// (the simulators answer only their own model's name, and count what
// they finish), each model with its row and its own pins.
func TestRunTwoModels(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Caddy and the simulator")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	w := agentload.DefaultConfig()
	w.Turns, w.SmallModel, w.SideCallEvery = 4, "qwen3-0.6b", 1
	const sessions = 3
	dir := t.TempDir()
	rows, err := Run(ctx, Options{
		Topology:      TopologyServers,
		Replicas:      2,
		SmallReplicas: 2,
		MaxNumSeqs:    32,
		Sessions:      []int{sessions},
		Warmup:        10 * time.Second,
		Duration:      40 * time.Second,
		BlockSize:     16,
		TimeScale:     10,
		Policies:      []string{"warden"},
		Seed:          1,
		Workload:      w,
		WorkDir:       dir,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Model != w.Model || rows[1].Model != w.SmallModel {
		t.Fatalf("rows %+v, want one for %s then one for %s", rows, w.Model, w.SmallModel)
	}
	for _, r := range rows {
		t.Logf("%+v", r)
		// A request sent to the other model's replicas fails: they serve
		// only their own name.
		if r.Requests == 0 || r.Errors != 0 || r.OutputTokensPerMin <= 0 || r.TTFBP50S <= 0 || r.Replicas != 2 {
			t.Errorf("%s: implausible row %+v", r.Model, r)
		}
		// The replicas' own count of what they finished in the window is
		// the model's requests that ended in it, but for those under way
		// as it opened (at most one per session).
		if served := r.ReplicaRequests; served > r.Requests || served < r.Requests-sessions {
			t.Errorf("%s: its replicas finished %d requests in the window, its clients saw %d end", r.Model, served, r.Requests)
		}
		if r.PrefixHitPercent <= 0 || r.PrefixHitPercent > r.HitBoundPercent+1 {
			t.Errorf("%s: hits %.1f%%, bound %.1f%%", r.Model, r.PrefixHitPercent, r.HitBoundPercent)
		}
		if r.StayedPercent != 100 {
			t.Errorf("%s: stayed %.1f%%, want each conversation on its replica", r.Model, r.StayedPercent)
		}
	}
	if rows[1].Requests < rows[0].Requests-sessions || rows[1].Requests > rows[0].Requests+sessions {
		t.Errorf("%d side calls beside %d turns, want one beside each", rows[1].Requests, rows[0].Requests)
	}
	for _, path := range []string{"admin-warden-3.json", "admin-warden-3-small.json"} {
		for _, rep := range adminStatus(t, filepath.Join(dir, path)).Replicas {
			if rep.Placed+rep.Sticky == 0 {
				t.Errorf("%s: replica %s routed nothing: %+v", path, rep.Address, rep)
			}
		}
	}
}
