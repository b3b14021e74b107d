package fleet

import (
	"time"

	"github.com/lmwarden/caddy-warden/metricsfeed"
	"github.com/lmwarden/caddy-warden/selection"
)

// Source selects a replica's counters in the history: its own engine for a
// rank, the whole server otherwise.
func Source(rep selection.Replica) metricsfeed.Source {
	if rep.SetsRank {
		return metricsfeed.Source{Target: rep.Address, Engine: rep.Rank}
	}
	return metricsfeed.WholeTarget(rep.Address)
}

// sources select the counters of every replica of the plan.
func (p *Plan) sources() []metricsfeed.Source {
	reps := p.view.Replicas()
	out := make([]metricsfeed.Source, len(reps))
	for i, rep := range reps {
		out[i] = Source(rep)
	}
	return out
}

// ReplicaRates are one replica's token rates over window; ok is false
// without two samples in it.
func (m *Model) ReplicaRates(rep selection.Replica, now time.Time, window time.Duration) (metricsfeed.Rates, bool) {
	return m.history.Rates(now, window, Source(rep))
}

// Rates are the applied plan's token rates over window, all replicas together.
func (m *Model) Rates(now time.Time, window time.Duration) (metricsfeed.Rates, bool) {
	p := m.Applied()
	if p == nil {
		return metricsfeed.Rates{}, false
	}
	return m.history.Rates(now, window, p.sources()...)
}

// Series is the applied plan's token traffic, one point per step.
func (m *Model) Series(step time.Duration) []metricsfeed.RatePoint {
	p := m.Applied()
	if p == nil {
		return nil
	}
	return m.history.Series(step, p.sources()...)
}

// ReplicaReportedHitRate is the prefix-cache hit rate the replica's engines
// report themselves (V0's gauge), for servers without prefix-cache counters;
// ok is false when they report none within window.
func (m *Model) ReplicaReportedHitRate(rep selection.Replica, now time.Time, window time.Duration) (float64, bool) {
	return m.history.ReportedHitRate(now, window, Source(rep))
}

// ReportedHitRate is the mean of the applied plan's engines' own prefix-cache
// hit rates (see ReplicaReportedHitRate).
func (m *Model) ReportedHitRate(now time.Time, window time.Duration) (float64, bool) {
	p := m.Applied()
	if p == nil {
		return 0, false
	}
	return m.history.ReportedHitRate(now, window, p.sources()...)
}
