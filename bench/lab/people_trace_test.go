package lab

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// personTurn is one of the interactive person's turns as load control saw
// it and as the engines served it.
type personTurn struct {
	key                 string
	turn                int
	at, admitted        time.Duration
	resident            bool // load control believed its conversation resident
	prompt              int
	lastEng, eng        int // where its previous turn ran, where it went
	cachedLast          int // what lastEng held of its prompt when it arrived
	cachedSent          int // what eng held of it when it was sent
	cachedRun           int // what eng found when it scheduled it
	ttfb                time.Duration
	wardenHeld, engUsed int // on eng when it was sent: warden's resident tokens, the engine's blocks in use
}

// personConv is one of the person's conversations between its turns.
type personConv struct {
	eng       int
	content   []uint32 // its last turn's prompt and reply
	idleSince time.Duration
	running   bool
	cached    int // what eng held of content at the last look
}

// eviction is a drop of an idle conversation's cache on its engine.
type eviction struct {
	at, idle            time.Duration
	eng                 int
	before, after, own  int
	wardenHeld, engUsed int
	residents           int
	running, waiting    int
	inFlight, inFlightN int // the prompts and replies so far of the turns sent to eng
	estimated           int // warden's estimate of those turns' prompts
}

// tracePolicy is load control noting, for one person, its turns and the
// blocks its idle conversations lose (look, called every 50 ms).
type tracePolicy struct {
	*admissionPolicy
	person    int
	turns     []*personTurn
	convs     map[string]*personConv
	evictions []eviction
	sizes     map[*request]int // warden's estimate of each turn's prompt
}

// held is what load control holds resident on engine eng.
func (p *tracePolicy) held(eng int) (tokens, residents int) {
	for _, r := range p.view.Status().Replicas {
		if p.index[r.ID] == eng {
			return r.ResidentTokens, r.Residents
		}
	}
	return 0, 0
}

// used is the tokens of the blocks engine eng's requests use.
func (p *tracePolicy) used(eng int) int {
	st := p.env.Stats(eng)
	return int(st.KVUsage * float64(p.env.Config().Profile.NumGPUBlocks*p.env.Config().Profile.BlockSize))
}

// Hold notes the person's turns, then holds every turn as load control does.
func (p *tracePolicy) Hold(a Arrival, dispatch func(int, func(loadcontrol.Reply))) func() bool {
	s := p.env.top().run
	var r *request
	for i := range s.slots {
		if c := s.slots[i].current; c != nil && c.session.ID == a.Key && !a.Side {
			p.sizes[c] = p.view.EstimateTokens(a.PromptBytes)
			if s.slots[i].person == p.person {
				r = c
			}
		}
	}
	if r == nil {
		return p.admissionPolicy.Hold(a, dispatch)
	}
	engines := s.fleet.engines
	pt := &personTurn{key: a.Key, turn: r.result.Turn, at: a.Now, prompt: len(r.req.Prompt), lastEng: -1}
	c := p.convs[a.Key]
	if c == nil {
		c = &personConv{eng: -1}
		p.convs[a.Key] = c
	}
	if c.eng >= 0 {
		pt.lastEng = c.eng
		pt.cachedLast = engines[c.eng].CachedTokens(r.req.Prompt)
	}
	c.running = true
	p.turns = append(p.turns, pt)
	p.seen = p.seen[:0]
	cancel := p.admissionPolicy.Hold(a, func(eng int, release func(loadcontrol.Reply)) {
		pt.admitted, pt.eng = p.env.Now(), eng
		if eng >= 0 {
			pt.cachedSent = engines[eng].CachedTokens(r.req.Prompt)
			pt.wardenHeld, _ = p.held(eng)
			pt.engUsed = p.used(eng)
		}
		dispatch(eng, func(reply loadcontrol.Reply) {
			pt.cachedRun = reply.CachedTokens
			if !r.result.FirstToken.IsZero() {
				pt.ttfb = r.result.FirstToken.Sub(r.result.Start)
			}
			if release != nil {
				release(reply)
			}
			c.eng, c.running, c.idleSince = eng, false, p.env.Now()
			c.content = append(append([]uint32{}, r.req.Prompt...), r.req.Output[:r.received]...)
			if eng >= 0 {
				c.cached = engines[eng].CachedTokens(c.content)
			}
		})
	})
	if len(p.seen) > 0 {
		pt.resident = p.seen[0].resident
	}
	return cancel
}

