package e2e

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/lmwarden/caddy-warden/metricsfeed"
)

// busySampler counts, at every (simulated) second, the engines with
// requests running or waiting: the seed's "replicas busy".
type busySampler struct {
	sims     []*Sim
	interval time.Duration

	mu      sync.Mutex
	samples int
	busy    int
}

func newBusySampler(sims []*Sim, interval time.Duration) *busySampler {
	return &busySampler{sims: sims, interval: interval}
}

func (b *busySampler) run(ctx context.Context) {
	tick := time.NewTicker(b.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			b.sample(ctx)
		}
	}
}

func (b *busySampler) sample(ctx context.Context) {
	busy := 0
	for _, s := range b.sims {
		c, cancel := context.WithTimeout(ctx, b.interval)
		sc, err := metricsfeed.Fetch(c, http.DefaultClient, metricsfeed.MetricsURL(s.Addr), metricsfeed.DefaultMaxBytes)
		cancel()
		if err != nil {
			return // a sample cut by the end of the level
		}
		for _, e := range sc.Engines {
			if e.Running+e.Waiting > 0 {
				busy++
			}
		}
	}
	b.mu.Lock()
	b.samples++
	b.busy += busy
	b.mu.Unlock()
}

// mean is the average number of busy engines per sample.
func (b *busySampler) mean() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.samples == 0 {
		return 0
	}
	return float64(b.busy) / float64(b.samples)
}
