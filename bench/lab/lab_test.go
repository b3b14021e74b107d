package lab

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/bench/report"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
)

func shortConfig() Config {
	cfg := DefaultConfig()
	cfg.Duration = 20 * time.Second
	return cfg
}

// freshPolicy is policy name on a fresh fleet, with its environment, not
// yet run.
func freshPolicy(t *testing.T, cfg Config, name string, seed int64) (*Env, Policy) {
	t.Helper()
	f, err := newFleet(cfg)
	if err != nil {
		t.Fatal(err)
	}
	env := newEnv(cfg, f, seed)
	policy, err := policyFactories[name](env)
	if err != nil {
		t.Fatal(err)
	}
	return env, policy
}

// runFresh runs policy name at a level on a fresh fleet and returns the
// policy with the run's outcome.
func runFresh(t *testing.T, cfg Config, name string, sessions int, seed int64) (Policy, *outcome) {
	t.Helper()
	env, policy := freshPolicy(t, cfg, name, seed)
	out, err := simulate(env, policy, sessions, seed)
	if err != nil {
		t.Fatal(err)
	}
	return policy, out
}

func TestSweepIsDeterministicWhateverTheWorkers(t *testing.T) {
	plan := Plan{Policies: []string{PolicyWarden, PolicyVLLM, PolicyLeastConn}, Levels: []int{2, 6}, Seeds: []int64{1, 2}}
	calls := 0
	serial, err := Sweep(shortConfig(), plan, 1, func() { calls++ })
	if err != nil {
		t.Fatal(err)
	}
	if calls != plan.Runs() || len(serial) != plan.Runs() {
		t.Fatalf("%d progress calls and %d rows, want %d", calls, len(serial), plan.Runs())
	}
	parallel, err := Sweep(shortConfig(), plan, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(serial, parallel) {
		t.Fatalf("rows differ between 1 and 3 workers:\n%+v\n%+v", serial, parallel)
	}
	i := 0
	for _, seed := range plan.Seeds {
		for _, p := range plan.Policies {
			for _, l := range plan.Levels {
				if r := serial[i]; r.Seed != seed || r.Policy != p || r.Sessions != l || r.Mode != "lab" {
					t.Fatalf("row %d is %s/%d/seed %d, want %s/%d/seed %d", i, r.Policy, r.Sessions, r.Seed, p, l, seed)
				}
				i++
			}
		}
	}
	if reflect.DeepEqual(serial[0], serial[len(plan.Policies)*len(plan.Levels)]) {
		t.Fatal("seeds 1 and 2 gave the same row: the seed does not reach the workload")
	}
}

// TestShortRunsAccountForEveryRequest checks invariants of every policy at a
// light and a heavy level: each request has one result, the engines' counters
// of the measured window agree with the results that end in it, and no
// policy beats the hit bound.
func TestShortRunsAccountForEveryRequest(t *testing.T) {
	cfg := shortConfig()
	for _, name := range PolicyNames() {
		for _, sessions := range []int{2, 12} {
			_, out := runFresh(t, cfg, name, sessions, 7)
			s, sum, row := out.sim, out.models[0].summary, out.row(name, 0)
			delta := func(f func(engine.Stats) uint64) uint64 { return f(out.models[0].after) - f(out.models[0].before) }
			queries := delta(func(s engine.Stats) uint64 { return s.PrefixCacheQueries })
			hits := delta(func(s engine.Stats) uint64 { return s.PrefixCacheHits })
			served := delta(func(s engine.Stats) uint64 {
				return s.RequestSuccess[engine.FinishStop] + s.RequestSuccess[engine.FinishLength]
			})
			aborted := delta(func(s engine.Stats) uint64 { return s.RequestSuccess[engine.FinishAbort] })
			generated := delta(func(s engine.Stats) uint64 { return s.GenerationTokens })

			// The requests in flight at the window's end count in it as cut.
			inWindow := len(s.windowCut)
			for _, r := range s.results {
				if !r.End.Before(virtualTime(s.measured)) && !r.End.After(virtualTime(s.end)) {
					inWindow++
				}
			}
			where := fmt.Sprintf("%s at %d sessions", name, sessions)
			switch {
			case s.routed == 0 || len(s.results) != s.routed || sum.Requests != inWindow || inWindow == s.routed:
				t.Errorf("%s: %d routed, %d results, %d in the window, %d summarized", where, s.routed, len(s.results), inWindow, sum.Requests)
			case sum.Errors != 0 || sum.Cut > sessions:
				t.Errorf("%s: %d errors, %d cut with %d slots", where, sum.Errors, sum.Cut, sessions)
			case served < uint64(sum.Succeeded) || served > uint64(sum.Succeeded+sum.Cut) || aborted > uint64(sum.Cut):
				t.Errorf("%s: engines served %d and aborted %d; clients saw %d succeed and %d cut", where, served, aborted, sum.Succeeded, sum.Cut)
			case uint64(sum.OutputTokens) > generated:
				t.Errorf("%s: clients received %d tokens, engines generated %d", where, sum.OutputTokens, generated)
			case s.boundQueries[0] != queries:
				t.Errorf("%s: the bound covers %d prompt tokens, the engines counted %d", where, s.boundQueries[0], queries)
			case hits > s.boundHits[0] || row.PrefixHitPercent > row.HitBoundPercent:
				t.Errorf("%s: %d hits (%.1f%%) beat the bound %d (%.1f%%)", where, hits, row.PrefixHitPercent, s.boundHits[0], row.HitBoundPercent)
			case row.ReplicasBusy <= 0 || row.ReplicasBusy > float64(cfg.Replicas):
				t.Errorf("%s: %.2f replicas busy of %d", where, row.ReplicasBusy, cfg.Replicas)
			case row.TTFBP50S <= 0 || row.TTFBP50S > row.TTFBP95S || row.OutputTokensPerMin <= 0:
				t.Errorf("%s: TTFB p50 %.3fs p95 %.3fs, %.0f tokens/min", where, row.TTFBP50S, row.TTFBP95S, row.OutputTokensPerMin)
			}
			// Hashing and pinning below the spill threshold never move a conversation.
			if (name == PolicyHeader || name == PolicyWarden && sessions <= cfg.Replicas) && row.StayedPercent != 100 {
				t.Errorf("%s: stayed %.1f%%, want 100", where, row.StayedPercent)
			}
		}
	}
}

func TestWarmFleetKeepsCachesAcrossLevels(t *testing.T) {
	plan := Plan{Policies: []string{PolicyWarden}, Levels: []int{3, 3}, Seeds: []int64{5}}
	cfg := shortConfig()
	fresh, err := Sweep(cfg, plan, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fresh[0], fresh[1]) {
		t.Fatalf("two fresh runs of the same level and seed differ:\n%+v\n%+v", fresh[0], fresh[1])
	}
	cfg.Warm = true
	warm, err := Sweep(cfg, plan, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(warm[0], fresh[0]) {
		t.Fatalf("a warm fleet's first run must equal a fresh run:\n%+v\n%+v", warm[0], fresh[0])
	}
	// The second run replays the same sessions: their first turns now hit.
	if warm[1].PrefixHitPercent <= fresh[1].PrefixHitPercent+5 {
		t.Fatalf("warm second run hits %.1f%%, fresh %.1f%%: the cache did not carry over",
			warm[1].PrefixHitPercent, fresh[1].PrefixHitPercent)
	}
}

// TestSeedShape runs the seed's parameters at three levels and checks the
// parts of the seed's shape the lab reproduces (see the package's report for
// the 4-session vllm case, which it does not).
func TestSeedShape(t *testing.T) {
	plan := Plan{Policies: []string{PolicyWarden, PolicyVLLM}, Levels: []int{4, 8, 32}, Seeds: []int64{1}}
	rows, err := Sweep(DefaultConfig(), plan, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	at := map[string]map[int]float64{}
	p50 := map[string]map[int]float64{}
	for _, r := range rows {
		if at[r.Policy] == nil {
			at[r.Policy], p50[r.Policy] = map[int]float64{}, map[int]float64{}
		}
		at[r.Policy][r.Sessions], p50[r.Policy][r.Sessions] = r.PrefixHitPercent, r.TTFBP50S
	}
	for _, level := range []int{4, 8} {
		if h := at[PolicyWarden][level]; h < 80 {
			t.Errorf("warden at %d sessions: %.1f%% hits, want >= 80", level, h)
		}
	}
	if h := at[PolicyVLLM][8]; h > 60 {
		t.Errorf("vllm at 8 sessions: %.1f%% hits, want <= 60", h)
	}
	if w, v := p50[PolicyWarden][8], p50[PolicyVLLM][8]; w >= v/2 {
		t.Errorf("TTFB p50 at 8 sessions: warden %.2fs, vllm %.2fs; want under half", w, v)
	}
	if d := at[PolicyWarden][32] - at[PolicyVLLM][32]; d > 10 || d < -10 {
		t.Errorf("at 32 sessions warden and vllm hit %.1f%% and %.1f%%, want within 10 points", at[PolicyWarden][32], at[PolicyVLLM][32])
	}
}

func TestConfigAndPlanErrors(t *testing.T) {
	bad := DefaultConfig()
	bad.Replicas = 0
	if _, err := Run(bad, PolicyWarden, 4, 1); err == nil {
		t.Error("accepted zero replicas")
	}
	if _, err := Run(DefaultConfig(), "random", 4, 1); err == nil {
		t.Error("accepted an unknown policy")
	}
	if _, err := Run(DefaultConfig(), PolicyWarden, 0, 1); err == nil {
		t.Error("accepted zero sessions")
	}
}

// TestWarmupStaggersSessions checks that the warm-up is run but not measured:
// without it every session of an overloaded level starts at the window's
// start and hardly any finishes in three minutes; after it sessions end all
// along, many times more of them.
func TestWarmupStaggersSessions(t *testing.T) {
	cfg := DefaultConfig()
	cold := cfg
	cold.Warmup = 0
	without, err := Run(cold, PolicyWarden, 32, 1)
	if err != nil {
		t.Fatal(err)
	}
	with, err := Run(cfg, PolicyWarden, 32, 1)
	if err != nil {
		t.Fatal(err)
	}
	if with.DurationS != cfg.Duration.Seconds() || without.DurationS != cfg.Duration.Seconds() {
		t.Fatalf("measured %gs and %gs, want %gs for both", with.DurationS, without.DurationS, cfg.Duration.Seconds())
	}
	if without.SessionsCompleted > 2 || with.SessionsCompleted < 8*max(1, without.SessionsCompleted) {
		t.Fatalf("sessions completed: %d without warm-up (want at most 2), %d with (want 8 times as many)", without.SessionsCompleted, with.SessionsCompleted)
	}
}

// TestMidConversationStartsEndConversationsAtOnce checks that sessions
// started mid-conversation are out of step from the start: with no warm-up,
// conversations end all along the window, where started at their first turn
// hardly any does.
func TestMidConversationStartsEndConversationsAtOnce(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Warmup = 0
	inStep, err := Run(cfg, PolicyWarden, 32, 1)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MidConversation = true
	mid, err := Run(cfg, PolicyWarden, 32, 1)
	if err != nil {
		t.Fatal(err)
	}
	if inStep.SessionsCompleted > 2 || mid.SessionsCompleted < 8*max(1, inStep.SessionsCompleted) {
		t.Fatalf("sessions completed without warm-up: %d started at their first turn (want at most 2), %d mid-conversation (want 8 times as many)", inStep.SessionsCompleted, mid.SessionsCompleted)
	}
}

// TestConversationTimes checks the time per conversation of a short run:
// every conversation sent in the window is timed to its end, past the
// window if need be; p50 <= p95, and both are at least the sums of the
// conversations' turn times (send to last token), since a conversation
// lasts at least as long as its turns. Shortening the tail cuts some of
// them and changes no other column.
func TestConversationTimes(t *testing.T) {
	run := func(tail time.Duration) *outcome {
		t.Helper()
		cfg := shortConfig()
		cfg.ConversationTail = tail
		_, out := runFresh(t, cfg, PolicyWarden, 6, 3)
		return out
	}
	out := run(DefaultConversationTail)
	row := out.row(PolicyWarden, 0)

	// Each conversation sent in the window: its end and the sum of its turn times.
	from, to := virtualTime(out.sim.measured), virtualTime(out.sim.end)
	type conversation struct {
		sent     bool
		finished time.Time
		turns    time.Duration
	}
	bySession := map[string]*conversation{}
	for _, r := range out.sim.results {
		c := bySession[r.SessionID]
		if c == nil {
			c = &conversation{}
			bySession[r.SessionID] = c
		}
		c.sent = c.sent || r.Turn == 0 && !r.Start.Before(from) && !r.Start.After(to)
		if r.SessionDone() {
			c.finished = r.End
		}
		c.turns += r.End.Sub(r.Start)
	}
	var sums []float64
	finishedAfterWindow := 0
	for id, c := range bySession {
		switch {
		case !c.sent:
			continue
		case c.finished.IsZero():
			t.Errorf("conversation %s, sent in the window, never finished", id)
		case c.finished.After(to):
			finishedAfterWindow++
		}
		sums = append(sums, c.turns.Seconds())
	}
	if finishedAfterWindow == 0 {
		t.Fatal("no conversation sent in the window finished after it: the tail went untested")
	}
	if row.ConversationsTimed != len(sums) || row.ConversationsCut != 0 {
		t.Fatalf("%d conversations timed and %d cut, want %d and 0", row.ConversationsTimed, row.ConversationsCut, len(sums))
	}
	if row.ConversationP50S <= 0 || row.ConversationP50S > row.ConversationP95S {
		t.Fatalf("conversation p50 %.2fs, p95 %.2fs", row.ConversationP50S, row.ConversationP95S)
	}
	// Nearest rank, as the histogram: if every conversation lasts at least
	// its sum, each order statistic does too.
	slices.Sort(sums)
	nearestRank := func(q float64) float64 { return sums[max(int(math.Floor(q*float64(len(sums))+0.5)), 1)-1] }
	if p50 := nearestRank(0.5); row.ConversationP50S < p50 {
		t.Errorf("conversation p50 %.2fs, below the median of the conversations' sums of turn times, %.2fs", row.ConversationP50S, p50)
	}
	if p95 := nearestRank(0.95); row.ConversationP95S < p95 {
		t.Errorf("conversation p95 %.2fs, below the p95 of the conversations' sums of turn times, %.2fs", row.ConversationP95S, p95)
	}
	t.Logf("%d conversations timed, %d finished after the %gs window: p50 %.1fs, p95 %.1fs, mean %.1fs; sums of turn times p50 %.1fs, p95 %.1fs",
		row.ConversationsTimed, finishedAfterWindow, row.DurationS, row.ConversationP50S, row.ConversationP95S, row.ConversationMeanS,
		nearestRank(0.5), nearestRank(0.95))

	withoutConversations := func(r report.Row) report.Row {
		r.ConversationP50S, r.ConversationP95S, r.ConversationMeanS = 0, 0, 0
		r.ConversationsTimed, r.ConversationsCut = 0, 0
		return r
	}
	for _, tail := range []time.Duration{0, 5 * time.Second} {
		short := run(tail).row(PolicyWarden, 0)
		if short.ConversationsCut == 0 || short.ConversationsTimed+short.ConversationsCut != row.ConversationsTimed {
			t.Errorf("tail %v: %d conversations timed and %d cut, want some cut of %d", tail, short.ConversationsTimed, short.ConversationsCut, row.ConversationsTimed)
		}
		if !reflect.DeepEqual(withoutConversations(short), withoutConversations(row)) {
			t.Errorf("tail %v changed more than the conversation times:\n%+v\n%+v", tail, short, row)
		}
	}
}

// With a host tier of four times a GPU cache the conversations overflow,
// the rows count the prompt tokens loaded from it beside the GPU's hits,
// within the bound of one unlimited cache; without a tier nothing changes.
func TestHostTierHitsAreCountedApart(t *testing.T) {
	cfg := shortConfig()
	cfg.Profile.NumGPUBlocks, cfg.Profile.MaxModelLen = 1100, 16384
	plain, err := Run(cfg, PolicyRoundRobin, 8, 1)
	if err != nil {
		t.Fatal(err)
	}
	cfg.HostTierTimesGPU = 4
	tiered, err := Run(cfg, PolicyRoundRobin, 8, 1)
	if err != nil {
		t.Fatal(err)
	}
	if plain.HostTierGiB != 0 || plain.HostHitPercent != 0 {
		t.Errorf("without a tier: %g GiB, %.1f%% host hits", plain.HostTierGiB, plain.HostHitPercent)
	}
	if want := 4 * cfg.Profile.KVCacheGiB(); tiered.HostTierGiB != want {
		t.Errorf("a tier of %g GiB, want %g", tiered.HostTierGiB, want)
	}
	if tiered.HostHitPercent <= 0 || tiered.PrefixHitPercent+tiered.HostHitPercent > tiered.HitBoundPercent {
		t.Errorf("with a tier: %.1f%% GPU hits and %.1f%% host hits against a bound of %.1f%%",
			tiered.PrefixHitPercent, tiered.HostHitPercent, tiered.HitBoundPercent)
	}
	if tiered.PrefixHitPercent+tiered.HostHitPercent <= plain.PrefixHitPercent {
		t.Errorf("the tier served nothing more: %.1f%% + %.1f%% with it, %.1f%% without",
			tiered.PrefixHitPercent, tiered.HostHitPercent, plain.PrefixHitPercent)
	}
	cfg.HostTierTimesGPU = -1
	if _, err := Run(cfg, PolicyRoundRobin, 8, 1); err == nil {
		t.Error("accepted a negative host tier")
	}
}

// A tier given as a multiple of the GPU KV cache is the same tier given in
// GiB, for the engines and for warden, which reads the tier's counters when
// the profile has one.
func TestHostTierTimesGPUIsTheSameTierInGiB(t *testing.T) {
	cfg := shortConfig() // 24 sessions overflow its GPU caches, and warden counts on the tier
	plan := Plan{Policies: []string{PolicyWarden}, Levels: []int{24}, Seeds: []int64{1}}
	cfg.HostTierTimesGPU = 4
	times, err := Sweep(cfg, plan, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.HostTierTimesGPU, cfg.Profile.KVOffloadingSize = 0, 4*cfg.Profile.KVCacheGiB()
	gib, err := Sweep(cfg, plan, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(times, gib) {
		t.Errorf("4x the GPU KV cache:\n%+v\n%g GiB:\n%+v", times, cfg.Profile.KVOffloadingSize, gib)
	}
}
