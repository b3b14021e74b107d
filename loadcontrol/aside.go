package loadcontrol

import (
	"container/list"
	"time"
)

// Stepping aside. Load control pays when a conversation comes back within
// Linger of its turn's end: its residency kept its cache for that turn.
// Agents whose tools, or whose people, take longer come back after their
// residency ended, and holding turns then only keeps the replicas below the
// concurrency they could run, for no cache kept
// (docs/research/policy.md#load-control-across-think-times).
//
// So load control follows, for each idle resident, whether its
// conversation came back in time or after its residency expired, and
// while most come back late it steps aside: every turn is admitted at
// once, new conversations are not staggered, and rehoming judges caches as
// it does without load control. It keeps tracking residents meanwhile, and
// takes over again once clearly fewer come back late. A late return counts
// when the conversation comes back, not when its residency expires: agents
// that stop (a farm's batch ends, its runner is killed) leave residencies
// that expire and never come back, which say nothing of their pauses. A
// resident that left otherwise (its reply ended its task, it yielded after
// its quantum or to an underestimate) neither came back in time nor late,
// and neither does one whose expiry load control was not there to see
// (off, then on again after a reload).

const (
	// asideAbove is the late share above which load control steps aside,
	// and holdAgainBelow the one below which it takes over again: apart,
	// so that a share near either does not flip it at every return.
	asideAbove     = 0.5
	holdAgainBelow = 0.35
)

// noteReturn records that an idle resident's conversation came back in
// time (late false) or after its residency expired (g.mu held).
func (g *Gate) noteReturn(late bool) {
	g.late.note(late, asideAbove, holdAgainBelow)
	g.updateAside()
}

// updateAside sets whether load control stands aside: while turns find
// room, or while most conversations come back late (g.mu held).
func (g *Gate) updateAside() {
	g.aside.Store(g.late.set || !g.lack.set)
}

// shareWeight is the weight of one event in a movingShare: about the last
// 16 count.
const shareWeight = 1.0 / 16

// movingShare is the share of recent events that were hits, recent ones
// weighing most, and a flag set once it is over one bound and cleared once
// it is below another.
type movingShare struct {
	share float64
	set   bool
}

// note adds an event to m.
func (m *movingShare) note(hit bool, setAbove, clearBelow float64) {
	x := 0.0
	if hit {
		x = 1
	}
	m.share += shareWeight * (x - m.share)
	if m.set {
		m.set = m.share >= clearBelow
	} else {
		m.set = m.share > setAbove
	}
}

// Engaging. Holding pays only where turns lack room: where the
// conversations' prompts fit in the caches together, the default routing
// keeps each on its cached replica, and load control's holds and pacing
// (stagger, touch) only add waits. So load control starts stepped aside,
// tracking what each replica holds resident all the same, and follows
// whether turns lack room: a turn whose conversation is not resident when
// it arrives (a new one, or one back after its residency ended) lacks it
// when no replica would have room for it were load control holding turns,
// and a resident turn whose reply grew its replica's residents past their
// share of cache lacks it too (conversations admitted together grow
// together). Load control engages at the first turn that lacks room, and
// steps aside again once the turns arriving find room: once the working
// set has shrunk below the caches again.
//
// A conversation let in while load control stood aside may then overflow
// its replica's cache beside the others: when load control holds turns, it
// yields at the end of its turn, as one admitted on an underestimate does.

// lackBound is the lack share over which load control engages and below
// which it steps aside: a single lack takes the share over it, so that a
// farm launched at once is held from its first turn that overflows, and
// about 11 turns that found room bring it back below.
const lackBound = shareWeight / 2

// noteLack records whether a turn lacked room (g.mu held). The lacks
// judged against caches since found a quarter larger or more (a replica's
// host tier, which is sized once it has stored some blocks, or given back
// when the last flow but one leaves: flowshare.go) are forgotten: they no
// longer say that turns lack room, and one flow beside a tier is served as
// it would be alone.
func (v *View) noteLack(lacked bool) {
	g, capacity := v.gate, 0
	for _, s := range v.routing.Replicas() {
		capacity += v.capacityOf(s)
	}
	if g.lackCapacity > 0 && capacity > g.lackCapacity+g.lackCapacity/4 {
		g.lack = movingShare{}
	}
	g.lackCapacity = capacity
	g.lack.note(lacked, lackBound, lackBound)
	g.updateAside()
}

// Engage makes load control hold turns from now, as a run of turns that
// lacked room does; it steps aside again by the same rules. Tests of how it
// holds start with it.
func (g *Gate) Engage() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lack = movingShare{share: 1, set: true}
	g.updateAside()
}

