package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/lab"
	"github.com/lmwarden/caddy-warden/internal/redisproc"
	"github.com/lmwarden/caddy-warden/loadcontrol"
	"github.com/lmwarden/caddy-warden/panel"
)

// A short run through the whole real path: vllmsim processes, Caddy from
// cmd/caddy, the agent workload over HTTP, a policy switch with fresh
// replicas (so that each series starts cold and its hits stay under the
// level's own bound). The farm preset the run configures with
// `load_control farm` is the lab's.
func TestShortRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Caddy and the simulator")
	}
	w := agentload.DefaultConfig()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rows, err := Run(ctx, Options{
		Topology:   TopologyServers,
		Replicas:   2,
		MaxNumSeqs: 32,
		Sessions:   []int{2},
		Warmup:     20 * time.Second,
		Duration:   40 * time.Second,
		BlockSize:  16,
		TimeScale:  10,
		Policies:   []string{"off", "warden", lab.PolicyWardenEvents, lab.PolicyAdmissionFarm},
		Seed:       1,
		Workload:   w,
		WorkDir:    dir,
		Fresh:      true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 4", len(rows))
	}
	for _, r := range rows {
		t.Logf("%+v", r)
		// Each session gets at most 256 tokens per turn: a rate in simulated
		// time stays under 2 sessions x 256 tokens per TTFB-free turn.
		if r.Requests == 0 || r.Errors != 0 || r.OutputTokensPerMin <= 0 || r.OutputTokensPerMin > 60*2*256 || r.TTFBP50S <= 0 {
			t.Errorf("%s: implausible row %+v", r.Policy, r)
		}
		if r.PrefixHitPercent <= 0 || r.PrefixHitPercent > r.HitBoundPercent+1 || r.HitBoundPercent > 100 || r.ReplicasBusy <= 0 || r.ReplicasBusy > 2 {
			t.Errorf("%s: hits %.1f%% (bound %.1f%%), busy %.2f", r.Policy, r.PrefixHitPercent, r.HitBoundPercent, r.ReplicasBusy)
		}
	}
	if rows[1].StayedPercent != 100 {
		t.Errorf("warden: stayed %.1f%% with 2 sessions on 2 replicas", rows[1].StayedPercent)
	}
	admin := func(policy string) panel.ModelStatus {
		return adminStatus(t, filepath.Join(dir, "admin-"+policy+"-2.json"))
	}
	// The product's farm preset, stagger scaled, as the lab runs it.
	farm := admin(lab.PolicyAdmissionFarm).LoadControl
	if !farm.Enabled || farm.Quantum != -1 || farm.StaggerSeconds != lab.FarmStagger.Seconds()/10 || farm.FillMin != lab.FarmFillMin ||
		farm.FillMax != lab.FarmFillMax || !farm.Touch || farm.Fill != loadcontrol.DefaultFill {
		t.Errorf("load_control farm: %+v; want the lab's farm preset (quantum -1, stagger %v/10, fill %g in %g-%g, touch)",
			farm, lab.FarmStagger, loadcontrol.DefaultFill, lab.FarmFillMin, lab.FarmFillMax)
	}
	// warden-events follows each replica's KV cache events, and finds the
	// chains of the turns in them.
	status := admin(lab.PolicyWardenEvents)
	for _, r := range status.Replicas {
		t.Logf("replica %s: KV cache events %+v", r.ID, r.KVEvents)
		// A handful of turns a replica, of which the one cut when the load
		// stops ends without usage: most chains are found, not all.
		if ev := r.KVEvents; ev == nil || ev.Batches == 0 || ev.Blocks == 0 || ev.Garbage != 0 || ev.ChainsFound <= ev.ChainsMissed {
			t.Errorf("replica %s: KV cache events %+v, want batches and blocks followed, no garbage, more chains found than missed", r.ID, ev)
		}
	}
}

// Three Caddy instances behind a random front, sharing pins through Redis:
// whichever instance a turn reaches, it goes to its conversation's replica.
func TestInstancesShareRedisPins(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Caddy, Redis and the simulator")
	}
	redisproc.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := agentload.DefaultConfig()
	w.Turns = 4
	dir := t.TempDir()
	rows, err := Run(ctx, Options{
		Topology:   TopologyServers,
		Replicas:   3,
		MaxNumSeqs: 32,
		Sessions:   []int{4},
		Warmup:     20 * time.Second,
		Duration:   60 * time.Second,
		BlockSize:  16,
		TimeScale:  10,
		Policies:   []string{"warden"},
		Seed:       1,
		Workload:   w,
		WorkDir:    dir,
		Instances:  3,
		PinStore:   PinStoreRedis,
	})
	if err != nil {
		t.Fatal(err)
	}
	r := rows[0]
	t.Logf("%+v", r)
	if r.Instances != 3 || r.PinStore != PinStoreRedis {
		t.Errorf("row setup %d %q", r.Instances, r.PinStore)
	}
	if r.Requests < 10 || r.Errors != 0 {
		t.Errorf("%d requests, %d errors", r.Requests, r.Errors)
	}
	// A turn may move for load, and one instance's move is the others' pin
	// too: every turn served elsewhere than its conversation's previous turn
	// is a move some instance made. An instance that lost track of a
	// conversation would place it anew instead.
	moves := 0
	for i := range 3 {
		for _, rep := range adminStatus(t, filepath.Join(dir, fmt.Sprintf("admin-warden-x3-redis-4-i%d.json", i))).Replicas {
			moves += int(rep.SpilledIn + rep.Rehomed + rep.Replaced + rep.Compacted)
		}
	}
	if r.TurnsChangedReplica > moves {
		t.Errorf("%d turns served elsewhere than their conversation's previous turn, %d moves: instances lost track of conversations", r.TurnsChangedReplica, moves)
	}
	t.Logf("%.1f%% of turns on their conversation's first replica; %d changes, %d moves", r.TurnsOnReplicaPercent, r.TurnsChangedReplica, moves)
}

// adminStatus reads a model's admin JSON that a run saved.
func adminStatus(t *testing.T, path string) panel.ModelStatus {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var status panel.ModelStatus
	if err := json.Unmarshal(raw, &status); err != nil {
		t.Fatal(err)
	}
	return status
}