// look notes the idle conversations whose cache their engine dropped.
func (p *tracePolicy) look(now time.Duration) {
	s := p.env.top().run
	if s == nil {
		return
	}
	for _, c := range p.convs {
		if c.running || c.eng < 0 || len(c.content) == 0 {
			continue
		}
		cached := s.fleet.engines[c.eng].CachedTokens(c.content)
		if cached < c.cached-256 {
			held, residents := p.held(c.eng)
			st := p.env.Stats(c.eng)
			e := eviction{at: now, idle: now - c.idleSince, eng: c.eng,
				before: c.cached, after: cached, own: len(c.content), wardenHeld: held, engUsed: p.used(c.eng),
				residents: residents, running: st.Running, waiting: st.Waiting}
			for i := range s.slots {
				if r := s.slots[i].current; r != nil && r.engine == c.eng && r.release != nil {
					e.inFlight += len(r.req.Prompt) + r.received
					e.inFlightN++
					e.estimated += p.sizes[r]
				}
			}
			p.evictions = append(p.evictions, e)
		}
		c.cached = cached
	}
}

// TestPersonBesideAFarmKeepsItsCache follows the interactive person beside
// a farm (seed 1, the 10 s person): what each of its turns found cached
// against what load control believed, and the engine's state when an idle
// conversation of the person's lost blocks (go test -v logs them, for
// docs/research/policy.md). Each flow within its share keeps its
// conversations resident, and warden refreshes their caches while they are
// idle, so most of the person's turns after a conversation's first find it
// resident and nearly all of their prompt cached (65% – 75% without the
// refreshes).
func TestPersonBesideAFarmKeepsItsCache(t *testing.T) {
	cfg := DefaultConfig()
	cfg.People, _ = ParsePeople("farm:20:0s,person:2:10s")
	for _, name := range []string{PolicyAdmission, PolicyAdmissionFarm} {
		env, policy := freshPolicy(t, cfg, name, 1)
		ap := policy.(*admissionPolicy)
		ap.seen = []belief{}
		p := &tracePolicy{admissionPolicy: ap, person: 1, convs: map[string]*personConv{}, sizes: map[*request]int{}}
		env.Every(50*time.Millisecond, p.look)
		if _, err := simulate(env, p, Sessions(cfg.People), 1); err != nil {
			t.Fatal(err)
		}
		later, resident, prompt, cached := 0, 0, 0, 0
		var b strings.Builder
		fmt.Fprintf(&b, "%s, the person's turns:\n", name)
		for _, pt := range p.turns {
			fmt.Fprintf(&b, "%7.1fs %s t%-2d resident=%-5v waited %5.1fs ttfb %5.1fs prompt %5d; its last engine e%d held %5d; sent to e%d, which held %5d, found %5d; warden held %5d there, the engine used %5d\n",
				pt.at.Seconds(), pt.key[len(pt.key)-4:], pt.turn, pt.resident, (pt.admitted - pt.at).Seconds(), pt.ttfb.Seconds(),
				pt.prompt, pt.lastEng, pt.cachedLast, pt.eng, pt.cachedSent, pt.cachedRun, pt.wardenHeld, pt.engUsed)
			if pt.turn == 0 || pt.eng < 0 || pt.ttfb == 0 {
				continue
			}
			later++
			prompt += pt.prompt
			cached += pt.cachedRun
			if pt.resident {
				resident++
			}
		}
		fmt.Fprintf(&b, "idle conversations of the person's losing blocks:\n")
		for _, e := range p.evictions {
			fmt.Fprintf(&b, "%7.1fs e%d idle %5.1fs: cached %5d -> %5d of %5d; warden holds %5d in %d residents; the engine uses %5d, %d running, %d waiting; %d sent there: %5d tokens, estimated %5d\n",
				e.at.Seconds(), e.eng, e.idle.Seconds(), e.before, e.after, e.own, e.wardenHeld, e.residents, e.engUsed, e.running, e.waiting, e.inFlightN, e.inFlight, e.estimated)
		}
		t.Log(b.String())
		if later < 10 {
			t.Fatalf("%s: %d of the person's turns after a conversation's first ended", name, later)
		}
		share := float64(cached) / float64(max(prompt, 1))
		t.Logf("%s: %d of %d later turns resident, %.0f%% of their prompts cached", name, resident, later, 100*share)
		if float64(resident) < 0.9*float64(later) || share < 0.9 {
			t.Errorf("%s: %d of the person's %d later turns found their conversation resident, and they found %.0f%% of their prompts cached; want 90%% and 90%%",
				name, resident, later, 100*share)
		}
	}
}
