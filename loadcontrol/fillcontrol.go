package loadcontrol

// Fill control (Config.FillMin, FillMax): each replica's share of
// cache follows how much of its resident turns' prompts the replies say was
// cached, the feedback form of Denning's working-set model (page-fault
// frequency). Residents admitted together grow together past a cache that
// held them at first: a replica whose resident turns miss takes fewer
// newcomers until its residents leave; one whose resident turns find their
// prompts cached takes more again. It needs the cached part (vLLM's
// --enable-prompt-tokens-details, read by warden_stop_reason): until a reply
// reports one, every replica keeps Fill, and from the first, a replica
// starts at FillMax.
//
// Searched in the lab (docs/research/policy.md#touch-and-fill-control): alone it
// gains nothing, as the misses come turns after the admission that caused
// them; with Touch it holds the farm preset's gain over a long run.

// Fill control's steps: every fillWindow resident turns' replies on a
// replica, its fill rises by fillStep if they found at least fillHigh of
// their prompts cached, and falls by fillStep if under fillLow.
const (
	fillWindow = 4
	fillHigh   = 0.92
	fillLow    = 0.85
	fillStep   = 0.02
)

// fillState is a replica's controller (g.mu held).
type fillState struct {
	fill           float64
	prompt, cached int
	turns          int
	// lo and hi are the range it follows: a reload that changes the range
	// starts it anew.
	lo, hi float64
}

// controlsFill reports whether each replica's fill follows its residents'
// hits.
func (c Config) controlsFill() bool { return c.FillMin > 0 && c.FillMax >= c.FillMin }

// fillOf is the share of s's cache its residents may take (g.mu held).
func (v *View) fillOf(s Replica) float64 {
	c := v.cfg
	g := v.gate
	if !c.controlsFill() || g.cacheReplies == 0 {
		return c.Fill
	}
	if st := g.fill[s]; st != nil && st.lo == c.FillMin && st.hi == c.FillMax {
		return st.fill
	}
	return c.FillMax
}

// observeFill adds the reply of a resident turn on s, which reported its
// cached part, to s's window (g.mu held).
func (v *View) observeFill(s Replica, reply Reply) {
	c := v.cfg
	if !c.controlsFill() {
		return
	}
	g := v.gate
	st := g.fill[s]
	if st == nil || st.lo != c.FillMin || st.hi != c.FillMax {
		st = &fillState{fill: c.FillMax, lo: c.FillMin, hi: c.FillMax}
		g.fill[s] = st
	}
	st.prompt += reply.PromptTokens
	st.cached += min(reply.CachedTokens, reply.PromptTokens)
	if st.turns++; st.turns < fillWindow {
		return
	}
	switch share := float64(st.cached) / float64(max(st.prompt, 1)); {
	case share >= fillHigh:
		st.fill = min(st.fill+fillStep, c.FillMax)
	case share < fillLow:
		st.fill = max(st.fill-fillStep, c.FillMin)
	}
	st.prompt, st.cached, st.turns = 0, 0, 0
}
