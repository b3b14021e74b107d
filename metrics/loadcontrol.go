package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lmwarden/caddy-warden/panel"
)

// The series of load control, kept apart from metrics.go's table. A model's
// are exported while its load control is on; a replica's KV capacity
// whenever it is known.
var (
	descLoadControlWaiting = desc("load_control_waiting", "Turns held by load control now.", "model")
	descLoadControlTurns   = desc("load_control_turns_total", "Turns of keyed conversations load control saw, by result: admitted (at once or after waiting, forced included), queued (had to wait), forced (sent over capacity after max_wait), refused (answered 503: the queue was full), cancelled (the client left while the turn waited), task_ended (its reply ended the agent's task, read by warden_stop_reason: its conversation left at once), side_call (a turn of a resident conversation with a body under a quarter of its latest own turn's, which neither sized nor ended its residency).", "model", "result")
	descRefreshes          = desc("load_control_refreshes_total", "Requests that refreshed the cache of a conversation kept for a person within their share (its last request again, for one token), by result: sent (answered with a success) or failed.", "model", "result")
	descResidents          = desc("residents", "Conversations load control holds resident on the replica: running a turn, or within their linger after one.", replicaLabels...)
	descResidentTokens     = desc("resident_tokens", "Prompt tokens of the conversations resident on the replica, the prefix they share counted once: their last reply's count when warden_stop_reason read it, else their body bytes / the learned bytes per token.", replicaLabels...)
	descSharedPrefix       = desc("load_control_shared_prefix_tokens", "The prefix new conversations share with others (their system prompt and tools), learned from the cached part of their first reply (vLLM's --enable-prompt-tokens-details, read by warden_stop_reason), else from the system prompt and tools their requests share; a replica holds it once for all its residents. No sample until known.", "model")
	descReplyTokens        = desc("load_control_reply_tokens_total", "Prompt tokens the replies of admitted turns reported (read by warden_stop_reason), by turn (resident: its conversation was resident when it arrived; non_resident: the others) and part (prompt: all; cached: found in the prefix cache, reported by vLLM with --enable-prompt-tokens-details).", "model", "turn", "part")
	descLoadControlAside   = desc("load_control_stepped_aside", "1 while load control steps aside, admitting every turn at once: until a turn lacks room and once few do (lack_share in the admin API below 1/32), and while most idle residents' residency expired before their conversation came back (late_share over 0.5, cleared below 0.35); else 0.", "model")
	descBytesPerToken      = desc("load_control_bytes_per_token", "Request body bytes per prompt token, learned from the replies' prompt sizes; load control sizes turns by it (4 before any reply).", "model")
	descFlowWaiting        = desc("load_control_flow_waiting", "Turns of the flow (a person or an API key, by its hashed ID; other: the flows folded out of the 256 counted apart) held by load control now.", "model", "flow")
	descFlowTurns          = desc("load_control_flow_turns_total", "Turns of the flow load control saw, by result: admitted (at once or after waiting, forced included), queued (had to wait), refused (answered 503: the queue was full). A flow folded into other takes its counts there.", "model", "flow", "result")
	descFlowWaited         = desc("load_control_flow_wait_seconds_total", "Time the flow's turns admitted from load control's queue waited there, in all.", "model", "flow")
	descKVCapacity         = desc("kv_capacity_tokens", "The replica's KV cache in tokens as load control counts it: capacity_tokens when set, else the replica's num_gpu_blocks x block_size, or its host tier's tokens when larger; no sample while unknown.", replicaLabels...)

	// loadControlWaitSeconds times every wait in load control's queue. It
	// is the collector's: it continues across reloads like the rest.
	loadControlWaitSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy",
		Subsystem: "warden",
		Name:      "load_control_wait_seconds",
		Help:      "Time turns waited in load control's queue, however they left it (admitted, forced after max_wait, client gone); turns admitted at once are not observed.",
		Buckets:   []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300},
	}, []string{"model"})
)

