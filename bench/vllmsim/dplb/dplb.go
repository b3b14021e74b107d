// Package dplb is vLLM's internal data-parallel load balancer: how one API server in front of
// `--data-parallel-size N` engines picks the engine for a request that names no rank
// (DPLBAsyncMPClient.get_core_engine_for_request), in the variants vLLM shipped in 2026.
//
// The balancer sees engine queues only through stats the engines publish via the DP
// coordinator, at most every StatsInterval, plus its own optimistic bumps between two
// publications. It has no clock: the caller publishes on its own clock, virtual or real.
package dplb

import (
	"fmt"
	"math"
	"time"
)

// StatsInterval is the most often the DP coordinator forwards engine stats to the API server.
const StatsInterval = 100 * time.Millisecond

// Mode selects the balancer variant.
type Mode string

const (
	// V026Dense is vLLM 0.26 serving a dense (non-MoE) model: score waiting*4+running, but
	// dense DP ranks published no queue stats before PR #49204, so the balancer only sees its
	// own bumps and rotates over the engines.
	V026Dense Mode = "v026-dense"
	// V026 is vLLM 0.26's scoring (waiting*4+running) fed with stats every 100 ms, as for
	// MoE models.
	V026 Mode = "v026"
	// V027 is the balancer after PRs #47420 and #49204: score
	// max(client_count*inflight, waiting+running) plus a KV-usage term for waiting requests,
	// stats published for dense models too, and a rotating start for ties.
	V027 Mode = "v027"
)

// Modes lists the variants, the default first.
var Modes = []Mode{V026Dense, V026, V027}

// ParseMode returns the Mode named s.
func ParseMode(s string) (Mode, error) {
	for _, m := range Modes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown DP balancer %q (want one of %v)", s, Modes)
}

// EngineLoad is what an engine publishes about itself.
type EngineLoad struct {
	Waiting int
	Running int
	KVUsage float64 // 0..1
}

// clientCount is the number of API servers sharing the engines; the simulator runs one.
const clientCount = 1

// Balancer picks engines for requests. It is not safe for concurrent use.
type Balancer struct {
	mode     Mode
	view     []EngineLoad // last published loads plus local bumps
	inflight []int        // requests sent to each engine and not finished
	start    int          // first engine examined (rotates in V027)
}

// New returns a balancer over engines engines that has seen no stats yet.
func New(mode Mode, engines int) (*Balancer, error) {
	if _, err := ParseMode(string(mode)); err != nil {
		return nil, err
	}
	if engines < 1 {
		return nil, fmt.Errorf("need at least one engine, got %d", engines)
	}
	return &Balancer{mode: mode, view: make([]EngineLoad, engines), inflight: make([]int, engines)}, nil
}

// PublishesStats reports whether engines publish their loads in this mode; when false,
// Publish has no effect and the caller need not call it.
func (b *Balancer) PublishesStats() bool { return b.mode != V026Dense }

// Publish replaces the balancer's view with loads published by the engines (one per engine,
// in rank order), dropping the local bumps made since the last publication.
func (b *Balancer) Publish(loads []EngineLoad) {
	if b.PublishesStats() {
		copy(b.view, loads)
	}
}

// Choose picks the engine for a request that names no rank and counts it in flight there.
func (b *Balancer) Choose() int {
	n := len(b.view)
	best, bestScore := 0, math.Inf(1)
	for i := range n {
		idx := (b.start + i) % n
		if score := b.score(idx); score < bestScore {
			best, bestScore = idx, score
		}
	}
	// Optimistic bump, so that requests arriving between two publications spread out.
	b.view[best].Waiting += clientCount
	if b.mode == V027 {
		b.start = (b.start + 1) % n
	}
	b.inflight[best]++
	return best
}

func (b *Balancer) score(idx int) float64 {
	load := b.view[idx]
	if b.mode != V027 {
		return float64(load.Waiting*4 + load.Running)
	}
	score := float64(max(clientCount*b.inflight[idx], load.Waiting+load.Running))
	if load.Waiting > 0 {
		// Ramps from 0 at <= 50% KV usage to 3x waiting at 100%.
		score += float64(load.Waiting) * 6 * max(0, load.KVUsage-0.5)
	}
	return score
}

// Pin counts a request that names its rank (X-data-parallel-rank) in flight on that engine.
func (b *Balancer) Pin(rank int) { b.inflight[rank]++ }

// Done records that a request sent to rank has finished.
func (b *Balancer) Done(rank int) { b.inflight[rank]-- }
