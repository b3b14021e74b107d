package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lmwarden/caddy-warden/panel"
)

// The series of conversations placed anew for their cache (sub-agents,
// compaction, rehoming), kept apart from metrics.go's table.
var (
	descJoined            = desc("sessions_joined_total", "New conversations (sub-agents, continuations) pinned to their parent's replica; counted in sessions_placed_total too.", replicaLabels...)
	descCompacted         = desc("sessions_compacted_total", "Conversations pinned to the replica anew, by load, after a compaction replaced their prefix.", replicaLabels...)
	descRehomed           = desc("sessions_rehomed_total", "Conversations pinned to the replica anew, by load, because their pin had likely evicted their cache since their last turn (the pin's KV writes since then exceeded its free room).", replicaLabels...)
	descCompactionsIgnore = desc("compactions_ignored_total", "Compaction hints ignored because they came within a minute of the conversation's last placement.", "model")
)

func describeAgents(ch chan<- *prometheus.Desc) {
	ch <- descJoined
	ch <- descCompacted
	ch <- descRehomed
	ch <- descCompactionsIgnore
}

func collectAgentModel(ch chan<- prometheus.Metric, model string, st panel.ModelStatus) {
	ch <- prometheus.MustNewConstMetric(descCompactionsIgnore, prometheus.CounterValue, float64(st.CompactionsIgnored), model)
}

func collectAgentReplica(ch chan<- prometheus.Metric, model string, r panel.ReplicaStatus) {
	ch <- prometheus.MustNewConstMetric(descJoined, prometheus.CounterValue, float64(r.Joined), model, r.ID)
	ch <- prometheus.MustNewConstMetric(descCompacted, prometheus.CounterValue, float64(r.Compacted), model, r.ID)
	ch <- prometheus.MustNewConstMetric(descRehomed, prometheus.CounterValue, float64(r.Rehomed), model, r.ID)
}
