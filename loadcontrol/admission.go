package loadcontrol

import (
	"container/list"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lmwarden/caddy-warden/promptprefix"
)

// Load control (issue 13). When the conversations' prompts no longer fit in
// the replicas' KV caches together, every replica evicts the conversation
// due next and re-prefills it a few seconds later: throughput collapses, as
// Denning's working-set model predicts for memory. The cure is load control:
// a replica keeps a set of resident conversations whose prompts fit in its
// cache, and a turn of any other conversation waits at the proxy until a
// resident one leaves, instead of evicting a resident's cache.
//
// A conversation becomes resident on a replica when one of its turns is
// admitted there, and stays resident while its turns run and for Linger
// after each (its tool pause), so that its next turn finds its cache. The
// queue is first come, first served within a flow, the flows taking turns
// (flows.go): the turn at its head goes first, to its pin when the pin has
// room, else to the least-loaded replica that has (its pin then moves
// there: a conversation that lost residency has most likely lost its cache
// too). Only a stagger lets a turn pass (stagger.go).
//
// Admission holds no goroutine and reads no clock: the proxy waits on the
// ticket in the request's own goroutine (Caddy), or the lab resumes the
// request in virtual time, through the same code.

// Defaults of Config.
const (
	// DefaultFill is a share of the cache, the shared prefix
	// counted once (sharedprefix.go). Below 1, it leaves its residents room
	// to grow: at 1, a replica handed several conversations at their first
	// turn fills exactly, and they outgrow its cache for their whole task
	// (docs/research/policy.md#the-shared-prefix).
	DefaultFill   = 0.95
	DefaultLinger = 6 * time.Second
	DefaultWait   = 5 * time.Minute
	DefaultQueue  = 1024
	// DefaultQuantum: half of the seed workload's conversation, the
	// lab's best tail for the throughput (docs/research/policy.md#load-control).
	DefaultQuantum = 3
	// DefaultMinResidents: a replica holding one conversation idles
	// through each of its tool pauses; two that overflow its cache run
	// more than one that fits.
	DefaultMinResidents = 2
)

// Config is load control's settings; the zero value is off.
type Config struct {
	// Enabled turns load control on (it needs affinity).
	Enabled bool
	// CapacityTokens is each replica's KV cache in tokens; 0 reads it from
	// the replica's metrics (vLLM's num_gpu_blocks × block_size).
	CapacityTokens int
	// Fill is the share of the capacity resident conversations' prompts
	// may take, the prefix they share counted once (sharedprefix.go).
	Fill float64
	// Linger is how long a conversation stays resident after its turn ends.
	Linger time.Duration
	// MaxWait bounds a turn's wait; the caller then lets it proceed (Force).
	MaxWait time.Duration
	// MaxQueue bounds the number of waiting turns; a turn beyond is refused.
	MaxQueue int
	// Quantum is how many turns a conversation keeps its residency while
	// others wait: after that many, it yields at the end of its turn instead
	// of lingering, and its next turn queues behind them, so that waits are
	// spread over conversations' turns rather than all on their first; 0 is
	// DefaultQuantum, negative never yields.
	Quantum int
	// Stagger is how long a replica filling from empty waits between two
	// newcomers, until one of its residents leaves, so that conversations
	// started together do not grow together past its cache (stagger.go);
	// 0 is off.
	Stagger time.Duration
	// MinResidents is how many conversations a replica takes however large
	// they are; 0 is DefaultMinResidents.
	MinResidents int
	// FillMin and FillMax, when set, let each replica's share of cache
	// follow its resident turns' hits between them, from FillMax, once the
	// replies report their cached part; until then it is Fill
	// (fillcontrol.go).
	FillMin, FillMax float64
	// Touch: a replica one of whose residents left takes a newcomer only
	// once each resident idle since before it left has begun a turn again
	// (or left), unless the departed's prompt, its residents' and the
	// newcomer's fit in its cache together: the engine's LRU would
	// otherwise evict, for the newcomer's prefill, the cache of the
	// resident idle longest, the one due back soonest (touch.go).
	Touch bool
}

