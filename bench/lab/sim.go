package lab

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/hitbound"
	"github.com/lmwarden/caddy-warden/bench/report"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/tokenizer"
	"github.com/lmwarden/caddy-warden/loadcontrol"
	"github.com/lmwarden/caddy-warden/promptprefix"
	"github.com/lmwarden/caddy-warden/selection"
)

// epoch is the wall-clock instant of virtual time 0, for the Results and the router.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func virtualTime(d time.Duration) time.Time { return epoch.Add(d) }

const (
	// busySampleInterval is how often the busy replicas are counted (DESIGN §1).
	busySampleInterval = time.Second
	// errorRetryDelay is how long a slot whose request failed waits before
	// starting a new session: over HTTP an error reply takes time, and in
	// virtual time an instant retry of a request that always fails would
	// never let the clock move.
	errorRetryDelay = 100 * time.Millisecond
	// notAdmitted marks an engine request that no engine has scheduled yet:
	// the engine overwrites CachedTokens when it first schedules a request,
	// the moment it counts the request's prefix-cache query.
	notAdmitted = -1
)

// simFleet is the simulated engines and what outlives a run on a warm fleet.
type simFleet struct {
	engines   []*engine.Engine
	addresses []string
	bound     *hitbound.Bound
	clock     time.Duration // virtual time reached; the next run starts here
}

// newFleet makes the engines: the Replicas, then the SmallReplicas.
func newFleet(cfg Config) (*simFleet, error) {
	f := &simFleet{bound: hitbound.New(cfg.Profile.BlockSize)}
	for i := range cfg.Replicas + cfg.SmallReplicas {
		e, err := engine.New(cfg.Profile)
		if err != nil {
			return nil, err
		}
		f.engines = append(f.engines, e)
		// As a servers topology would list them behind Caddy.
		port := 8001 + i
		if i >= cfg.Replicas {
			port = 9001 + i - cfg.Replicas
		}
		f.addresses = append(f.addresses, fmt.Sprintf("127.0.0.1:%d", port))
	}
	return f, nil
}

// counters adds up the counters of the engines [first, first+n).
func (f *simFleet) counters(first, n int) engine.Stats {
	var sum engine.Stats
	for _, e := range f.engines[first : first+n] {
		s := e.Stats()
		sum.PrefixCacheQueries += s.PrefixCacheQueries
		sum.PrefixCacheHits += s.PrefixCacheHits
		sum.ExternalPrefixCacheHits += s.ExternalPrefixCacheHits
		sum.Preemptions += s.Preemptions
		sum.GenerationTokens += s.GenerationTokens
		for i, n := range s.RequestSuccess {
			sum.RequestSuccess[i] += n
		}
	}
	return sum
}

type eventKind uint8

const (
	eventTask      eventKind = iota // index: a policy task
	eventSample                     // count busy replicas
	eventSend                       // index: a slot sends its session's next turn
	eventStepStart                  // index: an engine starts a step if it has work
	eventStepEnd                    // index: an engine's step ends; its tokens arrive
	eventMeasure                    // the warm-up ends: the measured window starts
)

