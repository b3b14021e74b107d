package lab

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
	"github.com/lmwarden/caddy-warden/kvevents"
	"github.com/lmwarden/caddy-warden/loadcontrol"
	"github.com/lmwarden/caddy-warden/selection"
)

// judgedTurn is a returning conversation's turn as the warden judged it,
// with what its old pin's engine held of its prompt at that moment.
type judgedTurn struct {
	key     string
	at      time.Duration
	outcome selection.Outcome
	// prompt is the prompt's tokens; cached those the old pin's engine
	// would have found cached; system those of the shared system prompt's
	// full blocks, which any engine that served a turn lately holds.
	prompt, cached, system int
	// hit is the prefix-cache hit a Sticky turn got when its engine
	// admitted it; notAdmitted for the other turns and those the run cut
	// before admission.
	hit int
	// byEvents is set when the old pin's KV cache events told how much of
	// the conversation's last chain it still held: eventsCached tokens.
	byEvents     bool
	eventsCached int
}

// share is the share of the prompt the old pin held.
func (j judgedTurn) share() float64 { return float64(j.cached) / float64(j.prompt) }

// own is the share of the conversation's own tokens (the prompt beyond
// the shared system prompt) the old pin held: what moving it loses.
func (j judgedTurn) own() float64 {
	return float64(max(0, j.cached-j.system)) / float64(j.prompt-j.system)
}

// truthPolicy is the warden policy noting, for every turn of a returning
// conversation sent in the measured window, the router's judgement and
// what the conversation's pin before the turn held of its prompt.
type truthPolicy struct {
	*wardenPolicy
	env    *Env
	pins   map[string]int // each conversation's pin, by key
	system []uint32       // the shared system prompt, tokenized alone
	turns  []judgedTurn
	other  int // returning turns placed anew for another reason
	// chains follows each engine's cache from its KV cache events, and
	// last each conversation's chain on each engine, to judge the turns
	// as the events would (kvevents.Chains).
	chains []*kvevents.Chains
	last   map[string]map[int]*lastChain
	// unresolved counts turns whose chain the events did not single out.
	resolved, unresolved int
}

// lastChain is what the events tell of a conversation's last turn on an
// engine: the last block of its chain, and how many tokens the chain
// holds.
type lastChain struct {
	tail   uint64
	tokens int
}

func newTruthPolicy(env *Env) (*truthPolicy, error) {
	p, err := newWardenPolicy(true)(env)
	if err != nil {
		return nil, err
	}
	tp := &truthPolicy{wardenPolicy: p.(*wardenPolicy), env: env, pins: map[string]int{}, last: map[string]map[int]*lastChain{}}
	for range env.Engines() {
		tp.chains = append(tp.chains, kvevents.NewChains(0))
	}
	env.FollowKVEvents(func(eng int, events []engine.KVEvent) { applyKVEvents(tp.chains[eng], events) })
	return tp, nil
}

// Hold sends the turn at once, as Pick does, to read its reply's usage.
func (p *truthPolicy) Hold(a Arrival, dispatch func(engine int, release func(loadcontrol.Reply))) func() bool {
	eng, release := p.Pick(a)
	if eng < 0 {
		dispatch(eng, nil)
		return func() bool { return false }
	}
	byEngine := p.last[a.Key]
	if byEngine == nil {
		byEngine = map[int]*lastChain{}
		p.last[a.Key] = byEngine
	}
	prev := byEngine[eng]
	mark := p.chains[eng].Mark()
	dispatch(eng, func(reply loadcontrol.Reply) {
		release()
		if reply.PromptTokens == 0 {
			return
		}
		bs := p.env.Config().Profile.BlockSize
		computed := (reply.PromptTokens + reply.OutputTokens - 1) / bs
		var prevTail uint64
		if prev != nil {
			prevTail = prev.tail
		}
		tail, ok := p.chains[eng].Tail(mark, p.chains[eng].Mark(), prevTail, computed-reply.CachedTokens/bs)
		if !ok {
			p.unresolved++
			delete(byEngine, eng)
			return
		}
		p.resolved++
		byEngine[eng] = &lastChain{tail: tail, tokens: computed * bs}
	})
	return func() bool { return false }
}