// WithDefaults fills in c's unset settings.
func (c Config) WithDefaults() Config {
	if c.Fill <= 0 {
		c.Fill = DefaultFill
	}
	if c.Linger <= 0 {
		c.Linger = DefaultLinger
	}
	if c.MaxWait <= 0 {
		c.MaxWait = DefaultWait
	}
	if c.MaxQueue <= 0 {
		c.MaxQueue = DefaultQueue
	}
	if c.Quantum == 0 {
		c.Quantum = DefaultQuantum
	}
	if c.MinResidents <= 0 {
		c.MinResidents = DefaultMinResidents
	}
	return c
}

// TicketState is where a turn stands with load control.
type TicketState uint8

// Ticket states.
const (
	// Admitted: the turn may go to its replica now.
	Admitted TicketState = iota
	// Waiting: the turn is queued; ready is called when it is admitted.
	Waiting
	// Refused: the queue is full; the turn should be answered "overloaded".
	Refused
	// Gone: the turn ended (Done) or left the queue (Cancel).
	Gone
)

// Ticket is one turn's place with load control. Its methods are safe on a
// nil ticket (load control off), which is always admitted.
type Ticket struct {
	view   *View
	key    uint64
	body   Body
	tokens int // the prompt's size, estimated from the body's
	// assumed: the estimate took BytesPerToken, no reply having taught
	// the router yet.
	assumed  bool
	usable   func(string) bool
	ready    func()
	state    TicketState
	res      *resident // set once admitted
	resident bool      // its conversation was resident when it arrived
	side     bool      // a side call of its resident conversation (sidecall.go)
	opened   bool      // its admission made its conversation resident
	// placedBeside: the turn was placed by load (its conversation new, or
	// its pin without room) on a replica that held residents, where its
	// reply's cached part is the prefix it shares with them
	// (sharedprefix.go).
	placedBeside bool
	fair         fairTurn
	admittedAt   int64 // when it was admitted, to time it (idle.go)
}

// resident is a conversation holding its place in a replica's cache.
type resident struct {
	key       uint64
	rep       Replica
	tokens    int
	running   int           // turns admitted and not done
	turns     int           // turns admitted since it became resident
	idleSince int64         // when the last turn ended, if running is 0
	idle      *list.Element // its place in gate.idle while it is idle
	idleOn    *list.Element // and in gate.idleOn[rep]
	// bytes is the body size of its latest own turn that told one: side
	// calls and outgrowing turns are told by their bodies' bytes against
	// it (sidecall.go), as bytes and tokens part ways for images.
	bytes int64
	// taskEnded: the reply of its latest own turn (not a side call) to end
	// ended the agent's task; whichever turn ends last acts on it.
	taskEnded bool
	// unheld: its residency opened while load control stood aside.
	unheld bool
	// placing is its first turn while the routing places it (load control
	// standing aside): the turn's placedBeside follows the pin.
	placing *Ticket
	// flow and weight are its own turns' flow and its weight, output the
	// size of its latest own reply, and leaving is set while a turn of its
	// flow weighs taking its place (flowshare.go).
	flow    uint64
	weight  float64
	output  int
	leaving bool
}

// Gate is one model's load-control state; it outlives config loads, as
// routing's Router does, which holds it.
type Gate struct {
	mu        sync.Mutex
	residents map[uint64]*resident
	held      map[Replica]residency // what each replica holds resident
	// staggering is each replica's state for staggered starts.
	staggering map[Replica]staggering
	// idle lists the residents with no turn running, in the order their
	// turns ended, so that expiry looks only at those due, however many
	// conversations are resident.
	idle list.List
	// idleOn is the same per replica, a replica with none left out.
	idleOn map[Replica]*list.List
	// queue is the waiting turns in the order they are served (flows.go).
	queue []*Ticket
	fair  fairQueue

	admitted, queued, forced, refused, cancelled, taskEnded, sideCalls uint64
	// The replies' usage: how many reported it, how many the cached part,
	// and the tokens of the turns that found their conversation resident
	// and of the others, to tell whether residency kept caches.
	replies, cacheReplies uint64
	resident, nonResident TokenCounts
	// late is the share of idle residents' conversations that came back
	// after their residency expired rather than within it, set over
	// asideAbove and cleared below holdAgainBelow; lack is the share of
	// turns that lacked room, set while load control holds turns, and
	// lackCapacity the caches' tokens when the last was noted (aside.go).
	late, lack   movingShare
	lackCapacity int
	// aside: load control holds no turn, as no turn lacks room or as most
	// conversations come back late.
	aside atomic.Bool
	// waiting: turns wait in the queue, for routing to read without the
	// gate's lock (KeepsResidents).
	waiting atomic.Bool
	// expiries are the residencies that expired recently, oldest first,
	// and expired finds a conversation's, to count its return late
	// (aside.go).
	expiries list.List
	expired  map[uint64]*list.Element
	// owed is, for each replica a resident left, the residents whose
	// cache the engine would evict before the departed's (touch.go).
	owed map[Replica]*departure
	// fill is each replica's fill control (fillcontrol.go).
	fill map[Replica]*fillState
	// pace is how long turns take and residents pause between them
	// (idle.go).
	pace residentPace
}

