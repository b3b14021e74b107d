// Package metrics exports warden's series (caddy_warden_*) to Prometheus:
// each running model's status, read at scrape time so that the values
// continue across config reloads, and the histograms of the shared pin
// store's round trips and of load control's waits. Labels are model and
// replica (the replica ID); never a session.
package metrics

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/livemodel"
	"github.com/lmwarden/caddy-warden/panel"
)

// collector exports the status of every model a running config applies.
type collector struct {
	applied func() []*livemodel.Load
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName("caddy", "warden", name), help, labels, nil)
}

var (
	replicaLabels = []string{"model", "replica"}

	descInFlight     = desc("in_flight_requests", "Requests in flight through warden to the replica.", replicaLabels...)
	descRequests     = desc("requests_total", "Requests routed to the replica, by outcome: sticky (its session's pin), spilled (pinned elsewhere, over threshold), client_pinned, unpinned (no key or affinity off).", append(replicaLabels, "outcome")...)
	descPlaced       = desc("sessions_placed_total", "New sessions pinned to the replica.", replicaLabels...)
	descReplaced     = desc("sessions_replaced_total", "Sessions moved to the replica because their pin was unusable.", replicaLabels...)
	descSessions     = desc("sessions", "Sessions pinned to the replica.", replicaLabels...)
	descActive       = desc("active_sessions", "Sessions pinned to the replica that sent a request within the active window.", replicaLabels...)
	descHealthy      = desc("replica_healthy", "1 when the replica can take work (fresh metrics, /health 200).", replicaLabels...)
	descRunning      = desc("replica_running_requests", "vllm:num_requests_running at the last scrape.", replicaLabels...)
	descWaiting      = desc("replica_waiting_requests", "vllm:num_requests_waiting at the last scrape.", replicaLabels...)
	descKV           = desc("replica_kv_cache_usage_ratio", "vllm:kv_cache_usage_perc at the last scrape (0..1).", replicaLabels...)
	descHitRate      = desc("replica_prefix_cache_hit_ratio", "Prefix-cache hits / queries over the last 5 minutes, from the replica's own counters (V0 servers: their own hit-rate gauge); no sample while unknown (no counters, or no query).", replicaLabels...)
	descAffinity     = desc("affinity_enabled", "1 when the model pins sessions.", "model")
	descThreshold    = desc("spill_threshold", "The manual spill threshold: requests in flight above which a pinned conversation moves; 0 when moves follow their expected cost (auto).", "model")
	descTypical      = desc("typical_prompt_tokens", "The requests' prompt size in tokens, estimated from their bodies and smoothed over about the last hundred. No sample before a request told its size.", "model")
	descPrefillRate  = desc("prefill_tokens_per_second", "The replicas' prefill rate learnt from their counters (prompt tokens computed per second of time to first token), which moves are costed with. No sample before it is known.", "model")
	descUnkeyed      = desc("unkeyed_requests_total", "Requests without a session key.", "model")
	descNoReplica    = desc("no_replica_total", "Requests for which no replica was usable.", "model")
	descEvicted      = desc("sessions_evicted_total", "Sessions dropped because the session table was full.", "model")
	descExpired      = desc("sessions_expired_total", "Sessions forgotten after the idle TTL.", "model")
	descPromptTokens = desc("prompt_tokens_per_second", "Prompt tokens per second over the last minute, by kind: cached (served from the prefix cache, engine-reported) or computed; of the replicas that report cached tokens, no sample when none does.", "model", "kind")
	descGenTokens    = desc("generation_tokens_per_second", "Generated tokens per second over the last minute.", "model")
	descAdopted      = desc("sessions_adopted_total", "Sessions pinned to the replica by another Caddy instance sharing the pin store.", replicaLabels...)
	descStoreUp      = desc("pin_store_up", "1 when the shared pin store answers (its circuit breaker is closed).", "model")
	descStoreClaims  = desc("pin_store_claims_total", "First sights of a conversation claimed in the shared pin store, by result: won, or lost (another instance's pin was adopted).", "model", "result")
	descStoreRepins  = desc("pin_store_repins_total", "Pins moved in the shared pin store by compare-and-set, by result: won, or lost (another instance moved it first).", "model", "result")
	descStoreAdopted = desc("pin_store_adopted_total", "Local pins moved to follow another instance (its message, or the periodic catch-up).", "model")
	descStoreReclaim = desc("pin_store_reclaimed_total", "Pins the store had lost (expired, or Redis restarted) claimed again by the periodic sync.", "model")
	descStoreSkipped = desc("pin_store_skipped_total", "Store calls not made while the store was down; those conversations were routed locally.", "model")

	allDescs = []*prometheus.Desc{descInFlight, descRequests, descPlaced, descReplaced, descSessions, descActive,
		descHealthy, descRunning, descWaiting, descKV, descHitRate, descAffinity, descThreshold, descTypical, descPrefillRate, descUnkeyed,
		descNoReplica, descEvicted, descExpired, descPromptTokens, descGenTokens, descAdopted,
		descStoreUp, descStoreClaims, descStoreRepins, descStoreAdopted, descStoreReclaim, descStoreSkipped}

	// pinStoreSeconds times every round trip to the shared pin store. It is
	// the collector's: it continues across reloads like the rest.
	pinStoreSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy",
		Subsystem: "warden",
		Name:      "pin_store_seconds",
		Help:      "Round trips to the shared pin store, by operation (claim, repin, sync, ping) and result (ok, error, timeout, skipped).",
		Buckets:   []float64{0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25},
	}, []string{"model", "op", "result"})
)

