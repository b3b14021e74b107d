package lab

import (
	"cmp"
	"slices"
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
	"github.com/lmwarden/caddy-warden/selection"
)

// Warden with load control (loadcontrol.Config): turns of
// conversations that do not fit in the replicas' caches wait at the proxy.
const (
	// PolicyAdmission has load control's defaults: the throughput mode.
	PolicyAdmission = "warden-admission"
	// PolicyAdmissionGentle lets resident conversations fill twice each
	// replica's cache and never makes them yield: it holds turns only deep
	// in overload (docs/research/policy.md#load-control).
	PolicyAdmissionGentle = "warden-admission-gentle"
	// PolicyAdmissionFarm keeps a conversation resident for its whole task
	// (no quantum), staggers the starts of a replica's first residents by
	// 15 s, lets each replica's fill follow its residents' hits between
	// 0.92 and 0.98 (0.95 until the replies report their cached part), and
	// has a replica a resident left wait for its idle residents to run
	// again before it takes a newcomer (touch): for headless agent farms,
	// where the time a conversation takes matters more than how long its
	// first turn waits.
	PolicyAdmissionFarm = "warden-admission-farm"
)

// FarmStagger is PolicyAdmissionFarm's Stagger.
const FarmStagger = 15 * time.Second

// Farm preset's fill control (loadcontrol.Config.FillMin, FillMax).
const (
	FarmFillMin = 0.92
	FarmFillMax = 0.98
)

// farmAdmission is PolicyAdmissionFarm's setting.
var farmAdmission = loadcontrol.Config{Quantum: -1, Stagger: FarmStagger,
	FillMin: FarmFillMin, FillMax: FarmFillMax, Touch: true}

// gentleAdmission is PolicyAdmissionGentle's setting.
var gentleAdmission = loadcontrol.Config{Fill: 2, Quantum: -1}

// admissionPolicy is the warden policy with load control, as Caddy runs it:
// a turn asks for admission, waits (in virtual time) while its conversation
// cannot be resident, is forced through after MaxWait, then is picked.
type admissionPolicy struct {
	*wardenPolicy
	env     *Env
	waiting map[*loadcontrol.Ticket]waiter
	queued  uint64 // turns held so far, which orders them
	// seen, when not nil, records what load control believed of each turn,
	// to be checked against the engines' ground truth.
	seen []belief
}

// belief is what load control estimated of a turn when it arrived.
type belief struct {
	key      string
	at       time.Duration
	tokens   int  // the prompt's estimated size
	resident bool // its conversation was resident: its prefix should be cached
}

// waiter is a held turn: when it was queued, its rank among the turns
// held, and how to send it.
type waiter struct {
	since time.Duration
	order uint64
	send  func()
}

func newAdmissionPolicy(admission loadcontrol.Config) PolicyFactory {
	admission.Enabled = true
	return func(env *Env) (Policy, error) {
		w, err := newWarden(env, func(c *selection.Config) { c.Admission = admission })
		if err != nil {
			return nil, err
		}
		p := &admissionPolicy{wardenPolicy: w, env: env, waiting: map[*loadcontrol.Ticket]waiter{}}
		env.Every(time.Second, p.forceOverdue)
		env.RefreshEvery(env.Config().MetricsInterval, p.kept)
		return p, nil
	}
}

// kept are the conversations load control keeps for a person within their
// share, idle: warden refreshes their caches (loadcontrol/refresh.go).
func (p *admissionPolicy) kept(now time.Duration) []Refresh {
	kept := p.view.KeptIdle(virtualTime(now))
	out := make([]Refresh, len(kept))
	for i, k := range kept {
		out[i] = Refresh{Engine: p.index[k.Replica.ID], Key: k.Key}
	}
	return out
}

// Hold asks for admission and sends the turn once admitted.
func (p *admissionPolicy) Hold(a Arrival, dispatch func(engine int, release func(loadcontrol.Reply))) func() bool {
	var t *loadcontrol.Ticket
	send := func() {
		d := p.view.Pick(selection.Request{Key: a.Key, PromptTokens: p.view.EstimateTokens(a.PromptBytes), Now: virtualTime(p.env.Now())})
		rep, ok := d.Replica()
		if !ok {
			t.Done(virtualTime(p.env.Now()))
			dispatch(-1, nil)
			return
		}
		dispatch(p.index[rep.ID], func(reply loadcontrol.Reply) {
			now := virtualTime(p.env.Now())
			d.End(now, loadcontrol.Reply{})
			t.End(now, reply)
		})
	}
	tokens := p.view.EstimateTokens(a.PromptBytes)
	req := selection.Request{Key: a.Key, Flow: flowID(a.Flow), FlowWeight: a.FlowWeight, Now: virtualTime(a.Now)}
	t = p.view.Admit(req, loadcontrol.Body{Bytes: a.PromptBytes, Prefix: a.Prefix}, func() {
		delete(p.waiting, t)
		send()
	})
	if p.seen != nil {
		p.seen = append(p.seen, belief{key: a.Key, at: a.Now, tokens: tokens, resident: t.Resident()})
	}
	switch t.State() {
	case loadcontrol.Admitted:
		send()
		return nil
	case loadcontrol.Refused:
		dispatch(-1, nil)
		return nil
	}
	p.queued++
	p.waiting[t] = waiter{since: a.Now, order: p.queued, send: send}
	return func() bool {
		delete(p.waiting, t)
		return t.Cancel(virtualTime(p.env.Now()))
	}
}

// flowID is the flow of a person's requests, its name hashed as a proxy
// hashes an API key; 0 for no one told apart.
func flowID(person string) uint64 {
	if person == "" {
		return 0
	}
	return selection.HashKey(person)
}

// forceOverdue sends the turns that waited MaxWait, as Caddy's request
// goroutines do when their timer fires, those held first first: in the
// map's order, a run would not repeat itself.
func (p *admissionPolicy) forceOverdue(now time.Duration) {
	var overdue []*loadcontrol.Ticket
	for t, w := range p.waiting {
		if now-w.since >= p.view.MaxWait() {
			overdue = append(overdue, t)
		}
	}
	slices.SortFunc(overdue, func(a, b *loadcontrol.Ticket) int {
		return cmp.Compare(p.waiting[a].order, p.waiting[b].order)
	})
	for _, t := range overdue {
		w, ok := p.waiting[t] // sending one may have admitted another
		if ok && t.Force(virtualTime(now)) {
			delete(p.waiting, t)
			w.send()
		}
	}
}