// TokenCounts adds up replies' prompts and their cached parts.
type TokenCounts struct{ Prompt, Cached uint64 }

func NewGate() *Gate {
	g := &Gate{residents: map[uint64]*resident{}, held: map[Replica]residency{},
		staggering: map[Replica]staggering{}, expired: map[uint64]*list.Element{},
		owed: map[Replica]*departure{}, fill: map[Replica]*fillState{}, idleOn: map[Replica]*list.List{},
		fair: newFairQueue()}
	g.aside.Store(true) // until a turn lacks room (aside.go)
	return g
}

// Body is a request body's size as the proxy knows it.
type Body struct {
	Bytes int64 // 0: unknown
	// Partial: Bytes counts only what was read of a body whose length was
	// not announced, a lower bound; its reply's prompt size then teaches
	// nothing of the bytes per token.
	Partial bool
	// Prefix is the system prompt and tool parts the body declares, read
	// only when load control wants them (WantsPrefix).
	Prefix promptprefix.Prefix
}

// Admit asks load control whether turn, whose request body is body, may go
// to a replica now. The turn waits in its flow's queue (Turn.Flow) and, a
// sub-agent's or a side call, behind its flow's main turns (flows.go). With
// load control off, affinity off or no key, it returns nil: admitted,
// nothing tracked. A Waiting ticket calls ready, once and outside every
// lock, when it is admitted; the caller must then route the turn, and end
// the ticket with Done, or leave the queue with Cancel or Force.
func (v *View) Admit(turn Turn, body Body, ready func()) *Ticket {
	key, now := turn.Key, turn.Now
	if !v.on || key == 0 {
		return nil
	}
	g := v.gate
	t := &Ticket{view: v, key: key, body: body, usable: turn.Usable, ready: ready}
	t.estimate()
	g.mu.Lock()
	t.fair = v.fairTurnOf(turn)
	notify := v.expire(now.UnixNano())
	if g.residents[key] == nil {
		g.noteLateReturn(key, now.UnixNano())
		v.routing.NoteRequestPrefix(key, body.Prefix)
	}
	if g.rides(t) == nil {
		v.noteLack(v.lacksRoom(t))
	}
	switch res := g.rides(t); {
	case res != nil:
		if res.running == 0 {
			g.noteReturn(false)
			g.pace.pause.note(now.UnixNano() - res.idleSince)
		}
		t.resident = true
		g.admit(t, res.rep, now.UnixNano())
	case len(g.queue) == 0 && v.admitOne(t, now.UnixNano(), true):
	case v.headPaced() && v.admitOne(t, now.UnixNano(), false):
	case v.takeEndedPlace(t, now.UnixNano()):
	case len(g.queue) >= v.cfg.MaxQueue:
		t.state = Refused
		g.refused++
		t.fair.counts.refused++
	default:
		t.state = Waiting
		g.enqueue(t)
		g.queued++
	}
	g.mu.Unlock()
	runAll(notify)
	return t
}

// estimate sizes the turn's prompt at the bytes per token learned so far.
// A queued turn is sized again when it is admitted: the replies that ended
// while it waited may have taught the bytes per token, and a turn sized on
// the assumed ones would fill its replica past its share of cache for as
// long as its conversation stays.
func (t *Ticket) estimate() {
	tokens, learned := t.view.routing.EstimateTokens(t.body.Bytes)
	t.tokens, t.assumed = max(tokens, 1), !learned
}

// State reports where the ticket stands.
func (t *Ticket) State() TicketState {
	if t == nil {
		return Admitted
	}
	g := t.view.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	return t.state
}

