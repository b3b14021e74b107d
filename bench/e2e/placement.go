package e2e

import (
	"slices"
	"strconv"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
)

// Placement is where conversations went over a window: how well turns
// followed their conversation, and how evenly new conversations spread.
type Placement struct {
	// TurnsOnReplica is the share, in percent, of the served turns (with
	// an engine, ending in the window, after a conversation's first turn)
	// that went to the engine that served their conversation's first turn
	// (turn 0, wherever in the run it ended). Turn-weighted: a long
	// conversation counts for its turns, unlike agentload's StayedPercent,
	// which averages per conversation. Turns counts them.
	TurnsOnReplica float64
	Turns          int
	// Changed counts those turns served by another engine than their
	// conversation's previous turn: each is a move warden made, or a
	// conversation it lost track of.
	Changed int
	// NewConversations counts the conversations whose first turn started
	// in the window and was served; PerReplica how many each replica got
	// (every replica listed, zeros included); Spread is max − min of it.
	NewConversations int
	PerReplica       map[string]int
	Spread           int
}

// Place computes the Placement of the results over [from, to]; replicas
// are the engine names ("r0/0") a request may be served by.
func Place(results []agentload.Result, from, to time.Time, replicas []string) Placement {
	home := map[string]string{}   // conversation (Result.Conversation) → engine of its first turn
	served := map[string]string{} // conversation and turn → engine
	turnKey := func(r agentload.Result, turn int) string { return r.Conversation() + "@" + strconv.Itoa(turn) }
	for _, r := range results {
		if r.Engine != "" && r.OK() {
			served[turnKey(r, r.Turn)] = r.Engine
			if r.Turn == 0 {
				home[r.Conversation()] = r.Engine
			}
		}
	}
	p := Placement{PerReplica: map[string]int{}}
	for _, e := range replicas {
		p.PerReplica[e] = 0
	}
	on := 0
	for _, r := range results {
		if r.Engine == "" {
			continue
		}
		if r.Turn == 0 {
			if r.OK() && !r.Start.Before(from) && !r.Start.After(to) {
				p.NewConversations++
				p.PerReplica[r.Engine]++
			}
			continue
		}
		h, ok := home[r.Conversation()]
		if !ok || r.End.Before(from) || r.End.After(to) {
			continue
		}
		p.Turns++
		if r.Engine == h {
			on++
		}
		if prev, ok := served[turnKey(r, r.Turn-1)]; ok && prev != r.Engine {
			p.Changed++
		}
	}
	if p.Turns > 0 {
		p.TurnsOnReplica = 100 * float64(on) / float64(p.Turns)
	}
	if len(p.PerReplica) > 0 {
		counts := make([]int, 0, len(p.PerReplica))
		for _, n := range p.PerReplica {
			counts = append(counts, n)
		}
		p.Spread = slices.Max(counts) - slices.Min(counts)
	}
	return p
}

// engines names the engines of the run's replicas as the simulator's
// engine header does: "r<i>/0" for one server per replica, "r0/<rank>"
// for one server with ranks.
func (o Options) engines() []string {
	var out []string
	for i := range o.Replicas {
		if o.Topology == TopologyRanks {
			out = append(out, "r0/"+strconv.Itoa(i))
		} else {
			out = append(out, "r"+strconv.Itoa(i)+"/0")
		}
	}
	return out
}
