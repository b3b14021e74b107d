package loadcontrol

import (
	"maps"
	"math"
	"slices"
	"testing"
	"time"
)

// FuzzAdmission drives load control with turns of a few conversations, of
// sizes that make side calls and outgrowing turns, in three flows (one
// weighted) and from sub-agents, ended, cancelled, forced
// and expired in any order, and checks its books after every step: what each
// replica holds is the sum of its residents, a running turn's residency is
// there, the idle list is the idle residents, the queue the waiting turns
// and no longer than max_queue, in its flows' order, each flow's turns
// counted where its counters are. Once every turn has ended and linger has
// passed, nothing is held.
func FuzzAdmission(f *testing.F) {
	f.Add([]byte{0, 3, 0, 1, 0, 9, 1, 0, 2, 1, 4, 0})
	f.Add([]byte{0, 0, 0, 4, 0, 8, 0, 2, 1, 1, 3, 2, 5, 0, 4, 9})
	f.Add([]byte{0, 1, 0, 0, 0, 5, 0, 9, 1, 0, 1, 1, 1, 2, 1, 3, 4, 7})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) == 0 {
			return
		}
		r := newFakeRouting(2).view(Config{
			Enabled: true, CapacityTokens: 100, Fill: 1, MinResidents: 1,
			Linger: 10 * time.Second, MaxQueue: 4, Quantum: 3, Touch: ops[0]%2 == 1, FillMin: 0.5, FillMax: 1.2,
		})
		sizes := []int{1, 5, 20, 40, 60, 90, 200}
		now := t0
		var tickets []*Ticket
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i]%6, int(ops[i+1])
			nth := func() *Ticket {
				if len(tickets) == 0 {
					return nil
				}
				return tickets[arg%len(tickets)]
			}
			switch op {
			case 0:
				turn := Turn{Key: uint64(arg%4 + 1), Flow: uint64(arg/28) % 3, FlowWeight: float64(arg/28%3) / 2, Now: now, Subagent: arg >= 168}
				tokens := sizes[(arg/4)%len(sizes)]
				tickets = append(tickets, r.Admit(turn, Body{Bytes: int64(tokens * fakeBytesPerToken)}, nil))
			case 1:
				if tk := nth(); tk != nil {
					prompt := sizes[arg%len(sizes)]
					tk.End(now, Reply{TaskEnded: arg%3 == 0, PromptTokens: prompt, CachedTokens: prompt * (arg % 5) / 4, CacheReported: arg%2 == 0})
				}
			case 2:
				if tk := nth(); tk != nil {
					tk.Cancel(now)
				}
			case 3:
				if tk := nth(); tk != nil {
					tk.Force(now)
				}
			case 4:
				now = now.Add(time.Duration(arg%16) * time.Second)
				r.Sweep(now)
			case 5:
				if tk := nth(); tk != nil {
					tk.Done(now)
				}
			}
			checkAdmissionBooks(t, r, tickets, i/2)
		}
		for _, tk := range tickets {
			tk.Cancel(now)
			tk.Done(now)
		}
		r.Sweep(now.Add(time.Minute))
		checkAdmissionBooks(t, r, tickets, -1)
		g := r.gate
		if len(g.residents) != 0 || len(g.queue) != 0 {
			t.Fatalf("after every turn ended and linger passed: %d residents, %d queued", len(g.residents), len(g.queue))
		}
		for s, h := range g.held {
			if h != (residency{}) {
				t.Fatalf("replica %s still holds %+v", s, h)
			}
		}
	})
}