// Resident reports whether the turn's conversation was resident when the
// turn arrived: load control then expects its prefix to be cached.
func (t *Ticket) Resident() bool { return t != nil && t.resident }

// Reply is what a turn's reply said, as far as the proxy read it
// (replyend); the zero value is a reply not read.
type Reply struct {
	// TaskEnded: the reply called no tool (Anthropic's stop_reason
	// end_turn, OpenAI's finish_reason stop), so the agent's task ended.
	TaskEnded bool
	// PromptTokens is the prompt's size in the server's tokens (0: not
	// reported), CachedTokens its part found in the prefix cache, which
	// CacheReported says the server reported (vLLM needs
	// --enable-prompt-tokens-details).
	PromptTokens, CachedTokens int
	CacheReported              bool
	// OutputTokens is the reply's size in the server's tokens (0: not
	// reported): with the prompt's, it says how many KV cache blocks the
	// turn stored, to follow its conversation's chain from the server's
	// KV cache events (kvevents.Chains.Tail).
	OutputTokens int
}

// Done ends an admitted turn: its conversation stays resident for Linger.
// It is a no-op in any other state, so a deferred Done is always safe.
func (t *Ticket) Done(now time.Time) { t.End(now, Reply{}) }

// End is Done for a turn whose reply was read. A reply that ended the
// agent's task hands the conversation back to a person, whose answer comes
// far later than Linger, so it leaves at once and its room goes to the
// turns waiting. A reply that reported its prompt's size sizes the
// conversation's residency in the server's tokens until its next turn, and
// teaches the router the bytes per token. A side call's reply does neither
// to its conversation (sidecall.go).
func (t *Ticket) End(now time.Time, reply Reply) {
	if t == nil {
		return
	}
	g := t.view.gate
	g.mu.Lock()
	if t.state != Admitted {
		g.mu.Unlock()
		return
	}
	t.state = Gone
	t.res.running--
	if !t.side {
		g.pace.turn.note(now.UnixNano() - t.admittedAt)
	}
	if t.res.placing == t {
		t.res.placing = nil
	}
	// A turn its conversation has since outgrown (a title that opened the
	// residency) is a side call by now.
	side := t.side || sideCall(t, t.res)
	if !side {
		t.res.taskEnded = reply.TaskEnded
		t.res.output = reply.OutputTokens
	}
	underestimated := false
	if reply.PromptTokens > 0 && !t.body.Partial {
		t.view.routing.LearnTokenSize(t.body.Bytes, reply.PromptTokens)
	}
	if reply.PromptTokens > 0 && !side {
		g.countReply(t.resident, reply)
		if t.resident && (reply.CacheReported || g.cacheReplies > 0) {
			t.view.observeFill(t.res.rep, reply)
		}
		// vLLM leaves the cached part out when it is 0: once it has
		// reported one, a reply without it found nothing cached.
		if t.placedBeside && (reply.CacheReported || g.cacheReplies > 0) {
			t.view.routing.NoteReplyPrefix(min(reply.CachedTokens, reply.PromptTokens))
		}
		if t.res.running == 0 {
			underestimated = t.assumed && float64(reply.PromptTokens) > underestimateSlack*float64(t.tokens)
			g.resize(t.res, reply.PromptTokens)
			if t.view.overShare(t.res.rep) {
				t.view.noteLack(true) // its residents outgrew their share (aside.go)
			}
		}
	}
	if t.res.running == 0 {
		q := t.view.cfg.Quantum
		switch {
		case t.res.taskEnded && !t.view.keeps(t.res):
			g.drop(t.res, now.UnixNano())
			g.taskEnded++
		case q > 0 && t.res.turns >= q && len(g.queue) > 0 && !t.view.keeps(t.res):
			g.drop(t.res, now.UnixNano()) // its quantum is used up and others wait: it yields
		case t.view.crowds(t.res):
			g.drop(t.res, now.UnixNano()) // it yields to a flow within its share (flowshare.go)
		case underestimated && !t.view.fits(t.res.rep):
			g.drop(t.res, now.UnixNano()) // admitted on a size too small, it overfills its replica
		case t.res.unheld && !g.aside.Load() && t.view.overflows(t.res.rep):
			g.drop(t.res, now.UnixNano()) // let in while load control stood aside, it overflows its replica (aside.go)
		default:
			t.res.idleSince = now.UnixNano()
			g.pushIdle(t.res)
		}
	}
	notify := t.view.expire(now.UnixNano())
	g.mu.Unlock()
	runAll(notify)
}

