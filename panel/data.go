package panel

import (
	"math"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/lmwarden/caddy-warden/fleet"
	"github.com/lmwarden/caddy-warden/livemodel"
)

// refresh is how often the panel page fetches its JSON again.
const refresh = 2 * time.Second

// statsStep is the finest resolution of the panel's tokens-per-second chart:
// an hour of history is at most 720 points per model. Models polled less
// often get one point per poll.
const statsStep = 5 * time.Second

// Data is the JSON twin of the panel page: everything it shows.
type Data struct {
	GeneratedAt time.Time `json:"generated_at"`
	// RefreshMS is how often the page fetches this again, in milliseconds.
	RefreshMS int64   `json:"refresh_ms"`
	Models    []Model `json:"models"`
}

// Model is one model's part of the panel: its admin status (the badges
// and the replica table), its counters' start in human form and its token
// traffic over the last hour.
type Model struct {
	ModelStatus
	// SinceHuman is Since relative to GeneratedAt, e.g. "3 minutes ago".
	SinceHuman string `json:"since_human"`
	Stats      Stats  `json:"stats"`
	// WorkingSet is the fleet's resident conversations against its KV
	// caches; absent when load control is off, which keeps no residents.
	WorkingSet *WorkingSet `json:"working_set,omitempty"`
}

// WorkingSet sums the replicas' residents and KV capacity.
type WorkingSet struct {
	ResidentTokens int `json:"resident_tokens"`
	// KVCapacityTokens is nil (JSON null) while a replica's is unknown.
	KVCapacityTokens *int `json:"kv_capacity_tokens"`
}

// Stats is a model's prompt and completion traffic over the last hour,
// all replicas together, from the engines' own counters. The series are
// columns of the same length: At[i] is the start (Unix seconds) of a step of
// StepSeconds, and steps without samples are left out.
type Stats struct {
	StepSeconds   float64 `json:"step_seconds"`
	WindowSeconds float64 `json:"window_seconds"`
	At            []int64 `json:"at"`
	// Cached is prompt tokens per second served from the prefix cache, as the
	// engines report them; Computed is the rest of the prompt tokens.
	Cached     []float64 `json:"cached_tokens_per_s"`
	Computed   []float64 `json:"computed_tokens_per_s"`
	Generation []float64 `json:"generation_tokens_per_s"`
	// HitShare is cached / (cached + computed) prompt tokens over the whole
	// window, 0..1; nil (JSON null) when unknown: no replica reports cached
	// tokens (prompt_tokens_cached or prefix-cache hits), or no prompt token
	// was counted. Steps without a cached count have 0 in both Cached and
	// Computed.
	HitShare *float64 `json:"hit_share"`
}

// NewData assembles the panel of the models whose applied loads are given,
// at now.
func NewData(now time.Time, applied []*livemodel.Load) Data {
	out := Data{GeneratedAt: now, RefreshMS: refresh.Milliseconds(), Models: []Model{}}
	for _, l := range applied {
		out.Models = append(out.Models, modelOf(l, now))
	}
	return out
}

// modelOf is the model's part of the panel at now.
func modelOf(l *livemodel.Load, now time.Time) Model {
	st := Status(l, now)
	return Model{
		ModelStatus: st,
		SinceHuman:  humanize.RelTime(st.Since, now, "ago", "from now"),
		Stats:       hourStats(l.Model().Fleet(), now, max(statsStep, l.Plan().MetricsInterval())),
		WorkingSet:  workingSet(st),
	}
}

// workingSet sums the residents and KV capacity of the model's replicas;
// nil when load control is off.
func workingSet(st ModelStatus) *WorkingSet {
	if !st.LoadControl.Enabled {
		return nil
	}
	ws := &WorkingSet{KVCapacityTokens: new(int)}
	for _, r := range st.Replicas {
		ws.ResidentTokens += r.ResidentTokens
		if r.KVCapacityTokens == nil {
			ws.KVCapacityTokens = nil
		} else if ws.KVCapacityTokens != nil {
			*ws.KVCapacityTokens += *r.KVCapacityTokens
		}
	}
	return ws
}

// hourStats is the model's traffic over the history's last hour, one point
// per step.
func hourStats(f *fleet.Model, now time.Time, step time.Duration) Stats {
	out := Stats{
		StepSeconds:   step.Seconds(),
		WindowSeconds: fleet.HistoryRetention.Seconds(),
		At:            []int64{},
		Cached:        []float64{},
		Computed:      []float64{},
		Generation:    []float64{},
	}
	from := now.Add(-fleet.HistoryRetention)
	for _, p := range f.Series(step) {
		if p.At.Before(from) || p.At.After(now) {
			continue
		}
		out.At = append(out.At, p.At.Unix())
		out.Cached = append(out.Cached, roundRate(p.CachedPerSec))
		out.Computed = append(out.Computed, roundRate(p.ComputedPerSec))
		out.Generation = append(out.Generation, roundRate(p.GenPerSec))
	}
	if rates, ok := f.Rates(now, fleet.HistoryRetention); ok && rates.CachedKnown {
		if split := rates.CachedPerSec + rates.ComputedPerSec; split > 0 {
			share := min(rates.CachedPerSec/split, 1)
			out.HitShare = &share
		}
	}
	return out
}

// roundRate keeps two decimals of a rate: plenty for a chart, and it keeps
// the JSON that the page fetches every refresh small.
func roundRate(v float64) float64 { return math.Round(v*100) / 100 }
