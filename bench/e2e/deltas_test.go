package e2e

import (
	"testing"

	"github.com/lmwarden/caddy-warden/metricsfeed"
)

// A run's hits are the growth of the engines' counters over its window,
// summed over replicas, the host tier's beside the GPU's.
func TestCounterDeltasSumTheFleet(t *testing.T) {
	scrape := func(hits, host, queries float64) metricsfeed.Scrape {
		return metricsfeed.Scrape{Engines: []metricsfeed.EngineStats{{PrefixHits: hits, ExternalHits: host, PrefixQueries: queries, HostTierGiB: 22}}}
	}
	before := []metricsfeed.Scrape{scrape(100, 10, 1000), scrape(0, 0, 0)}
	after := []metricsfeed.Scrape{scrape(400, 210, 2000), scrape(300, 100, 1000)}
	d := counterDeltas(before, after)
	if d.hits != 600 || d.hostHits != 300 || d.queries != 2000 || d.hostTierGiB != 22 {
		t.Errorf("%+v, want 600 GPU and 300 host hits of 2000 queried, a 22 GiB tier", d)
	}
}
