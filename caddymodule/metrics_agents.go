package caddymodule

import "github.com/prometheus/client_golang/prometheus"

// The series of agent-aware routing (sub-agents, compaction), kept apart
// from metrics.go's table.
var (
	descJoined            = desc("sessions_joined_total", "New conversations (sub-agents, continuations) pinned to their parent's replica; counted in sessions_placed_total too.", replicaLabels...)
	descCompacted         = desc("sessions_compacted_total", "Conversations pinned to the replica anew, by load, after a compaction replaced their prefix.", replicaLabels...)
	descCompactionsIgnore = desc("compactions_ignored_total", "Compaction hints ignored because they came within a minute of the conversation's last placement.", "model")
)

func describeAgents(ch chan<- *prometheus.Desc) {
	ch <- descJoined
	ch <- descCompacted
	ch <- descCompactionsIgnore
}

func collectAgentModel(ch chan<- prometheus.Metric, model string, st ModelStatus) {
	ch <- prometheus.MustNewConstMetric(descCompactionsIgnore, prometheus.CounterValue, float64(st.CompactionsIgnored), model)
}

func collectAgentReplica(ch chan<- prometheus.Metric, model string, r ReplicaStatus) {
	ch <- prometheus.MustNewConstMetric(descJoined, prometheus.CounterValue, float64(r.Joined), model, r.ID)
	ch <- prometheus.MustNewConstMetric(descCompacted, prometheus.CounterValue, float64(r.Compacted), model, r.ID)
}