type event struct {
	at    time.Duration
	seq   uint64 // ties run in the order they were scheduled
	kind  eventKind
	index int
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	return q[i].at < q[j].at || q[i].at == q[j].at && q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// slot is one closed-loop user: it keeps one session busy, one request at a time.
type slot struct {
	person  int // its index in sim.people
	session *agentload.Session
	current *request
	// side is the side call sent with the current turn, while in flight;
	// waitSide is set when the turn ended first: the agent goes on when
	// both have ended, as the HTTP runner does.
	side     *request
	waitSide bool
	// unhold drops the turn a Holder policy holds, nil when none is held.
	unhold func() bool
	paused bool // the pending turn's think time has passed
	// awaited is set while the session, its first request sent in the
	// measured window, has not ended: the run goes on until it does.
	awaited bool
	prompt  promptMemo
	arrived []uint64 // the block hashes of the slot's last prompt the hit bound took
	lastKey uint64   // the key of the conversation whose last turn it keeps
}

// lastTurn is a conversation's last turn that ended, and the refresh of it
// an engine runs, nil when none.
type lastTurn struct {
	turn, refresh *engine.Request
}

// request is one turn in flight.
type request struct {
	slot     int
	engine   int
	release  func(loadcontrol.Reply)
	final    bool // its reply ends the agent's task
	side     bool // a side call, to the small model's engines
	session  *agentload.Session
	req      *engine.Request
	boundHit int // the hit bound's tokens for this prompt
	// warmup is set for a request the engine admitted before the measured
	// window: the engines' counters of the window do not include it.
	warmup bool
	// early is how many of its tokens the engine generated before the
	// window opened: they are not the window's output.
	early    int
	received int // tokens delivered to the client
	result   agentload.Result
}

// sim is one run: a policy serving a level of sessions over [start, end],
// measured over [measured, end] after the warm-up, then on past end, at the
// same load but measured no more, until the conversations sent in the window
// have ended or Config.ConversationTail has passed, so that each of them is
// timed to its end.
type sim struct {
	env    *Env
	fleet  *simFleet
	policy Policy
	// people are whose sessions the slots hold: one without Config.People.
	people               []personRun
	seed                 int64
	start, measured, end time.Duration
	now                  time.Duration
	measuring            bool

	queue      eventQueue
	seq        uint64
	stepping   []bool           // a step of the engine is scheduled or running
	stepEvents [][]engine.Event // tokens of each engine's running step
	slots      []slot
	byRequest  map[*engine.Request]*request
	// lastTurns are each conversation's last turn that ended (side calls
	// aside) by its routing key, which a refresh sends again (Env.Refresh).
	lastTurns map[uint64]*lastTurn
	// results holds one final result per request. When the run goes on
	// past the window, windowCut holds the window's view of the requests
	// in flight at its end: cut then, as the HTTP runner records them,
	// though they go on to finish after it.
	results   []agentload.Result
	windowCut []agentload.Result
	// awaited counts the conversations sent in the window still under way.
	awaited int
	// personOf is each session's person, with Config.People.
	personOf map[string]int

	// busyTotal, boundHits and boundQueries are by model (Config.models).
	busySamples             int
	busyTotal               []int
	boundHits, boundQueries []uint64
	routed                  int
}

// personRun is a person's part of a run: its sessions' generator, their
// prefix parts (the run's system prompt) and its flow.
type personRun struct {
	gen        *agentload.Generator
	prefix     promptprefix.Prefix
	sidePrefix promptprefix.Prefix // of its side calls
	flow       string
	weight     float64
}

// outcome is a run's measurements, with what the tests check besides the row.
type outcome struct {
	sim     *sim
	summary agentload.Summary
	// models are each model's measurements (Config.models).
	models []modelOutcome
}

// modelOutcome is a model's part of a run's measurements: its engines
// [first, first+engines), the summary of its requests, and with people
// each one's.
type modelOutcome struct {
	name           string
	first, engines int
	summary        agentload.Summary
	people         []agentload.Summary
	before, after  engine.Stats
}

func simulate(env *Env, policy Policy, sessions int, seed int64) (*outcome, error) {
	cfg := env.Config()
	f := env.fleet
	s := &sim{
		env: env, fleet: f, policy: policy, seed: seed,
		start: f.clock, measured: f.clock + cfg.Warmup, end: f.clock + cfg.Warmup + cfg.Duration, now: f.clock,
		stepping:   make([]bool, len(f.engines)),
		stepEvents: make([][]engine.Event, len(f.engines)),
		slots:      make([]slot, sessions),
		byRequest:  map[*engine.Request]*request{},
		lastTurns:  map[uint64]*lastTurn{},
	}
	out := &outcome{sim: s}
	for i, name := range cfg.models() {
		m := modelOutcome{name: name, engines: cfg.Replicas}
		if i > 0 {
			m.first, m.engines = cfg.Replicas, cfg.SmallReplicas
		}
		out.models = append(out.models, m)
	}
	s.busyTotal, s.boundHits, s.boundQueries = make([]int, len(out.models)), make([]uint64, len(out.models)), make([]uint64, len(out.models))
	if err := s.seat(sessions); err != nil {
		return nil, err
	}
	env.run = s
	// The window opens before anything else scheduled at its instant.
	s.schedule(s.measured, eventMeasure, 0)
	// Policy tasks first, so that a metrics poll at the start precedes the
	// first requests, as a proxy started before the load would have polled.
	for i, t := range env.tasks {
		s.schedule(max(t.next, s.start), eventTask, i)
	}
	s.schedule(s.measured+busySampleInterval, eventSample, 0)
	for i := range s.slots {
		s.schedule(s.start, eventSend, i)
	}
	next := func() {
		ev := heap.Pop(&s.queue).(event)
		s.now = ev.at
		switch ev.kind {
		case eventTask:
			t := env.tasks[ev.index]
			t.fn(s.now)
			t.next = s.now + t.interval
			s.schedule(t.next, eventTask, ev.index)
		case eventSample:
			if s.measuring {
				s.sampleBusy()
				s.schedule(s.now+busySampleInterval, eventSample, 0)
			}
		case eventSend:
			s.send(ev.index)
		case eventStepStart:
			s.startStep(ev.index)
		case eventStepEnd:
			s.endStep(ev.index)
		case eventMeasure:
			for i := range out.models {
				m := &out.models[i]
				m.before = f.counters(m.first, m.engines)
				// A step under way counted the requests it finishes already;
				// their clients see them end in the window, so the window's
				// counters count them too.
				for eng := m.first; eng < m.first+m.engines; eng++ {
					if !s.stepping[eng] {
						continue
					}
					for _, ev := range s.stepEvents[eng] {
						if ev.Finished {
							m.before.RequestSuccess[ev.Req.FinishReason]--
						}
					}
				}
			}
			s.openWindow()
		}
	}
	for s.queue.Len() > 0 && s.queue[0].at <= s.end {
		next()
	}
	s.now = s.end
	for i := range out.models {
		m := &out.models[i]
		m.after = f.counters(m.first, m.engines)
	}
	if s.awaited > 0 && cfg.ConversationTail > 0 {
		// Play on until the conversations sent in the window have ended;
		// otherwise the run ends here, its requests in flight cut.
		s.closeWindow()
		stop := s.end + cfg.ConversationTail
		for s.awaited > 0 && s.queue.Len() > 0 && s.queue[0].at <= stop {
			next()
		}
		if s.awaited > 0 {
			s.now = stop
		}
	}
	s.cutInFlight()
	f.clock = s.now
	results := slices.Concat(s.results, s.windowCut)
	for i := range out.models {
		m := &out.models[i]
		side := i > 0
		theirs := slices.DeleteFunc(slices.Clone(results), func(r agentload.Result) bool { return r.Side != side })
		m.summary = agentload.Summarize(theirs, virtualTime(s.measured), virtualTime(s.end))
		for p := range cfg.People {
			mine := slices.DeleteFunc(slices.Clone(theirs), func(r agentload.Result) bool { return s.personOf[r.SessionID] != p })
			m.people = append(m.people, agentload.Summarize(mine, virtualTime(s.measured), virtualTime(s.end)))
		}
	}
	return out, nil
}

// seat gives the slots their people: without Config.People, sessions of the
// workload at its level's seed; else each person's sessions of its own
// workload, in its own flow unless Config.OneFlow.
func (s *sim) seat(sessions int) error {
	cfg := s.env.cfg
	if len(cfg.People) == 0 {
		wl := cfg.Workload
		wl.Seed = agentload.LevelSeed(s.seed, sessions)
		return s.addPerson(wl, "", 0)
	}
	s.personOf = map[string]int{}
	first := 0
	for i, p := range cfg.People {
		flow, weight := p.Name, p.Weight
		if cfg.OneFlow {
			flow, weight = "", 0
		}
		if err := s.addPerson(p.Workload(cfg.Workload, s.seed), flow, weight); err != nil {
			return err
		}
		for j := first; j < first+p.Sessions; j++ {
			s.slots[j].person = i
		}
		first += p.Sessions
	}
	return nil
}

func (s *sim) addPerson(wl agentload.Config, flow string, weight float64) error {
	gen, err := agentload.NewGenerator(wl)
	if err != nil {
		return err
	}
	prefix := func(system string) promptprefix.Prefix {
		return promptprefix.Prefix{{Hash: xxhash.Sum64String(system), Bytes: int(scaledBytes(s.env.cfg, len(system)))}}
	}
	s.people = append(s.people, personRun{gen: gen, flow: flow, weight: weight,
		prefix: prefix(gen.SystemPrompt()), sidePrefix: prefix(gen.SideCallSystemPrompt())})
	return nil
}

// resume plays the turns of a slot's first session that come before a
// turn drawn at random, with the replies the model would give, without
// sending them (Config.MidConversation). The draw depends on the run's
// seed and the slot alone, so that every policy starts from the same ages.
func (s *sim) resume(session *agentload.Session, slotIndex int) {
	rng := rand.New(rand.NewPCG(uint64(s.seed), uint64(slotIndex)))
	for skip := rng.IntN(session.Turns()); skip > 0; skip-- {
		turn, _ := session.Next()
		session.Reply(tokenizer.Text(tokenizer.Reply(replySeed(s.seed, session.Index, turn.Index), turn.MaxTokens, false)))
	}
}

func (s *sim) schedule(at time.Duration, kind eventKind, index int) {
	s.seq++
	heap.Push(&s.queue, event{at: at, seq: s.seq, kind: kind, index: index})
}

// send starts the slot's next turn, with a new session when the last one is
// over, and routes it once the turn's think time has passed.
func (s *sim) send(slotIndex int) {
	sl := &s.slots[slotIndex]
	person := &s.people[sl.person]
	if sl.session == nil || sl.session.Done() {
		first := sl.session == nil
		sl.session = person.gen.NewSession()
		if first && s.env.cfg.MidConversation {
			s.resume(sl.session, slotIndex)
		}
		if s.personOf != nil {
			s.personOf[sl.session.ID] = sl.person
		}
	}
	turn, _ := sl.session.Next()
	if turn.Think > 0 && !sl.paused {
		sl.paused = true
		s.schedule(s.now+turn.Think, eventSend, slotIndex)
		return
	}
	sl.paused = false
	if s.measuring && turn.Index == 0 && turn.Segment == 0 {
		sl.awaited = true // its first request: Summarize times it
		s.awaited++
	}
	if call, ok := sl.session.SideCall(turn); ok {
		// Sent with the turn; the load balancer picks its engine at once.
		side, a := s.newRequest(slotIndex, call)
		side.side, side.final = true, true // its reply is text: end_turn
		eng, release := s.policy.Pick(a)
		s.dispatch(side, eng, func(loadcontrol.Reply) { release() })
	}
	r, a := s.newRequest(slotIndex, turn)
	r.final = turn.Final
	if h, ok := s.policy.(Holder); ok {
		sl.current = r
		dispatched := false
		unhold := h.Hold(a, func(eng int, release func(loadcontrol.Reply)) {
			dispatched, sl.unhold = true, nil
			s.dispatch(r, eng, release)
		})
		if !dispatched {
			sl.unhold = unhold
		}
		return
	}
	eng, release := s.policy.Pick(a)
	s.dispatch(r, eng, func(loadcontrol.Reply) { release() })
}

// newRequest is the slot's request for turn, not yet routed, and what the
// proxy knows of it.
func (s *sim) newRequest(slotIndex int, turn agentload.Turn) (*request, Arrival) {
	sl := &s.slots[slotIndex]
	person := &s.people[sl.person]
	prompt, hashes := sl.prompt.of(turn, s.env.cfg.Profile.BlockSize)
	r := &request{
		slot:    slotIndex,
		session: sl.session,
		req: &engine.Request{
			Prompt:       prompt,
			PromptHashes: hashes,
			MaxTokens:    turn.MaxTokens,
			Output:       tokenizer.Reply(replySeed(s.seed, sl.session.Index, turn.Index), turn.MaxTokens, false),
			CachedTokens: notAdmitted,
		},
		result: agentload.Result{
			SessionID: sl.session.ID, SessionIndex: sl.session.Index, Turn: turn.Index, LastTurn: turn.Last, Side: turn.Side,
			Start: virtualTime(s.now), PromptTokens: len(prompt), CacheReported: true,
		},
	}
	s.routed++
	a := Arrival{Key: sl.session.ID, Flow: person.flow, FlowWeight: person.weight, PromptBytes: s.bodyBytes(turn), Prefix: person.prefix, Now: s.now, Side: turn.Side}
	if turn.Side {
		a.Prefix = person.sidePrefix
	}
	return r, a
}

// inFlight is where the slot keeps r while it is under way.
func (s *sim) inFlight(r *request) **request {
	if r.side {
		return &s.slots[r.slot].side
	}
	return &s.slots[r.slot].current
}

// model is the index of r's model (Config.models).
func (r *request) model() int {
	if r.side {
		return 1
	}
	return 0
}

// dispatch sends a routed turn to its engine.
func (s *sim) dispatch(r *request, eng int, release func(loadcontrol.Reply)) {
	held := s.inFlight(r)
	*held = nil
	if eng < 0 {
		s.fail(r, 502, errors.New("no replica available"))
		return
	}
	r.engine, r.release = eng, release
	if err := s.fleet.engines[eng].Add(r.req, s.now); err != nil {
		release(loadcontrol.Reply{})
		s.fail(r, 400, err)
		return
	}
	r.result.Engine = s.fleet.addresses[eng]
	sl := &s.slots[r.slot]
	r.boundHit = s.fleet.bound.Arrive(r.req.PromptHashes, len(r.req.Prompt), sl.arrived)
	sl.arrived = r.req.PromptHashes
	*held = r
	s.byRequest[r.req] = r
	if !s.stepping[eng] {
		s.stepping[eng] = true
		s.schedule(s.now, eventStepStart, eng)
	}
}

// keepLastTurn keeps r as its conversation's last turn, and forgets its
// slot's previous conversation's once this one has ended a turn: a refresh
// of the one before keeps the prefix they share until then.
func (s *sim) keepLastTurn(r *request) {
	sl := &s.slots[r.slot]
	key := selection.HashKey(r.session.ID)
	if sl.lastKey != key {
		delete(s.lastTurns, sl.lastKey)
		sl.lastKey = key
	}
	if last := s.lastTurns[key]; last != nil {
		last.turn = r.req
		return
	}
	s.lastTurns[key] = &lastTurn{turn: r.req}
}

// refresh sends the last turn of key's conversation again to engine eng,
// for one token, as warden resends a kept conversation's last request
// (loadcontrol/refresh.go): not while one is still running there.
func (s *sim) refresh(eng int, key uint64) {
	last := s.lastTurns[key]
	if last == nil || last.refresh != nil && last.refresh.FinishReason == engine.NotFinished {
		return
	}
	last.refresh = &engine.Request{Prompt: last.turn.Prompt, PromptHashes: last.turn.PromptHashes, MaxTokens: 1, Output: refreshOutput}
	if s.fleet.engines[eng].Add(last.refresh, s.now) != nil {
		return
	}
	if !s.stepping[eng] {
		s.stepping[eng] = true
		s.schedule(s.now, eventStepStart, eng)
	}
}

// refreshOutput is a refresh's one token.
var refreshOutput = []uint32{0}

// fail records a request that got no reply; the slot drops its session and
// starts a new one a little later, as the HTTP runner does after an error.
func (s *sim) fail(r *request, status int, err error) {
	r.result.End, r.result.Status, r.result.Err = virtualTime(s.now), status, err
	s.results = append(s.results, r.result)
	if r.side {
		s.sideEnded(r.slot) // a failed side call costs the agent nothing more
		return
	}
	s.endSession(r.slot)
	sl := &s.slots[r.slot]
	sl.session = nil
	if sl.side != nil {
		sl.waitSide = true
		return
	}
	s.schedule(s.now+errorRetryDelay, eventSend, r.slot)
}

// sideEnded notes that the slot's side call ended, and sends the slot's
// next turn if its turn had ended first.
func (s *sim) sideEnded(slotIndex int) {
	sl := &s.slots[slotIndex]
	sl.side = nil
	if sl.waitSide {
		sl.waitSide = false
		s.send(slotIndex)
	}
}

// startStep runs the engine's next step, if it has work, until its end event.
func (s *sim) startStep(eng int) {
	dur, events := s.fleet.engines[eng].Step(s.now)
	if dur == 0 {
		s.stepping[eng] = false
		return
	}
	s.stepEvents[eng] = append(s.stepEvents[eng][:0], events...)
	s.schedule(s.now+dur, eventStepEnd, eng)
}

// endStep delivers the step's tokens, which may send follow-up turns, then
// starts the engine's next step at once, as vLLM's busy loop does.
func (s *sim) endStep(eng int) {
	if s.env.kvEvents != nil {
		s.env.kvEvents(eng, s.fleet.engines[eng].TakeKVEvents())
	}
	for _, ev := range s.stepEvents[eng] {
		r := s.byRequest[ev.Req]
		if r == nil { // a refresh: nobody waits for it
			continue
		}
		r.received++
		if ev.First {
			r.result.FirstToken = virtualTime(s.now)
		}
		if ev.Finished {
			s.finish(r)
		}
	}
	s.startStep(eng)
}

// finish records a completed request and sends the session's next turn at once.
func (s *sim) finish(r *request) {
	reply := loadcontrol.Reply{
		TaskEnded:    r.final,
		PromptTokens: len(r.req.Prompt), CachedTokens: r.req.CachedTokens, CacheReported: true,
		OutputTokens: r.received,
	}
	if s.env.cfg.HideCachedTokens {
		reply.CachedTokens, reply.CacheReported = 0, false
	}
	r.release(reply)
	delete(s.byRequest, r.req)
	*s.inFlight(r) = nil
	output := r.req.Output[:r.received]
	r.result.End, r.result.Status = virtualTime(s.now), 200
	r.result.OutputTokens, r.result.CachedTokens = r.received-r.early, r.req.CachedTokens
	s.results = append(s.results, r.result)
	s.fleet.bound.Finish(computedPastPrompt(r.req, output, s.env.cfg.Profile.BlockSize))
	s.countBound(r)
	if r.side {
		s.sideEnded(r.slot) // its reply stays out of the conversation
		return
	}
	r.session.Reply(tokenizer.Text(output))
	if s.env.top().refreshes {
		s.keepLastTurn(r)
	}
	if r.result.LastTurn {
		s.endSession(r.slot)
	}
	if sl := &s.slots[r.slot]; sl.side != nil {
		sl.waitSide = true
		return
	}
	s.send(r.slot)
}

// endSession notes that the slot's session is over, finished or abandoned.
func (s *sim) endSession(slotIndex int) {
	if sl := &s.slots[slotIndex]; sl.awaited {
		sl.awaited = false
		s.awaited--
	}
}

// cutInFlight ends the run: requests still in flight are aborted in their
// engines and recorded as cut, as the HTTP runner records them.
func (s *sim) cutInFlight() {
	for i := range s.slots {
		if r := s.slots[i].side; r != nil {
			s.fleet.engines[r.engine].Abort(r.req)
			r.release(loadcontrol.Reply{})
			s.results = append(s.results, s.cutResult(r))
			s.slots[i].side = nil
		}
		r := s.slots[i].current
		if r == nil {
			continue
		}
		if unhold := s.slots[i].unhold; unhold != nil && unhold() {
			s.results = append(s.results, s.cutResult(r)) // held: no engine had it
			s.slots[i].current, s.slots[i].unhold = nil, nil
			continue
		}
		s.fleet.engines[r.engine].Abort(r.req)
		r.release(loadcontrol.Reply{})
		s.results = append(s.results, s.cutResult(r))
		s.slots[i].current = nil
	}
	clear(s.byRequest)
	for i := range s.stepping {
		s.stepping[i] = false
	}
}

// cutResult is the result of r were the client to give up on it now,
// counted in the hit bound if the engine admitted it, as the engine's
// prefix-cache counters count it.
func (s *sim) cutResult(r *request) agentload.Result {
	res := r.result
	res.End, res.Cut, res.Status = virtualTime(s.now), true, 200
	res.OutputTokens = r.received - r.early
	if r.req.CachedTokens != notAdmitted {
		res.CachedTokens = r.req.CachedTokens
		s.countBound(r)
	}
	return res
}

// closeWindow ends the measurement: the requests in flight enter the
// window's results as cut, and nothing after it is measured but the time of
// the conversations sent in it.
func (s *sim) closeWindow() {
	for i := range s.slots {
		for _, r := range []*request{s.slots[i].current, s.slots[i].side} {
			if r != nil {
				s.windowCut = append(s.windowCut, s.cutResult(r))
			}
		}
	}
	s.measuring = false
}

// openWindow starts the measurement. Requests the engines admitted during
// the warm-up are in the counters snapshot taken now, so the bound leaves
// them out too; those still waiting will be counted by both at admission.
// Tokens generated so far, delivered or in a step under way, are left out of
// the window's output as they are of its engine counters.
func (s *sim) openWindow() {
	s.measuring = true
	for i := range s.slots {
		for _, r := range []*request{s.slots[i].current, s.slots[i].side} {
			if r != nil {
				r.warmup = r.req.CachedTokens != notAdmitted
				r.early = r.received
			}
		}
	}
	for eng, stepping := range s.stepping {
		if stepping {
			for _, ev := range s.stepEvents[eng] {
				if r := s.byRequest[ev.Req]; r != nil { // not a refresh
					r.early++
				}
			}
		}
	}
}

// countBound adds an admitted request to the hit bound's totals, which thus
// cover the same requests as the engines' prefix-cache counters: those
// admitted in the measured window. The bound itself keeps learning from the
// warm-up's prompts, as the engines' caches do.
func (s *sim) countBound(r *request) {
	if !s.measuring || r.warmup {
		return
	}
	s.boundHits[r.model()] += uint64(r.boundHit)
	s.boundQueries[r.model()] += uint64(len(r.req.Prompt))
}

func (s *sim) sampleBusy() {
	for i, e := range s.fleet.engines {
		if st := e.Stats(); st.Running+st.Waiting > 0 {
			model := 0
			if i >= s.env.cfg.Replicas {
				model = 1
			}
			s.busyTotal[model]++
		}
	}
	s.busySamples++
}

// promptMemo is a slot's last prompt as the simulator's server tokenizes
// it: a conversation's next turn repeats its messages and adds some, and
// only those are tokenized again, which keeps long conversations from
// costing the lab the square of their length.
type promptMemo struct {
	system string
	msgs   []agentload.Message
	tokens []uint32 // the rendering, without the generation prompt
	hashes []uint64 // the last prompt's block hashes, which no one changes
}

// of is the turn's prompt as the simulator's server tokenizes it, and the
// hashes of its full blocks of blockSize tokens (engine.BlockHashes).
func (m *promptMemo) of(turn agentload.Turn, blockSize int) ([]uint32, []uint64) {
	kept := 0
	if len(m.tokens) > 0 && turn.System == m.system && len(turn.Messages) >= len(m.msgs) {
		for kept < len(m.msgs) && turn.Messages[kept] == m.msgs[kept] {
			kept++
		}
	}
	system := ""
	if kept < len(m.msgs) || len(m.tokens) == 0 || turn.System != m.system {
		kept, system, m.tokens = 0, turn.System, m.tokens[:0]
	}
	keptBlocks := min(len(m.tokens)/blockSize, len(m.hashes))
	msgs := make([]tokenizer.Message, len(turn.Messages)-kept)
	for i, msg := range turn.Messages[kept:] {
		msgs[i] = tokenizer.Message{Role: msg.Role, Content: msg.Content}
	}
	m.tokens = tokenizer.AppendChat(m.tokens, system, msgs)
	m.system, m.msgs = turn.System, append(m.msgs[:0], turn.Messages...)
	prompt := tokenizer.AppendGenerationPrompt(slices.Clip(m.tokens))
	// A fresh slice each turn: the engine and the hit bound keep the last.
	hashes := make([]uint64, keptBlocks, len(prompt)/blockSize)
	copy(hashes, m.hashes)
	m.hashes = engine.AppendBlockHashes(hashes, prompt[keptBlocks*blockSize:], blockSize)
	return prompt, m.hashes
}

// computedPastPrompt is the hashes of the blocks a finished request computed
// past its prompt's full blocks: its prompt and output but the last token.
func computedPastPrompt(r *engine.Request, output []uint32, blockSize int) []uint64 {
	if len(output) < 2 {
		return nil
	}
	full := len(r.PromptHashes)
	tail := slices.Concat(r.Prompt[full*blockSize:], output[:len(output)-1])
	return engine.AppendBlockHashes(slices.Clip(r.PromptHashes), tail, blockSize)[full:]
}

// bodyBytes approximates the Content-Length of the turn's Anthropic request:
// its texts plus the JSON around them.
func (s *sim) bodyBytes(turn agentload.Turn) int64 {
	const envelope, perMessage = 256, 32
	n := envelope + len(turn.System)
	for _, m := range turn.Messages {
		n += perMessage + len(m.Content)
	}
	return scaledBytes(s.env.cfg, n)
}

// scaledBytes is n bytes of the simulator's text at the configured body
// bytes per token.
func scaledBytes(cfg Config, n int) int64 {
	if b := cfg.BodyBytesPerToken; b > 0 {
		return int64(math.Round(float64(n) * b / tokenizer.CharsPerToken))
	}
	return int64(n)
}

// replySeed picks the engine's reply for a turn. The simulator's server seeds
// it from the prompt; any per-turn seed gives the same statistics.
func replySeed(seed int64, session, turn int) uint64 {
	x := uint64(seed)*0x9e3779b97f4a7c15 ^ uint64(session)<<20 ^ uint64(turn)
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// rows are the outcome's rows of the table by model (Config.models): the
// run's, or with people each one's, beside the fleet's figures (hits, busy
// replicas, preemptions).
func (o *outcome) rows(policy string, people []Person) [][]report.Row {
	out := make([][]report.Row, len(o.models))
	for m := range o.models {
		row := o.row(policy, m)
		if len(people) == 0 {
			out[m] = []report.Row{row}
			continue
		}
		for i, p := range people {
			out[m] = append(out[m], p.Row(row, o.models[m].people[i], 1))
		}
	}
	return out
}

// row turns model m's part of the outcome into the table's row.
func (o *outcome) row(policy string, m int) report.Row {
	s, mo := o.sim, o.models[m]
	queries := mo.after.PrefixCacheQueries - mo.before.PrefixCacheQueries
	hits := mo.after.PrefixCacheHits - mo.before.PrefixCacheHits
	hostHits := mo.after.ExternalPrefixCacheHits - mo.before.ExternalPrefixCacheHits
	r := report.Row{
		Mode: report.ModeLab, Policy: policy, Sessions: len(s.slots), Seed: s.seed,
		DurationS:   (s.end - s.measured).Seconds(),
		Preemptions: mo.after.Preemptions - mo.before.Preemptions,
		Replicas:    mo.engines,
		HostTierGiB: s.env.cfg.Profile.KVOffloadingSize,
		Model:       mo.name,
	}
	r.SetClientSide(mo.summary, 1)
	if s.busySamples > 0 {
		r.ReplicasBusy = float64(s.busyTotal[m]) / float64(s.busySamples)
	}
	if queries > 0 {
		r.PrefixHitPercent = 100 * float64(hits) / float64(queries)
		r.HostHitPercent = 100 * float64(hostHits) / float64(queries)
	}
	if s.boundQueries[m] > 0 {
		r.HitBoundPercent = 100 * float64(s.boundHits[m]) / float64(s.boundQueries[m])
	}
	return r
}