// lacksRoom reports whether t, its conversation not resident, would find
// room on no usable replica were load control holding turns (g.mu held).
func (v *View) lacksRoom(t *Ticket) bool {
	for _, s := range v.routing.Replicas() {
		if v.routing.Usable(s, t.usable) && v.roomHolding(s, v.heldBesides(s, t), t.tokens, true) {
			return false
		}
	}
	return true
}

// overShare reports whether what s holds resident is over its share of
// cache (g.mu held).
func (v *View) overShare(s Replica) bool {
	return !v.roomHolding(s, v.gate.held[s], 0, true)
}

// overflows reports whether what s holds resident is over its whole
// cache: its residents evict one another (g.mu held).
func (v *View) overflows(s Replica) bool {
	capacity, held := v.capacityOf(s), v.gate.held[s]
	return capacity > 0 && held.count > v.cfg.MinResidents && v.distinct(held, 0) > capacity
}

// expirySeenWithin is how late past its due time (Linger after its turn
// ended) an expiry is still seen in time: expiries are seen by the next
// turn's Admit or by the sweep, every second.
const expirySeenWithin = 2 * time.Second

// noteExpiry remembers the expiry of res, due at Linger after its turn
// ended, if seen in time, so that its conversation's return counts late:
// an expiry seen long after it was due (load control was off meanwhile)
// says nothing of when its conversation came back (g.mu held). Expiries
// are kept in the order they were seen: those past lateReturnWithin are
// forgotten, and the oldest once expiriesKept are kept.
func (g *Gate) noteExpiry(res *resident, now, linger int64) {
	if now-res.idleSince >= linger+int64(expirySeenWithin) {
		return
	}
	for e := g.expiries.Front(); e != nil && now-e.Value.(expiry).at > int64(lateReturnWithin); e = g.expiries.Front() {
		g.forgetExpiry(e)
	}
	if g.expiries.Len() >= expiriesKept {
		g.forgetExpiry(g.expiries.Front())
	}
	if e := g.expired[res.key]; e != nil {
		g.forgetExpiry(e)
	}
	g.expired[res.key] = g.expiries.PushBack(expiry{res.key, now})
}

// expiry is a residency's end, remembered until its conversation returns.
type expiry struct {
	key uint64
	at  int64
}

func (g *Gate) forgetExpiry(e *list.Element) {
	delete(g.expired, e.Value.(expiry).key)
	g.expiries.Remove(e)
}

const (
	// expiriesKept bounds the expiries remembered: a flood of
	// conversations that never come back cannot grow them.
	expiriesKept = 4096
	// lateReturnWithin is how long after its residency expired a
	// conversation's return still counts late: later, its agent stopped
	// and another run took its name, or a person came back.
	lateReturnWithin = 5 * time.Minute
)

// noteLateReturn counts the return of key, not resident, as late if its
// residency expired recently (g.mu held).
func (g *Gate) noteLateReturn(key uint64, now int64) {
	e := g.expired[key]
	if e == nil {
		return
	}
	g.forgetExpiry(e)
	if now-e.Value.(expiry).at <= int64(lateReturnWithin) {
		g.noteReturn(true)
	}
}

// Follow moves key's residency, if any, to its pin, where the routing
// pinned the conversation anew at now (rehomed while load control steps
// aside, its pin down, its prompt compacted, adopted from a shared pin
// table): what it holds is counted where its turns now go, and it is a
// newcomer there. The pin is read again under the gate's lock, so that of
// two moves of one conversation ending out of order, the last pin wins.
func (v *View) Follow(key uint64, now int64) {
	g := v.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	res := g.residents[key]
	if res == nil {
		return
	}
	pin := v.routing.Pin(key, now)
	if pin == nil || pin == res.rep {
		return
	}
	if res.placing != nil {
		res.placing.placedBeside = g.held[pin].count > 0
	}
	g.hold(res, -1)
	g.residentLeft(res.rep)
	g.moveTo(res, pin)
	g.hold(res, +1)
	g.tookNewcomer(pin, now)
}

// KeepsResidents reports whether load control holds turns and some wait
// for room now: routing then leaves its residents on their replicas, as a
// move would take room the waiting turns are owed. While none waits, a
// resident's turn may move by its expected cost as without load control,
// its residency following it (Follow): no waiting turn is owed the room it
// takes.
func (v *View) KeepsResidents() bool {
	return v.cfg.Enabled && !v.gate.aside.Load() && v.gate.waiting.Load()
}
