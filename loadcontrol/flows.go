package loadcontrol

import (
	"cmp"
	"container/list"
	"slices"
	"time"
)

// Fair share between flows. With load control, a farm a team shares holds
// everyone's waiting turns in one queue: served first come, first served,
// one person's twenty parallel agents keep everyone else's turns behind
// theirs. So each turn belongs to a flow (Request.Flow: a person or an API
// key, hashed by the proxy) and the queue serves the flows round robin,
// weighted (Request.FlowWeight): it is kept in the order of each turn's
// virtual finish tag, as start-time fair queuing tags packets, so that a
// turn waits behind about one turn of each other flow per turn of its own,
// however many the others hold. A flow counts only while it has turns
// waiting: idle, it earns no credit. Within a flow, a main conversation's
// turns go ahead of its sub-agents' and its side calls, which the person
// waits on less. With one flow the tags follow arrival, and the queue is
// first come, first served.

// slot is a place in the queue's order: the virtual start and finish tags
// of a turn, and the order the slot was made in, which breaks ties.
type slot struct {
	start, finish float64
	made          uint64
}

func (a slot) compare(b slot) int {
	if c := cmp.Compare(a.finish, b.finish); c != 0 {
		return c
	}
	return cmp.Compare(a.made, b.made)
}

// fairTurn is a turn's place among the flows.
type fairTurn struct {
	flow   uint64
	weight float64
	// subagent: the turn of a spawned sub-agent. It and a side call are
	// secondary: they wait behind their flow's main turns.
	subagent, secondary bool
	since               int64 // when it asked for admission
	slot                slot
	counts              *flowCounts
}

// fairQueue is the fair-share state of the gate's queue.
type fairQueue struct {
	// vt is the virtual time: the start tag of the turns served now.
	vt    float64
	flows map[uint64]*flowTurns // the flows with turns waiting
	made  uint64                // slots made
	table flowTable
	// held is what each flow holds resident (flowshare.go).
	held map[uint64]*flowHold
}

// flowTurns is a flow's waiting turns in its own order (main turns first,
// then by arrival) and its last slot's finish tag.
type flowTurns struct {
	turns []*Ticket
	last  float64
}

func newFairQueue() fairQueue {
	return fairQueue{flows: map[uint64]*flowTurns{}, table: flowTable{byID: map[uint64]*flowCounts{}},
		held: map[uint64]*flowHold{}}
}

// fairTurnOf is what turn is among the flows (g.mu held).
func (v *View) fairTurnOf(turn Turn) fairTurn {
	weight := turn.FlowWeight
	if weight <= 0 {
		weight = 1
	}
	return fairTurn{flow: turn.Flow, weight: weight, subagent: turn.Subagent,
		since: turn.Now.UnixNano(), counts: v.gate.fair.table.counts(turn.Flow)}
}

// secondary reports whether t, which must wait, waits behind its flow's
// main turns: a sub-agent's, or a side call, its prompt under the side-call
// share of its conversation's latest (its conversation not resident, as
// sidecall.go tells those, it is read from the session table).
func (t *Ticket) secondary() bool {
	v := t.view
	return t.fair.subagent || known(t.body) &&
		sideShare*float64(v.routing.LastPrompt(t.key, t.fair.since)) > float64(t.tokens)
}

// enqueue puts t in the queue at its flow's next slot, ahead of its flow's
// secondary turns if it is a main one (g.mu held).
func (g *Gate) enqueue(t *Ticket) {
	g.waiting.Store(true)
	q := &g.fair
	if len(g.queue) == 0 {
		q.vt = 0
	} else {
		q.vt = max(q.vt, g.queue[0].fair.slot.start)
	}
	f := q.flows[t.fair.flow]
	if f == nil {
		f = &flowTurns{last: q.vt}
		q.flows[t.fair.flow] = f
	}
	q.made++
	start := max(q.vt, f.last)
	next := slot{start: start, finish: start + 1/t.fair.weight, made: q.made}
	f.last = next.finish
	t.fair.secondary = t.secondary()
	t.fair.counts.queued++
	t.fair.counts.waiting++
	i := len(f.turns)
	if !t.fair.secondary {
		i = slices.IndexFunc(f.turns, func(o *Ticket) bool { return o.fair.secondary })
	}
	if i < 0 || i == len(f.turns) {
		t.fair.slot = next
		f.turns = append(f.turns, t)
		at, _ := slices.BinarySearchFunc(g.queue, next, func(o *Ticket, s slot) int { return o.fair.slot.compare(s) })
		g.queue = slices.Insert(g.queue, at, t)
		return
	}
	// t takes the slot of its flow's first secondary turn, each of those
	// the next one's, and the last the new slot.
	f.turns = slices.Insert(f.turns, i, t)
	for j := i; j < len(f.turns)-1; j++ {
		f.turns[j].fair.slot = f.turns[j+1].fair.slot
	}
	f.turns[len(f.turns)-1].fair.slot = next
	g.queue = append(g.queue, t)
	slices.SortFunc(g.queue, func(a, b *Ticket) int { return a.fair.slot.compare(b.fair.slot) })
}