// Cancel takes a waiting turn out of the queue (its client went away) and
// reports whether it was waiting. An admitted turn is ended as by Done,
// except one admitted as its client left to a residency its admission
// opened and no other turn was admitted to: never sent, it ends that
// residency at once.
func (t *Ticket) Cancel(now time.Time) bool {
	if t == nil {
		return false
	}
	g := t.view.gate
	g.mu.Lock()
	if t.state == Admitted && t.opened && t.res.running == 1 && t.res.turns == 1 {
		// Admitted as its client left, it was never sent: the residency it
		// alone was admitted to keeps no room.
		t.state = Gone
		t.res.running--
		g.drop(t.res, 0) // never sent: it cached nothing
		g.cancelled++
		notify := t.view.expire(now.UnixNano())
		g.mu.Unlock()
		runAll(notify)
		return false
	}
	if t.state != Waiting {
		g.mu.Unlock()
		t.Done(now)
		return false
	}
	g.unqueue(t)
	t.state = Gone
	g.cancelled++
	notify := t.view.admitQueued(now.UnixNano())
	g.mu.Unlock()
	runAll(notify)
	return true
}

// Force admits a waiting turn over capacity (it waited MaxWait) and reports
// whether it was waiting; it goes to its pin, or is placed by load.
func (t *Ticket) Force(now time.Time) bool {
	if t == nil {
		return false
	}
	g := t.view.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	if t.state != Waiting {
		return false
	}
	g.unqueue(t)
	g.forced++
	t.fair.counts.waited += now.UnixNano() - t.fair.since
	t.estimate()
	pin := t.view.routing.Pin(t.key, now.UnixNano())
	rep := pin
	if rep == nil || !t.view.routing.Usable(rep, t.usable) {
		rep = t.view.routing.Lightest(t.usable, t.key, nil)
	}
	if rep == nil {
		t.state = Gone // Pick will find no replica either
		return true
	}
	if rep != pin {
		g.tookNewcomer(rep, now.UnixNano())
	}
	g.admit(t, rep, now.UnixNano())
	return true
}

// ReleaseWaiting lets every waiting turn go at once, unadmitted, as if it
// had never been held: load control no longer holds turns (a reload
// turned it off, or its model left the config), and nothing would admit
// them before max_wait.
func (g *Gate) ReleaseWaiting() {
	g.mu.Lock()
	var notify []func()
	for _, t := range g.queue {
		t.state = Gone
		if t.ready != nil {
			notify = append(notify, t.ready)
		}
	}
	g.queue = nil
	g.waiting.Store(false)
	g.fair.releaseAll()
	g.mu.Unlock()
	runAll(notify)
}

// admit makes t's conversation resident on rep at now (g.mu held).
func (g *Gate) admit(t *Ticket, rep Replica, now int64) {
	res := g.residents[t.key]
	t.side = res != nil && sideCall(t, res)
	if res == nil {
		res = &resident{key: t.key, unheld: g.aside.Load()}
		g.residents[t.key] = res
		t.opened = true
	} else {
		g.unlinkIdle(res)
		g.hold(res, -1)
		if res.rep != rep {
			g.residentLeft(res.rep)
		}
	}
	res.rep = rep
	if !t.side {
		res.flow, res.weight = t.fair.flow, t.fair.weight
		res.tokens = t.tokens
		res.turns++
		res.taskEnded = false
		if t.body.Bytes > 0 && !t.body.Partial {
			res.bytes = t.body.Bytes
		}
	}
	g.hold(res, +1)
	res.running++
	t.res, t.state, t.admittedAt = res, Admitted, now
	g.admitted++
	t.fair.counts.admitted++
	if t.side {
		g.sideCalls++
	}
}

// hold adds (sign +1) or removes (-1) res to what its replica holds.
func (g *Gate) hold(res *resident, sign int) {
	h := g.held[res.rep]
	h.count += sign
	h.tokens += sign * res.tokens
	g.held[res.rep] = h
	g.fair.holdFlow(res, sign)
}