// ShowWait makes the model's wait histogram exist, at zero, so that a
// dashboard shows "no wait" rather than "no data" from the start.
func ShowWait(model string) { loadControlWaitSeconds.WithLabelValues(model) }

// ObserveWait records how long a turn of the model waited.
func ObserveWait(model string, seconds float64) {
	loadControlWaitSeconds.WithLabelValues(model).Observe(seconds)
}

func describeLoadControl(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLoadControlWaiting, descLoadControlAside, descLoadControlTurns, descRefreshes, descReplyTokens, descBytesPerToken, descSharedPrefix, descResidents, descResidentTokens, descKVCapacity,
		descFlowWaiting, descFlowTurns, descFlowWaited} {
		ch <- d
	}
	loadControlWaitSeconds.Describe(ch)
}

func collectLoadControlModel(ch chan<- prometheus.Metric, model string, lc panel.LoadControlStatus) {
	ch <- prometheus.MustNewConstMetric(descLoadControlWaiting, prometheus.GaugeValue, float64(lc.Waiting), model)
	aside := 0.0
	if lc.SteppedAside {
		aside = 1
	}
	ch <- prometheus.MustNewConstMetric(descLoadControlAside, prometheus.GaugeValue, aside, model)
	for result, n := range map[string]uint64{
		"admitted": lc.Admitted, "queued": lc.Queued, "forced": lc.Forced, "refused": lc.Refused, "cancelled": lc.Cancelled, "task_ended": lc.TaskEnded, "side_call": lc.SideCalls,
	} {
		ch <- prometheus.MustNewConstMetric(descLoadControlTurns, prometheus.CounterValue, float64(n), model, result)
	}
	ch <- prometheus.MustNewConstMetric(descRefreshes, prometheus.CounterValue, float64(lc.Refreshes), model, "sent")
	ch <- prometheus.MustNewConstMetric(descRefreshes, prometheus.CounterValue, float64(lc.RefreshesFailed), model, "failed")
	for turn, c := range map[string]panel.ReplyTokensStatus{"resident": lc.Replies.Resident, "non_resident": lc.Replies.NonResident} {
		ch <- prometheus.MustNewConstMetric(descReplyTokens, prometheus.CounterValue, float64(c.PromptTokens), model, turn, "prompt")
		ch <- prometheus.MustNewConstMetric(descReplyTokens, prometheus.CounterValue, float64(c.CachedTokens), model, turn, "cached")
	}
	ch <- prometheus.MustNewConstMetric(descBytesPerToken, prometheus.GaugeValue, lc.Replies.BytesPerToken, model)
	if lc.SharedPrefixTokens != nil {
		ch <- prometheus.MustNewConstMetric(descSharedPrefix, prometheus.GaugeValue, float64(*lc.SharedPrefixTokens), model)
	}
	for _, f := range append(lc.Flows, lc.OtherFlows) {
		ch <- prometheus.MustNewConstMetric(descFlowWaiting, prometheus.GaugeValue, float64(f.Waiting), model, f.Flow)
		for result, n := range map[string]uint64{"admitted": f.Admitted, "queued": f.Queued, "refused": f.Refused} {
			ch <- prometheus.MustNewConstMetric(descFlowTurns, prometheus.CounterValue, float64(n), model, f.Flow, result)
		}
		ch <- prometheus.MustNewConstMetric(descFlowWaited, prometheus.CounterValue, f.WaitedSeconds, model, f.Flow)
	}
}

func collectLoadControlReplica(ch chan<- prometheus.Metric, model string, r panel.ReplicaStatus, on bool) {
	if r.KVCapacityTokens != nil {
		ch <- prometheus.MustNewConstMetric(descKVCapacity, prometheus.GaugeValue, float64(*r.KVCapacityTokens), model, r.ID)
	}
	if on {
		ch <- prometheus.MustNewConstMetric(descResidents, prometheus.GaugeValue, float64(r.Residents), model, r.ID)
		ch <- prometheus.MustNewConstMetric(descResidentTokens, prometheus.GaugeValue, float64(r.ResidentTokens), model, r.ID)
	}
}
