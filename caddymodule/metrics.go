package caddymodule

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// collector exports every live model's panel on Caddy's /metrics. It reads
// the models at scrape time, so it is registered once per registry and its
// values continue across reloads. Labels are model and replica (the replica
// ID); never a session.
type collector struct{}

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
	descHitRate      = desc("replica_prefix_cache_hit_ratio", "Prefix-cache hits / queries over the last 5 minutes, from the replica's own counters.", replicaLabels...)
	descAffinity     = desc("affinity_enabled", "1 when the model pins sessions.", "model")
	descThreshold    = desc("spill_threshold", "In-flight requests above which a pinned replica sheds a request.", "model")
	descUnkeyed      = desc("unkeyed_requests_total", "Requests without a session key.", "model")
	descNoReplica    = desc("no_replica_total", "Requests for which no replica was usable.", "model")
	descEvicted      = desc("sessions_evicted_total", "Sessions dropped because the session table was full.", "model")
	descExpired      = desc("sessions_expired_total", "Sessions forgotten after the idle TTL.", "model")
	descPromptTokens = desc("prompt_tokens_per_second", "Prompt tokens per second over the last minute, by kind: cached (served from the prefix cache, engine-reported) or computed.", "model", "kind")
	descGenTokens    = desc("generation_tokens_per_second", "Generated tokens per second over the last minute.", "model")

	allDescs = []*prometheus.Desc{descInFlight, descRequests, descPlaced, descReplaced, descSessions, descActive,
		descHealthy, descRunning, descWaiting, descKV, descHitRate, descAffinity, descThreshold, descUnkeyed,
		descNoReplica, descEvicted, descExpired, descPromptTokens, descGenTokens}
)

// rateWindow is the window of the tokens-per-second gauges.
const rateWindow = time.Minute

// registerMetrics adds the collector to a config load's registry; a second
// registration in the same registry is expected and ignored.
func registerMetrics(reg *prometheus.Registry, logger *zap.Logger) {
	if reg == nil {
		return
	}
	var already prometheus.AlreadyRegisteredError
	if err := reg.Register(collector{}); err != nil && !errors.As(err, &already) {
		logger.Error("registering warden metrics", zap.Error(err))
	}
}

// Describe sends every descriptor.
func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

// Collect reads every live model.
func (collector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, l := range appliedModels() {
		name := l.model.name
		st := l.status(now)
		gauge := func(d *prometheus.Desc, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
		}
		counter := func(d *prometheus.Desc, v uint64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
		}
		gauge(descAffinity, boolValue(st.Affinity), name)
		gauge(descThreshold, float64(st.SpillThreshold), name)
		counter(descUnkeyed, st.Unkeyed, name)
		counter(descNoReplica, st.NoReplica, name)
		counter(descEvicted, st.SessionsEvicted, name)
		counter(descExpired, st.SessionsExpired, name)
		for _, r := range st.Replicas {
			gauge(descInFlight, float64(r.InFlight), name, r.ID)
			counter(descRequests, r.Sticky, name, r.ID, "sticky")
			counter(descRequests, r.SpilledIn, name, r.ID, "spilled")
			counter(descRequests, r.ClientPinned, name, r.ID, "client_pinned")
			counter(descRequests, r.Unpinned, name, r.ID, "unpinned")
			counter(descPlaced, r.Placed, name, r.ID)
			counter(descReplaced, r.Replaced, name, r.ID)
			gauge(descSessions, float64(r.Sessions), name, r.ID)
			gauge(descActive, float64(r.ActiveSessions), name, r.ID)
			gauge(descHealthy, boolValue(r.Healthy), name, r.ID)
			gauge(descRunning, r.Running, name, r.ID)
			gauge(descWaiting, r.Waiting, name, r.ID)
			gauge(descKV, r.KVUsed, name, r.ID)
			gauge(descHitRate, r.PrefixHitRate, name, r.ID)
		}
		rates, _ := l.model.fleet.Rates(now, rateWindow)
		gauge(descPromptTokens, rates.CachedPerSec, name, "cached")
		gauge(descPromptTokens, rates.ComputedPerSec, name, "computed")
		gauge(descGenTokens, rates.GenPerSec, name)
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
