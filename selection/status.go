package selection

import (
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// Status is a point-in-time view of a model's routing under one view's
// settings, for the admin API, the panel and the Prometheus collectors.
type Status struct {
	Model              string
	Affinity           bool
	SpillThreshold     int
	SpillThresholdAuto bool
	MaxNumSeqs         int
	// TypicalPrompt is the requests' prompt size in tokens, smoothed; the
	// auto spill threshold reads it.
	TypicalPrompt float64
	// PrefillRate is the fleet's prefill rate learned from the replicas'
	// counters, in prompt tokens per second, and TurnSeconds our requests'
	// smoothed duration: what expected costs are measured with (0: not
	// known yet).
	PrefillRate, TurnSeconds float64
	Since                    time.Time
	InFlight                 int64
	Sessions                 int64
	// StickyPercent is the share of keyed requests served by their
	// session's pinned replica (placements included), 0..100.
	StickyPercent float64
	Requests      uint64
	Unkeyed       uint64
	NoReplica     uint64
	Evicted       uint64
	Expired       uint64
	// CompactionsIgnored counts compaction hints ignored because they came
	// within CompactionInterval of the conversation's last placement.
	CompactionsIgnored uint64
	// Admission is load control's state (zero when it is off), and Flows
	// its flows' shares.
	Admission loadcontrol.Status
	Flows     loadcontrol.FlowsStatus
	Replicas  []ReplicaStatus
}

// ReplicaStatus is one replica's counters since the router started.
type ReplicaStatus struct {
	Replica
	InFlight       int64
	Sessions       int64 // sessions pinned here
	ActiveSessions int64 // of those, active within the active window
	Sticky         uint64
	Placed         uint64
	Replaced       uint64
	SpilledIn      uint64
	ClientPinned   uint64
	Unpinned       uint64
	Adopted        uint64 // sessions pinned here by another router (shared pins)
	Joined         uint64 // of Placed, sessions pinned here beside their parent
	Compacted      uint64 // sessions pinned here anew after a compaction
	Rehomed        uint64 // sessions pinned here anew, their cache lost on their pin
	// ChainsFound and ChainsMissed count the turns ended here whose chain of
	// blocks the replica's KV cache events singled out, or did not
	// (chains.go); both 0 when the events are not followed.
	ChainsFound, ChainsMissed uint64
	// Residents and ResidentTokens are the conversations load control holds
	// resident here and their prompts' tokens, the shared prefix counted
	// once (sharedprefix.go).
	Residents      int
	ResidentTokens int
	// HostTierTokens is the replica's host-memory KV tier in tokens, learnt
	// from what it stores (hosttier.go), and CapacityTokens what load
	// control counts as its room: its GPU cache, or the tier when larger;
	// both 0 until known.
	HostTierTokens, CapacityTokens int
	// NextNewcomer is when the replica, filling from empty, may take its
	// next new conversation (load control's stagger); zero when it is not
	// filling so.
	NextNewcomer time.Time
	// Fill is the share of its KV capacity its residents may take now
	// (loadcontrol.Config.Fill, or fill control's, fillcontrol.go).
	Fill    float64
	Load    Load
	Healthy bool
}

// Status returns the router's counters and the view's replicas' state.
func (v *View) Status() Status {
	r := v.router
	threshold, auto := v.SpillThreshold()
	st := Status{
		Model:              r.model,
		Affinity:           v.cfg.Affinity,
		SpillThreshold:     threshold,
		SpillThresholdAuto: auto,
		MaxNumSeqs:         v.cfg.MaxNumSeqs,
		TypicalPrompt:      r.TypicalPrompt(),
		PrefillRate:        v.prefillRate(),
		TurnSeconds:        r.turnSeconds.value(),
		Since:              r.since,
		Requests:           r.requests.Load(),
		Unkeyed:            r.unkeyed.Load(),
		NoReplica:          r.noReplica.Load(),
		Evicted:            r.evicted.Load(),
		Expired:            r.expired.Load(),
		CompactionsIgnored: r.compactionsIgnored.Load(),
	}
	residents := v.lc.Status(&st.Admission, &st.Flows)
	var sticky, spilled uint64
	for _, s := range v.replicas {
		rs := ReplicaStatus{
			Replica:        s.Replica,
			InFlight:       s.inFlight.Load(),
			Sessions:       s.sessions.Load(),
			ActiveSessions: s.active.Load(),
			Sticky:         s.sticky.Load(),
			Placed:         s.placed.Load(),
			Replaced:       s.replaced.Load(),
			SpilledIn:      s.spilledIn.Load(),
			ClientPinned:   s.clientPinned.Load(),
			Unpinned:       s.unpinned.Load(),
			Adopted:        s.adopted.Load(),
			Joined:         s.joined.Load(),
			Compacted:      s.compacted.Load(),
			Rehomed:        s.rehomed.Load(),
			ChainsFound:    s.chainsFound.Load(),
			ChainsMissed:   s.chainsMissed.Load(),
			Load:           *s.load.Load(),
			Healthy:        s.healthy.Load(),
			Residents:      residents[s].Residents,
			ResidentTokens: residents[s].ResidentTokens,
			HostTierTokens: int(s.host.tokens.Load()),
			CapacityTokens: s.capacityTokens(),
			NextNewcomer:   residents[s].NextNewcomer,
			Fill:           residents[s].Fill,
		}
		st.InFlight += rs.InFlight
		st.Sessions += rs.Sessions
		sticky += rs.Sticky
		spilled += rs.SpilledIn
		st.Replicas = append(st.Replicas, rs)
	}
	if sticky+spilled > 0 {
		st.StickyPercent = 100 * float64(sticky) / float64(sticky+spilled)
	}
	return st
}
