package e2e

import (
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
)

func TestPlaceWeighsTurnsAndSpreadsNewConversations(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	res := func(conv string, turn, start int, engine string) agentload.Result {
		return agentload.Result{SessionID: conv, Turn: turn, Start: at(start), End: at(start + 1), Engine: engine}
	}
	results := []agentload.Result{
		res("a", 0, 0, "r0/0"), // before the window: a's home, not a new conversation in it
		res("a", 1, 10, "r0/0"),
		res("a", 2, 12, "r1/0"), // off its replica
		res("a", 3, 14, "r0/0"),
		res("b", 0, 11, "r1/0"),
		res("b", 1, 13, "r1/0"),
		res("c", 0, 12, "r1/0"),
		res("d", 1, 12, "r2/0"), // its first turn is unknown: not counted
	}
	p := Place(results, at(10), at(20), []string{"r0/0", "r1/0", "r2/0"})
	if p.Turns != 4 || p.TurnsOnReplica != 75 || p.Changed != 2 {
		t.Errorf("%d turns, %.1f%% on their replica, %d on another than their previous turn; want 4, 75%%, 2 (a's off and back)",
			p.Turns, p.TurnsOnReplica, p.Changed)
	}
	if p.NewConversations != 2 || p.PerReplica["r1/0"] != 2 || p.PerReplica["r2/0"] != 0 || p.Spread != 2 {
		t.Errorf("new conversations %d, per replica %v, spread %d; want 2, r1 2, spread 2", p.NewConversations, p.PerReplica, p.Spread)
	}
}
