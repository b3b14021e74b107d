package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/lmwarden/caddy-warden/bench/lab"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
)

const midConversationUsage = "start each session's first conversation at a turn drawn at random, the turns before it filled in but not sent, as in a fleet that has been running"

// runLab is `wardenbench lab`: every policy at every level in virtual time.
func runLab(_ context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := newCommon(args)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("wardenbench lab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.register(fs)
	warm := fs.Bool("warm", false, "keep one fleet for every run of a seed (policies then levels, as the seed did) instead of a fresh fleet per run")
	workers := fs.Int("jobs", runtime.NumCPU(), "runs simulated in parallel (results do not depend on it)")
	tail := fs.Duration("conversation-tail", lab.DefaultConversationTail, "how long past the window the load goes on so that the conversations sent in it end and are timed")
	mid := fs.Bool("mid-conversation", false, midConversationUsage)
	bodyBytes := fs.Float64("body-bytes-per-token", 0, "request body bytes per prompt token as the proxy sees them (0: the simulator's 4); models a denser or looser tokenizer")
	var people peopleFlags
	people.register(fs)
	if err := parseAll(fs, args); err != nil {
		return err
	}
	cfg, err := c.labConfig()
	if err != nil {
		return err
	}
	cfg.Warm, cfg.BodyBytesPerToken, cfg.ConversationTail, cfg.MidConversation = *warm, *bodyBytes, *tail, *mid
	if cfg.People, err = people.people(c); err != nil {
		return err
	}
	cfg.OneFlow = !people.flows
	plan := lab.Plan{Policies: c.policies, Levels: c.levels, Seeds: c.seedList()}

	bar := newProgress(stderr, plan.Runs(), "lab")
	started := time.Now()
	rows, err := lab.Sweep(cfg, plan, *workers, func() { bar.Add(1) })
	bar.Finish()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "lab: %d replicas of %s%s, %v warm-up then %v measured per level (conversations sent in it timed to their end, up to %v past it), seeds %v, %s fleet per run\n\n",
		cfg.Replicas, cfg.Profile.Name, hostTierNote(cfg.EngineProfile()), cfg.Warmup, cfg.Duration, cfg.ConversationTail, plan.Seeds, map[bool]string{false: "fresh", true: "one warm"}[cfg.Warm])
	if err := present(c, rows, stdout); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "lab: %d runs in %.1fs\n", plan.Runs(), time.Since(started).Seconds())
	return nil
}

// labConfig is the lab's configuration from the common flags.
func (c *common) labConfig() (lab.Config, error) {
	if w := c.workload; w.NoSessionID || w.Subagents > 0 || w.CompactionEvery > 0 {
		// The lab keys each turn by its session and plays only a session's
		// main line: these modes need the real path.
		return lab.Config{}, fmt.Errorf("--no-session-id, --subagents and --compaction-every need wardenbench run")
	}
	cfg := lab.DefaultConfig()
	cfg.Workload, cfg.Profile, cfg.Replicas, cfg.Duration = c.workload, c.profile, c.replicas, c.duration
	cfg.HostTierTimesGPU, cfg.SmallReplicas = c.hostTierTimes, c.smallReplicas()
	cfg.HideCachedTokens = !c.cachedTokens
	cfg.MetricsInterval, cfg.SpillThreshold, cfg.Warmup = c.metricsIv, c.spill, c.warmup
	return cfg, nil
}

// hostTierNote describes the replicas' host tier for a run's heading, "" without one.
func hostTierNote(p engine.Profile) string {
	if !p.HostTier() {
		return ""
	}
	return fmt.Sprintf(" with a host KV tier of %.4g GiB each (%.3gx the GPU KV cache)", p.KVOffloadingSize, p.KVOffloadingSize/p.KVCacheGiB())
}
