package panel

import (
	"strconv"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// FlowStatus is one flow's share of load control's queue since the model
// was first loaded: a person or an API key, known by its hash.
type FlowStatus struct {
	// Flow is the flow's ID: 16 hex digits of its key's hash (keyed by the
	// process, so it changes when Caddy restarts), "none" for the turns
	// that carry no key, "other" for the flows folded out of those counted
	// apart.
	Flow string `json:"flow"`
	// Waiting is the number of its turns held now. Admitted counts its
	// turns admitted (at once or after waiting, forced included), Queued
	// those that had to wait, Refused those a full queue answered 503, and
	// WaitedSeconds the time those admitted from the queue waited in all.
	Waiting       int     `json:"waiting"`
	Admitted      uint64  `json:"admitted"`
	Queued        uint64  `json:"queued"`
	Refused       uint64  `json:"refused"`
	WaitedSeconds float64 `json:"waited_s"`
}

// FlowID is a flow's ID as the admin API and the metrics show it.
func FlowID(id uint64) string {
	if id == 0 {
		return "none"
	}
	s := strconv.FormatUint(id, 16)
	return "0000000000000000"[len(s):] + s
}

func flowStatus(name string, f loadcontrol.FlowStatus) FlowStatus {
	return FlowStatus{Flow: name, Waiting: f.Waiting, Admitted: f.Admitted, Queued: f.Queued, Refused: f.Refused,
		WaitedSeconds: f.Waited.Seconds()}
}

// flowsStatus is the flows counted apart, the most recently active first,
// and the folded ones.
func flowsStatus(fs loadcontrol.FlowsStatus) (flows []FlowStatus, other FlowStatus) {
	flows = make([]FlowStatus, 0, len(fs.Counted))
	for _, f := range fs.Counted {
		flows = append(flows, flowStatus(FlowID(f.ID), f))
	}
	return flows, flowStatus("other", fs.Other)
}