// underestimateSlack is how much larger than its estimate a prompt sized
// before any reply taught the bytes per token may turn out before its
// conversation, should its replica overflow, yields: the assumed
// BytesPerToken may be far from the tokenizer's, and a replica filled at
// start on sizes too small thrashes for as long as its residents stay.
// Later turns are sized at the learned bytes per token; a conversation
// denser than the mean is not made to yield turn after turn.
const underestimateSlack = 1.05

// fits reports whether what s holds resident fits in its share of cache.
func (v *View) fits(s Replica) bool { return v.hasRoom(s, 0) }

// resize sets what res holds to tokens.
func (g *Gate) resize(res *resident, tokens int) {
	g.hold(res, -1)
	res.tokens = tokens
	g.hold(res, +1)
}

// countReply adds a reply's usage to the counts of its kind of turn.
func (g *Gate) countReply(resident bool, reply Reply) {
	g.replies++
	c := &g.nonResident
	if resident {
		c = &g.resident
	}
	c.Prompt += uint64(reply.PromptTokens)
	if reply.CacheReported {
		g.cacheReplies++
		c.Cached += uint64(min(reply.CachedTokens, reply.PromptTokens))
	}
}

// drop ends res's residency at now (0: it was never sent, and cached
// nothing).
func (g *Gate) drop(res *resident, now int64) {
	g.unlinkIdle(res)
	g.hold(res, -1)
	delete(g.residents, res.key)
	g.residentLeft(res.rep)
	g.left(res, now)
}

// pushIdle appends res, whose turn just ended, to the idle lists.
func (g *Gate) pushIdle(res *resident) {
	res.idle = g.idle.PushBack(res)
	on := g.idleOn[res.rep]
	if on == nil {
		on = list.New()
		g.idleOn[res.rep] = on
	}
	res.idleOn = on.PushBack(res)
}

// moveTo files res under replica to, in its place in to's idle list if it
// is idle.
func (g *Gate) moveTo(res *resident, to Replica) {
	if res.idle == nil {
		res.rep = to
		return
	}
	from := g.idleOn[res.rep]
	from.Remove(res.idleOn)
	if from.Len() == 0 {
		delete(g.idleOn, res.rep)
	}
	res.rep = to
	on := g.idleOn[to]
	if on == nil {
		on = list.New()
		g.idleOn[to] = on
	}
	e := on.Back()
	for e != nil && e.Value.(*resident).idleSince > res.idleSince {
		e = e.Prev()
	}
	if e == nil {
		res.idleOn = on.PushFront(res)
	} else {
		res.idleOn = on.InsertAfter(res, e)
	}
}

func (g *Gate) unlinkIdle(res *resident) {
	if res.idle == nil {
		return
	}
	g.idle.Remove(res.idle)
	on := g.idleOn[res.rep]
	on.Remove(res.idleOn)
	if on.Len() == 0 {
		delete(g.idleOn, res.rep)
	}
	res.idle, res.idleOn = nil, nil
}

// expire ends the residency of conversations idle past Linger, but those
// kept for a flow within its share (flowshare.go), then admits queued
// turns into the room freed (g.mu held); it returns the ready callbacks to
// run once the lock is released. Only the residents due are looked at: the
// idle list is in the order their turns ended.
func (v *View) expire(now int64) []func() {
	g := v.gate
	linger := int64(v.cfg.Linger)
	for e := g.idle.Front(); e != nil && now-e.Value.(*resident).idleSince >= linger; {
		res := e.Value.(*resident)
		e = e.Next()
		if !v.keepsIdle(res, now) {
			g.drop(res, now)
			g.noteExpiry(res, now, linger)
		}
	}
	return v.admitQueued(now)
}

// admitQueued admits queued turns in order while the head finds room. A
// head that has room but waits for a replica's stagger holds back only the
// turns that would take a replica anew: a turn going to its own replica,
// with room, passes it.
func (v *View) admitQueued(now int64) []func() {
	g := v.gate
	var notify []func()
	headBlocked := false
	for i := 0; i < len(g.queue); {
		t := g.queue[i]
		if headBlocked && g.rides(t) == nil && !v.hasEndedPlace(t) {
			i++ // the head waits for room: only a turn riding its conversation's residency, or taking its flow's (flowshare.go), which takes none, passes it
			continue
		}
		t.estimate()
		switch {
		case t.view.admitOne(t, now, i == 0):
			g.dequeue(i, now)
			if t.ready != nil {
				notify = append(notify, t.ready)
			}
		case i > 0 || t.view.pacedOnly(t):
			i++
		default:
			headBlocked = true
			i++
		}
	}
	return notify
}