func (p *truthPolicy) Pick(a Arrival) (int, func()) {
	run := p.env.run
	pin, returning := p.pins[a.Key]
	measured := returning && a.Now >= run.measured && a.Now <= run.end
	var j judgedTurn
	if measured {
		// The engines change only when they step, never between the
		// arrival and the routing decision.
		turn := p.pending(a.Key)
		if p.system == nil {
			p.system = promptOf(agentload.Turn{System: turn.System})
		}
		prompt := promptOf(turn)
		bs := p.env.Config().Profile.BlockSize
		j = judgedTurn{
			key:    a.Key,
			at:     a.Now,
			hit:    notAdmitted,
			prompt: len(prompt),
			cached: p.env.fleet.engines[pin].CachedTokens(prompt),
			system: commonPrefix(prompt, p.system) / bs * bs,
		}
		if lc := p.last[a.Key][pin]; lc != nil {
			if evicted, ok := p.chains[pin].Evicted(lc.tail); ok {
				j.byEvents = true
				j.eventsCached = min(max(0, lc.tokens-evicted*bs), len(prompt))
			}
		}
	}
	eng, d := p.decide(a)
	if eng < 0 {
		return -1, nil
	}
	p.pins[a.Key] = eng
	if measured {
		switch d.Outcome {
		case selection.Sticky, selection.Spilled, selection.Rehomed:
			j.outcome = d.Outcome
			p.turns = append(p.turns, j)
		default:
			p.other++
		}
	}
	return eng, d.Release
}

// pending is the turn the conversation key is sending: Session.Next
// returns it again until it is answered.
func (p *truthPolicy) pending(key string) agentload.Turn {
	for _, sl := range p.env.run.slots {
		if sl.session != nil && sl.session.ID == key {
			turn, _ := sl.session.Next()
			return turn
		}
	}
	panic("no session " + key)
}