// dequeue takes the turn at i out of the queue, admitted at now (g.mu
// held).
func (g *Gate) dequeue(i int, now int64) {
	t := g.queue[i]
	g.removeQueued(i)
	t.fair.counts.waited += now - t.fair.since
}

// unqueue takes t out of the queue without admitting it (g.mu held).
func (g *Gate) unqueue(t *Ticket) {
	if i := slices.Index(g.queue, t); i >= 0 {
		g.removeQueued(i)
	}
}

func (g *Gate) removeQueued(i int) {
	t := g.queue[i]
	g.queue = slices.Delete(g.queue, i, i+1)
	g.waiting.Store(len(g.queue) > 0)
	f := g.fair.flows[t.fair.flow]
	f.turns = slices.DeleteFunc(f.turns, func(o *Ticket) bool { return o == t })
	if len(f.turns) == 0 {
		delete(g.fair.flows, t.fair.flow)
	}
	t.fair.counts.waiting--
	g.fair.table.touch(t.fair.counts)
}

// releaseAll forgets the flows' waiting turns, all let go unadmitted
// (g.mu held).
func (q *fairQueue) releaseAll() {
	for _, f := range q.flows {
		for _, t := range f.turns {
			t.fair.counts.waiting--
		}
	}
	clear(q.flows)
}

// maxFlowsCounted bounds the flows counted apart: a flood of distinct API
// keys must not grow the table. Past it, the flow idle the longest is folded
// into the others' counts.
const maxFlowsCounted = 256

// flowCounts is one flow's counters (or the folded flows').
type flowCounts struct {
	id                        uint64
	waiting                   int
	admitted, queued, refused uint64
	waited                    int64 // nanoseconds the turns admitted from the queue waited
	recent                    *list.Element
}

// flowTable is the flows' counters, the most recently active first.
type flowTable struct {
	byID   map[uint64]*flowCounts
	recent list.List
	// other holds the counts of the flows folded: those idle the longest
	// when the table was full, and those met while every flow counted had
	// turns waiting.
	other flowCounts
}

// counts returns flow's counters, marked active.
func (ft *flowTable) counts(flow uint64) *flowCounts {
	if c := ft.byID[flow]; c != nil {
		ft.touch(c)
		return c
	}
	if len(ft.byID) >= maxFlowsCounted && !ft.foldIdlest() {
		return &ft.other
	}
	c := &flowCounts{id: flow}
	c.recent = ft.recent.PushFront(c)
	ft.byID[flow] = c
	return c
}

func (ft *flowTable) touch(c *flowCounts) {
	if c.recent != nil {
		ft.recent.MoveToFront(c.recent)
	}
}

// foldIdlest folds the flow idle the longest with no turn waiting into the
// others' counts, and reports whether there was one.
func (ft *flowTable) foldIdlest() bool {
	for e := ft.recent.Back(); e != nil; e = e.Prev() {
		c := e.Value.(*flowCounts)
		if c.waiting > 0 {
			continue
		}
		ft.other.admitted += c.admitted
		ft.other.queued += c.queued
		ft.other.refused += c.refused
		ft.other.waited += c.waited
		ft.recent.Remove(e)
		delete(ft.byID, c.id)
		return true
	}
	return false
}

// FlowStatus is one flow's share of load control since the router started.
type FlowStatus struct {
	// ID is the flow's hashed identity (Request.Flow); 0 for the folded
	// flows.
	ID uint64
	// Waiting is the number of its turns in the queue now. Admitted counts
	// its turns admitted, at once or from the queue (forced included),
	// Queued those that had to wait, Refused those a full queue turned
	// away, and Waited the time those admitted from the queue waited in
	// all.
	Waiting                   int
	Admitted, Queued, Refused uint64
	Waited                    time.Duration
}

func (c *flowCounts) status() FlowStatus {
	return FlowStatus{ID: c.id, Waiting: c.waiting, Admitted: c.admitted, Queued: c.queued, Refused: c.refused,
		Waited: time.Duration(c.waited)}
}

// FlowsStatus is load control's flows since the router started.
type FlowsStatus struct {
	// Counted is the flows counted apart, the most recently active first,
	// at most maxFlowsCounted; Other adds up the flows folded out of them.
	Counted []FlowStatus
	Other   FlowStatus
}

// flowStatus returns the flows' counts (g.mu held).
func (ft *flowTable) flowStatus() FlowsStatus {
	st := FlowsStatus{Counted: make([]FlowStatus, 0, ft.recent.Len()), Other: ft.other.status()}
	for e := ft.recent.Front(); e != nil; e = e.Next() {
		st.Counted = append(st.Counted, e.Value.(*flowCounts).status())
	}
	return st
}