// admitResident admits t (g.mu held) to the replica its conversation is
// resident on, if it is: another of its turns was admitted meanwhile.
func (g *Gate) admitResident(t *Ticket, now int64) bool {
	res := g.rides(t)
	if res == nil {
		return false
	}
	g.admit(t, res.rep, now)
	return true
}

// admitOne admits t (g.mu held) to the replica its conversation is resident
// on, else to its pin if the pin has room for its tokens, else, if
// newcomer, to the least-loaded replica that has room and may take a
// newcomer now, or else to an idle replica whose residents run little
// (idle.go: for a turn that lacks room, or that waits only for pacing where
// that replica holds two residents or more and its stagger lets it take a
// newcomer), moving the pin there.
func (v *View) admitOne(t *Ticket, now int64, newcomer bool) bool {
	g := v.gate
	if g.admitResident(t, now) || v.takeEndedPlace(t, now) {
		return true
	}
	pin := v.routing.Pin(t.key, now)
	if pin != nil && v.routing.Usable(pin, t.usable) && v.roomFor(pin, t) {
		g.admit(t, pin, now)
		return true
	}
	if !newcomer {
		return false
	}
	healthy := v.routing.AnyHealthy(t.usable)
	s := v.routing.Lightest(t.usable, t.key, func(s Replica) bool {
		return v.mayTakeNewcomer(s, now) && v.takes(s, t, healthy) && v.touchedAll(s, now, t.tokens)
	})
	if s == nil {
		s = v.idleReplica(t, pin, now)
	}
	if s == nil {
		return false
	}
	t.placedBeside = g.held[s].count > 0
	if g.aside.Load() {
		// Standing aside, it leaves the placement to the routing, as
		// without load control: the residency follows the pin (follow).
		g.admit(t, s, now)
		t.res.placing = t
		return true
	}
	g.tookNewcomer(s, now)
	g.admit(t, s, now)
	v.routing.Settle(t.key, s, now)
	return true
}

// takes reports whether s may take a new conversation's turn of tokens: it
// has room, and it is healthy unless no replica is (anyHealthy). Health
// read from /metrics may be wrong everywhere, and without load control
// those turns would be sent anyway.
func (v *View) takes(s Replica, t *Ticket, anyHealthy bool) bool {
	return (v.routing.Healthy(s) || !anyHealthy) && v.roomFor(s, t)
}

// hasRoom reports whether a prompt of tokens more (0: none, whether what s
// holds fits) fits in s's share of cache, the shared prefix counted once;
// a replica that would hold at most MinResidents takes any conversation,
// however long, and every replica takes any while load control steps
// aside.
func (v *View) hasRoom(s Replica, tokens int) bool {
	return v.room(s, v.gate.held[s], tokens, false)
}

// roomFor is hasRoom for t's turn.
func (v *View) roomFor(s Replica, t *Ticket) bool {
	return v.room(s, v.heldBesides(s, t), t.tokens, v.withinShare(t))
}

// heldBesides is what s holds besides t's conversation, which, resident on
// s (a turn that outgrew its residency), counts at t's size only.
func (v *View) heldBesides(s Replica, t *Ticket) residency {
	held := v.gate.held[s]
	if res := v.gate.residents[t.key]; res != nil && res.rep == s {
		held.count--
		held.tokens -= res.tokens
	}
	return held
}

// room reports whether s, holding held, has room for a prompt of tokens
// more; gpuOnly judges it at the GPU's room while flows share the fleet
// (flowshare.go).
func (v *View) room(s Replica, held residency, tokens int, gpuOnly bool) bool {
	return v.gate.aside.Load() || v.roomHolding(s, held, tokens, gpuOnly)
}

// roomHolding is room as load control judges it while it holds turns.
func (v *View) roomHolding(s Replica, held residency, tokens int, gpuOnly bool) bool {
	if n, _ := held.with(tokens); n <= v.cfg.MinResidents {
		return true
	}
	reserve := v.keptReserve(s)
	capacity := v.roomOf(s, reserve, gpuOnly)
	if capacity <= 0 {
		return true // unknown capacity: no control rather than none served
	}
	return float64(v.distinct(held, tokens)+reserve) <= v.fillOf(s)*float64(capacity)
}