func commonPrefix(a, b []uint32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// truthCell is one run of TestRehomeJudgementAgainstGroundTruth.
type truthCell struct {
	think              time.Duration
	sessions, replicas int
	seed               int64
}

func (c truthCell) String() string {
	return fmt.Sprintf("think %v, %d sessions, %d replicas, seed %d", c.think, c.sessions, c.replicas, c.seed)
}

// truthFigures sum up a cell's judged turns.
type truthFigures struct {
	cold, warm           int
	falseCold, falseWarm float64 // shares of cold and warm turns
	coldShare, warmShare float64 // mean shares of the prompt held
	coldOwn, warmOwn     float64 // mean shares of the conversation's own tokens held
	spilled, other       int
	// stickyHeld and stickyHit are the mean shares of their prompts the
	// Sticky turns admitted in the run found at arrival and got at
	// admission: the pin may evict a queued turn's prefix meanwhile.
	stickyHeld, stickyHit float64
	// resolved and unresolved count the turns whose chain the KV cache
	// events singled out, or not.
	resolved, unresolved int
}

func figures(turns []judgedTurn, other int) truthFigures {
	var cold, warm []judgedTurn
	f := truthFigures{other: other}
	for _, j := range turns {
		if j.outcome == selection.Rehomed {
			cold = append(cold, j)
		} else {
			warm = append(warm, j)
			if j.outcome == selection.Spilled {
				f.spilled++
			}
		}
	}
	f.cold, f.warm = len(cold), len(warm)
	meanOf := func(js []judgedTurn, x func(judgedTurn) float64) float64 {
		if len(js) == 0 {
			return 0
		}
		sum := 0.0
		for _, j := range js {
			sum += x(j)
		}
		return sum / float64(len(js))
	}
	held := func(j judgedTurn) float64 {
		if j.share() >= 0.5 {
			return 1
		}
		return 0
	}
	f.falseCold = meanOf(cold, held)
	f.falseWarm = 1 - meanOf(warm, held)
	if len(warm) == 0 {
		f.falseWarm = 0
	}
	f.coldShare, f.warmShare = meanOf(cold, judgedTurn.share), meanOf(warm, judgedTurn.share)
	f.coldOwn, f.warmOwn = meanOf(cold, judgedTurn.own), meanOf(warm, judgedTurn.own)
	var admitted []judgedTurn
	for _, j := range warm {
		if j.outcome == selection.Sticky && j.hit != notAdmitted {
			admitted = append(admitted, j)
		}
	}
	f.stickyHeld = meanOf(admitted, judgedTurn.share)
	f.stickyHit = meanOf(admitted, func(j judgedTurn) float64 { return float64(j.hit) / float64(j.prompt) })
	return f
}

// TestMovesAgainstGroundTruth checks the warden's moves of returning turns
// against what the conversation's pin before the turn held of its prompt
// at that moment: a turn moved because its pin had lost most of its cache
// (Rehomed) must find its old pin holding little of the conversation's own
// tokens. A turn that stays may be cold too (where no replica would start
// it sooner, it stays), so nothing is asked of those. The KV cache events,
// where followed, must tell what the pin holds as the pin itself does.
// The figures are logged (go test -v -run MovesAgainstGroundTruth).
func TestMovesAgainstGroundTruth(t *testing.T) {
	var cells []truthCell
	for _, seed := range []int64{1, 2} {
		cells = append(cells, truthCell{3 * time.Second, 16, 4, seed}, truthCell{3 * time.Second, 32, 4, seed})
		for _, think := range []time.Duration{30 * time.Second, time.Minute} {
			for _, sessions := range []int{32, 64} {
				for _, replicas := range []int{4, 8} {
					cells = append(cells, truthCell{think, sessions, replicas, seed})
				}
			}
		}
	}
	results := make([]truthFigures, len(cells))
	pooled := make([][]judgedTurn, len(cells))
	errs := make([]error, len(cells))
	var wg sync.WaitGroup
	next := make(chan int)
	for range 2 {
		wg.Go(func() {
			for i := range next {
				pooled[i], results[i], errs[i] = runTruthCell(cells[i])
			}
		})
	}
	for i := range cells {
		next <- i
	}
	close(next)
	wg.Wait()
	var all []judgedTurn
	for i, c := range cells {
		if errs[i] != nil {
			t.Fatalf("%v: %v", c, errs[i])
		}
		f := results[i]
		t.Logf("%-42v rehomed %4d  stayed or spilled %4d (spilled %3d, other %2d)  old pin held of the rehomed: prompt %5.1f%%, own tokens %5.1f%%; of the others %5.1f%%, %5.1f%%; sticky held %5.1f%% hit %5.1f%%",
			c, f.cold, f.warm, f.spilled, f.other, 100*f.coldShare, 100*f.coldOwn, 100*f.warmShare, 100*f.warmOwn, 100*f.stickyHeld, 100*f.stickyHit)
		all = append(all, pooled[i]...)
		if f.cold >= 20 && f.coldOwn > 0.25 {
			t.Errorf("%v: rehomed turns' old pins held %.1f%% of their own tokens", c, 100*f.coldOwn)
		}
	}
	var judged, wrong, resolved, unresolved int
	for _, f := range results {
		resolved += f.resolved
		unresolved += f.unresolved
	}
	var absErr float64
	for _, j := range all {
		if !j.byEvents {
			continue
		}
		judged++
		absErr += math.Abs(float64(j.eventsCached-j.cached)) / float64(j.prompt)
		if (float64(j.eventsCached)/float64(j.prompt) >= 0.5) != (j.share() >= 0.5) {
			wrong++
		}
	}
	t.Logf("KV cache events: %d of %d turns' chains singled out; %d of %d returning turns judged; cached share error mean %.2f%%; wrong on which side of half %.1f%%",
		resolved, resolved+unresolved, judged, len(all), 100*absErr/float64(judged), 100*float64(wrong)/float64(judged))
	if judged < len(all)*9/10 || wrong*100 > judged {
		t.Errorf("KV cache events judged %d of %d turns, %d wrongly: they should judge nearly all, and rightly", judged, len(all), wrong)
	}
	f := figures(all, 0)
	t.Logf("all cells: rehomed %d, others %d; old pin held of the rehomed: prompt %.1f%%, own tokens %.1f%%; of the others %.1f%%, %.1f%%; sticky held %.1f%%, hit %.1f%%",
		f.cold, f.warm, 100*f.coldShare, 100*f.coldOwn, 100*f.warmShare, 100*f.warmOwn, 100*f.stickyHeld, 100*f.stickyHit)
	if f.cold < 200 {
		t.Fatalf("too few turns rehomed to judge: %d", f.cold)
	}
	if f.coldOwn > 0.1 || f.falseCold > 0.1 {
		t.Errorf("turns rehomed from pins that still held their cache: own tokens held %.1f%%, at least half the prompt held for %.1f%%",
			100*f.coldOwn, 100*f.falseCold)
	}
}

// runTruthCell runs the warden on one cell, with the grid's stretched
// windows from a 2-minute base, and judges its turns.
func runTruthCell(c truthCell) ([]judgedTurn, truthFigures, error) {
	base := DefaultConfig()
	base.Duration = 2 * time.Minute
	base.ConversationTail = 0
	cfg := base
	cfg.Replicas = c.replicas
	cfg.Workload.ThinkTime = c.think
	cfg.Warmup, cfg.Duration = Grid{Stretch: true}.window(base, cfg.Workload)
	f, err := newFleet(cfg)
	if err != nil {
		return nil, truthFigures{}, err
	}
	env := newEnv(cfg, f, c.seed)
	p, err := newTruthPolicy(env)
	if err != nil {
		return nil, truthFigures{}, err
	}
	out, err := simulate(env, p, c.sessions, c.seed)
	if err != nil {
		return nil, truthFigures{}, err
	}
	type turn struct {
		key string
		at  time.Duration
	}
	hits := map[turn]int{}
	for _, r := range out.sim.results {
		if r.Status == 200 {
			hits[turn{r.SessionID, r.Start.Sub(epoch)}] = r.CachedTokens
		}
	}
	for i, j := range p.turns {
		if hit, ok := hits[turn{j.key, j.at}]; ok && j.outcome == selection.Sticky {
			p.turns[i].hit = hit
		}
	}
	fig := figures(p.turns, p.other)
	fig.resolved, fig.unresolved = p.resolved, p.unresolved
	return p.turns, fig, nil
}