// checkAdmissionBooks checks load control's invariants after step (-1: the
// end).
func checkAdmissionBooks(t *testing.T, r *View, tickets []*Ticket, step int) {
	t.Helper()
	g := r.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("step %d: "+format, append([]any{step}, args...)...)
	}
	sums := map[Replica]residency{}
	idle := 0
	for key, res := range g.residents {
		if res.key != key {
			fail("resident %x filed under %x", res.key, key)
		}
		h := sums[res.rep]
		h.count++
		h.tokens += res.tokens
		sums[res.rep] = h
		if res.running < 0 {
			fail("resident %x runs %d turns", key, res.running)
		}
		if (res.running == 0) != (res.idle != nil) {
			fail("resident %x runs %d turns, in the idle list: %v", key, res.running, res.idle != nil)
		}
		if res.idle != nil {
			idle++
		}
	}
	if idle != g.idle.Len() {
		fail("%d idle residents, %d in the idle list", idle, g.idle.Len())
	}
	onReplicas := 0
	for s, on := range g.idleOn {
		if on.Len() == 0 {
			fail("replica %s keeps an empty idle list", s)
		}
		last := int64(math.MinInt64)
		for e := on.Front(); e != nil; e = e.Next() {
			res := e.Value.(*resident)
			if res.rep != s || res.idleOn != e || res.idleSince < last {
				fail("replica %s's idle list holds %x of %s idle since %d after %d", s, res.key, res.rep, res.idleSince, last)
			}
			last = res.idleSince
			onReplicas++
		}
	}
	if onReplicas != idle {
		fail("%d idle residents, %d in the replicas' idle lists", idle, onReplicas)
	}
	for s, h := range g.held {
		if h != sums[s] {
			fail("replica %s holds %+v, its residents add up to %+v", s, h, sums[s])
		}
	}
	running := map[*resident]int{}
	waiting := 0
	for _, tk := range tickets {
		if tk == nil {
			continue
		}
		switch tk.state {
		case Admitted:
			if g.residents[tk.key] != tk.res {
				fail("a running turn's residency is gone")
			}
			running[tk.res]++
		case Waiting:
			waiting++
		}
	}
	for _, res := range g.residents {
		if running[res] != res.running {
			fail("resident %x counts %d running turns, %d are", res.key, res.running, running[res])
		}
	}
	if waiting != len(g.queue) || len(g.queue) > r.cfg.MaxQueue {
		fail("%d waiting turns, %d queued, max_queue %d", waiting, len(g.queue), r.cfg.MaxQueue)
	}
	checkFlowBooks(g, fail)
}

// checkFlowBooks checks the fair queue's invariants (g.mu held): the queue
// is in slot order, each flow's turns are its queued ones, main turns
// first, in slot order, the waiting counts are the queued turns, and the
// flows' counters add up to load control's.
func checkFlowBooks(g *Gate, fail func(string, ...any)) {
	for i := 1; i < len(g.queue); i++ {
		if g.queue[i-1].fair.slot.compare(g.queue[i].fair.slot) >= 0 {
			fail("queue out of slot order at %d: %+v then %+v", i, g.queue[i-1].fair.slot, g.queue[i].fair.slot)
		}
	}
	inFlows := 0
	waiting := map[*flowCounts]int{}
	for flow, f := range g.fair.flows {
		if len(f.turns) == 0 {
			fail("flow %d kept with no turn waiting", flow)
		}
		for j, tk := range f.turns {
			if tk.fair.flow != flow || tk.state != Waiting || !slices.Contains(g.queue, tk) {
				fail("flow %d holds a turn of flow %d in state %d", flow, tk.fair.flow, tk.state)
			}
			if j > 0 && (f.turns[j-1].fair.secondary && !tk.fair.secondary || f.turns[j-1].fair.slot.compare(tk.fair.slot) >= 0) {
				fail("flow %d's turns out of order at %d", flow, j)
			}
			waiting[tk.fair.counts]++
		}
		inFlows += len(f.turns)
	}
	if inFlows != len(g.queue) {
		fail("%d turns in the flows, %d queued", inFlows, len(g.queue))
	}
	ft := &g.fair.table
	counts := append([]*flowCounts{&ft.other}, slices.Collect(maps.Values(ft.byID))...)
	var admitted, queued uint64
	for _, c := range counts {
		if c.waiting != waiting[c] {
			fail("flow %d counts %d waiting, %d are", c.id, c.waiting, waiting[c])
		}
		admitted, queued = admitted+c.admitted, queued+c.queued
	}
	if admitted != g.admitted || queued != g.queued {
		fail("the flows admitted %d and queued %d, load control %d and %d", admitted, queued, g.admitted, g.queued)
	}
}