// capacityOf is s's KV cache in tokens: the configured one, else its
// metrics', its GPU's alone while flows share the fleet (flowshare.go); 0
// when unknown.
func (v *View) capacityOf(s Replica) int {
	if c := v.cfg.CapacityTokens; c > 0 {
		return c
	}
	if v.gate.fair.several() {
		return v.routing.GPUKVTokens(s)
	}
	return v.routing.KVTokens(s)
}

func runAll(fns []func()) {
	for _, f := range fns {
		f()
	}
}

// Status is load control's state and counters since the gate was made.
type Status struct {
	Enabled bool
	// Waiting is the number of turns in the queue now.
	Waiting int
	// Admitted counts turns admitted, at once or from the queue (Forced
	// included); Queued those that had to wait; Forced those admitted over
	// capacity after MaxWait; Refused those turned away by a full queue;
	// Cancelled those whose client left while they waited; TaskEnded the
	// turns whose reply ended the agent's task, their conversation leaving
	// at once (Ticket.End); SideCalls the turns admitted as side calls of
	// their resident conversation, which neither sized nor ended its
	// residency (sidecall.go).
	Admitted, Queued, Forced, Refused, Cancelled, TaskEnded, SideCalls uint64
	// Replies counts the turns whose reply reported its prompt's size, and
	// CacheReplies those that reported its cached part; BytesPerToken is
	// the request bodies' bytes per token learned from them.
	Replies, CacheReplies uint64
	BytesPerToken         float64
	// Resident adds up the prompts, and their cached parts, of the turns
	// whose conversation was resident when they arrived; NonResident those
	// of the others (a new conversation, or one that waited): residency
	// works when the first find most of their prompt cached.
	Resident, NonResident TokenCounts
	// LateShare is the share of idle residents whose residency expired
	// rather than their conversation came back, and LackShare the share of
	// turns that lacked room, recent ones weighing most; SteppedAside is
	// set until a turn lacks room and once LackShare is below 1/32, and
	// while LateShare is over 0.5 (cleared below 0.35); every turn is
	// admitted at once meanwhile (aside.go).
	LateShare, LackShare float64
	SteppedAside         bool
	// SharedPrefix is the prefix, in tokens, new conversations share with
	// others, counted once per replica, and SharedPrefixSource where it was
	// read (sharedprefix.go).
	SharedPrefix       int
	SharedPrefixSource SharedPrefixSource
}

// residency is what a replica holds resident.
type residency struct{ count, tokens int }

// ReplicaStatus is what load control holds on a replica: its residents
// and their prompts' tokens, the shared prefix counted once
// (sharedprefix.go); when it may next take a newcomer while it fills from
// empty (stagger.go; zero: not so paced); and the share of its KV cache
// its residents may take now (fillcontrol.go).
type ReplicaStatus struct {
	Residents, ResidentTokens int
	NextNewcomer              time.Time
	Fill                      float64
}

// Status fills st and flows and returns what each of the view's replicas
// holds.
func (v *View) Status(st *Status, flows *FlowsStatus) map[Replica]ReplicaStatus {
	g := v.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	*st = Status{
		Enabled: v.on,
		Waiting: len(g.queue), Admitted: g.admitted, Queued: g.queued,
		Forced: g.forced, Refused: g.refused, Cancelled: g.cancelled, TaskEnded: g.taskEnded,
		SideCalls: g.sideCalls,
		Replies:   g.replies, CacheReplies: g.cacheReplies, BytesPerToken: v.routing.BytesPerToken(),
		Resident: g.resident, NonResident: g.nonResident,
		LateShare: g.late.share, LackShare: g.lack.share, SteppedAside: v.on && g.aside.Load(),
	}
	st.SharedPrefix, st.SharedPrefixSource = v.routing.SharedPrefix()
	*flows = g.fair.table.flowStatus()
	replicas := v.routing.Replicas()
	out := make(map[Replica]ReplicaStatus, len(replicas))
	for _, s := range replicas {
		h := g.held[s]
		out[s] = ReplicaStatus{h.count, v.distinct(h, 0), v.nextNewcomer(s), v.fillOf(s)}
	}
	return out
}