// ObservePinStore records the model's store round trips.
func ObservePinStore(model string) func(op, result string, d time.Duration) {
	return func(op, result string, d time.Duration) {
		pinStoreSeconds.WithLabelValues(model, op, result).Observe(d.Seconds())
	}
}

// rateWindow is the window of the tokens-per-second gauges.
const rateWindow = time.Minute

// Register adds the collector of the models applied lists to a config
// load's registry; a second registration in the same registry is expected
// and ignored.
func Register(reg *prometheus.Registry, applied func() []*livemodel.Load, logger *zap.Logger) {
	if reg == nil {
		return
	}
	var already prometheus.AlreadyRegisteredError
	if err := reg.Register(collector{applied}); err != nil && !errors.As(err, &already) {
		logger.Error("registering warden metrics", zap.Error(err))
	}
}

// Forget drops the model's series from the process-wide histograms, as a
// model no config uses leaves the gauges read from the running config.
func Forget(model string) {
	byModel := prometheus.Labels{"model": model}
	loadControlWaitSeconds.DeletePartialMatch(byModel)
	pinStoreSeconds.DeletePartialMatch(byModel)
}

// Describe sends every descriptor.
func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
	describeAgents(ch)
	describeLoadControl(ch)
	pinStoreSeconds.Describe(ch)
}

// Collect reads every running model.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, l := range c.applied() {
		name := l.Model().Name()
		st := panel.Status(l, now)
		gauge := func(d *prometheus.Desc, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
		}
		counter := func(d *prometheus.Desc, v uint64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
		}
		gauge(descAffinity, boolValue(st.Affinity), name)
		gauge(descThreshold, float64(st.SpillThreshold), name)
		if st.TypicalPromptTokens > 0 {
			gauge(descTypical, float64(st.TypicalPromptTokens), name)
		}
		if st.PrefillTokensPerSecond != nil {
			gauge(descPrefillRate, *st.PrefillTokensPerSecond, name)
		}
		counter(descUnkeyed, st.Unkeyed, name)
		counter(descNoReplica, st.NoReplica, name)
		counter(descEvicted, st.SessionsEvicted, name)
		counter(descExpired, st.SessionsExpired, name)
		collectAgentModel(ch, name, st)
		loadControl := l.Plan().View().Admission().Enabled
		if loadControl {
			collectLoadControlModel(ch, name, st.LoadControl)
		}
		for _, r := range st.Replicas {
			gauge(descInFlight, float64(r.InFlight), name, r.ID)
			counter(descRequests, r.Sticky, name, r.ID, "sticky")
			counter(descRequests, r.SpilledIn, name, r.ID, "spilled")
			counter(descRequests, r.ClientPinned, name, r.ID, "client_pinned")
			counter(descRequests, r.Unpinned, name, r.ID, "unpinned")
			counter(descPlaced, r.Placed, name, r.ID)
			counter(descReplaced, r.Replaced, name, r.ID)
			counter(descAdopted, r.Adopted, name, r.ID)
			collectAgentReplica(ch, name, r)
			collectLoadControlReplica(ch, name, r, loadControl)
			gauge(descSessions, float64(r.Sessions), name, r.ID)
			gauge(descActive, float64(r.ActiveSessions), name, r.ID)
			gauge(descHealthy, boolValue(r.Healthy), name, r.ID)
			gauge(descRunning, r.Running, name, r.ID)
			gauge(descWaiting, r.Waiting, name, r.ID)
			gauge(descKV, r.KVUsed, name, r.ID)
			if r.PrefixHitRate != nil {
				gauge(descHitRate, *r.PrefixHitRate, name, r.ID)
			}
		}
		rates, _ := l.Model().Fleet().Rates(now, rateWindow)
		if rates.CachedKnown {
			gauge(descPromptTokens, rates.CachedPerSec, name, "cached")
			gauge(descPromptTokens, rates.ComputedPerSec, name, "computed")
		}
		gauge(descGenTokens, rates.GenPerSec, name)
		if ps := st.PinStore; ps != nil {
			gauge(descStoreUp, boolValue(ps.Up), name)
			counter(descStoreClaims, ps.Claims, name, "won")
			counter(descStoreClaims, ps.ClaimsLost, name, "lost")
			counter(descStoreRepins, ps.Repins, name, "won")
			counter(descStoreRepins, ps.RepinsLost, name, "lost")
			counter(descStoreAdopted, ps.Adopted, name)
			counter(descStoreReclaim, ps.Reclaimed, name)
			counter(descStoreSkipped, ps.Skipped, name)
		}
	}
	pinStoreSeconds.Collect(ch)
	loadControlWaitSeconds.Collect(ch)
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
