package selection

import (
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
	"github.com/lmwarden/caddy-warden/promptprefix"
)

// Load control (package loadcontrol) holds turns before routing picks their
// replica. Each Router holds its gate, each View that gate under its
// config's settings; loadRouting is what load control asks of routing.

// Admit asks load control whether req's turn, whose request body is body,
// may go to a replica now (loadcontrol.View.Admit). With load control off,
// affinity off or no key, it returns nil: admitted, nothing tracked. A
// Waiting ticket calls ready when it is admitted; the caller must then
// Pick, and end the ticket with Done, or leave the queue with Cancel or
// Force.
func (v *View) Admit(req Request, body loadcontrol.Body, ready func()) *loadcontrol.Ticket {
	return v.lc.Admit(loadcontrol.Turn{Key: req.key(), Now: req.Now, Usable: req.Usable,
		Flow: req.Flow, FlowWeight: req.FlowWeight, Subagent: req.Parent != 0 && !req.Renamed}, body, ready)
}

// WantsPrefix reports whether a request's body is worth reading for its
// system prompt and tool parts (Request.Prefix, loadcontrol.Body.Prefix),
// from which the router learns the prefix conversations share while the
// replies have not told it: a conversation's new to the router, or, with
// load control, one not resident. Other turns, most of them, teach nothing
// new, and their bodies need not be read.
func (v *View) WantsPrefix(key uint64) bool {
	if !v.cfg.Affinity || key == 0 || v.router.prefix.repliesKnown() {
		return false
	}
	if !v.cfg.Admission.Enabled {
		return !v.router.knows(key)
	}
	return !v.router.gate.Holds(key)
}

// MaxWait is how long a turn may wait before the caller forces it.
func (v *View) MaxWait() time.Duration { return v.cfg.Admission.MaxWait }

// Admission is load control's settings in force, defaults filled in.
func (v *View) Admission() loadcontrol.Config { return v.cfg.Admission }

// ReleaseWaiting lets every waiting turn go at once, unadmitted: load
// control no longer holds turns (its model left the config).
func (r *Router) ReleaseWaiting() { r.gate.ReleaseWaiting() }

// keepsResidents reports whether load control holds turns and some wait
// for room: routing then leaves its residents' conversations where they
// are (loadcontrol.View.KeepsResidents).
func (v *View) keepsResidents() bool { return v.cfg.Admission.Enabled && v.lc.KeepsResidents() }

// Kept is an idle conversation that load control keeps resident for a
// person within their share, and the replica holding its cache, where a
// refresh of it goes (loadcontrol.View.KeptIdle).
type Kept struct {
	Key     uint64
	Replica Replica
}

// KeptIdle lists the conversations kept resident and idle at now for
// flows within their share on healthy replicas, ordered by key.
func (v *View) KeptIdle(now time.Time) []Kept {
	var out []Kept
	for _, k := range v.lc.KeptIdle(now) {
		if s := k.Replica.(*replicaState); s.healthy.Load() {
			out = append(out, Kept{Key: k.Key, Replica: s.Replica})
		}
	}
	return out
}

// loadRouting is v as load control sees it (loadcontrol.Routing): its
// replicas are *replicaState handles.
type loadRouting struct{ v *View }

// handle is s as a loadcontrol.Replica, nil for none.
func handle(s *replicaState) loadcontrol.Replica {
	if s == nil {
		return nil
	}
	return s
}

func (l loadRouting) Replicas() []loadcontrol.Replica {
	out := make([]loadcontrol.Replica, len(l.v.replicas))
	for i, s := range l.v.replicas {
		out[i] = s
	}
	return out
}

func (l loadRouting) Pin(key uint64, now int64) loadcontrol.Replica {
	return handle(l.v.router.pinOf(key, now, int64(l.v.cfg.SessionTTL)))
}

// Settle pins key to rep, where load control admitted it: a new
// conversation is placed there, a pinned one moved there.
func (l loadRouting) Settle(key uint64, rep loadcontrol.Replica, now int64) {
	s := rep.(*replicaState)
	switch inserted, moved := l.v.router.pinTo(key, s, now); {
	case inserted:
		s.placed.Add(1)
	case moved:
		s.replaced.Add(1)
	}
}

func (l loadRouting) Usable(rep loadcontrol.Replica, usable func(string) bool) bool {
	return l.v.usable(rep.(*replicaState), usable)
}

func (l loadRouting) Healthy(rep loadcontrol.Replica) bool {
	return rep.(*replicaState).healthy.Load()
}

func (l loadRouting) AnyHealthy(usable func(string) bool) bool {
	for _, s := range l.v.replicas {
		if s.healthy.Load() && usableBy(usable, s) {
			return true
		}
	}
	return false
}

func (l loadRouting) Lightest(usable func(string) bool, key uint64, ok func(loadcontrol.Replica) bool) loadcontrol.Replica {
	var fits func(*replicaState) bool
	if ok != nil {
		fits = func(s *replicaState) bool { return ok(s) }
	}
	return handle(l.v.lightest(usable, key, true, fits))
}

// KVTokens counts a host tier larger than the GPU cache: what the GPU
// evicts comes back from it by a copy, so a turn that waits for GPU room
// there waits for nothing a copy would not give sooner. While flows share
// the fleet, load control counts the GPU's alone (GPUKVTokens,
// loadcontrol/flowshare.go).
func (l loadRouting) KVTokens(rep loadcontrol.Replica) int {
	return rep.(*replicaState).capacityTokens()
}

func (l loadRouting) GPUKVTokens(rep loadcontrol.Replica) int {
	return int(rep.(*replicaState).kvTokens.Load())
}

func (l loadRouting) EstimateTokens(bodyBytes int64) (int, bool) {
	perToken, learned := l.v.router.bytesPerTokenLearned()
	return tokensOf(bodyBytes, perToken), learned
}

func (l loadRouting) BytesPerToken() float64 { return l.v.router.BytesPerToken() }

func (l loadRouting) LearnTokenSize(bodyBytes int64, promptTokens int) {
	l.v.router.learnTokenSize(bodyBytes, promptTokens)
}

func (l loadRouting) SharedPrefix() (int, loadcontrol.SharedPrefixSource) {
	return l.v.router.sharedPrefix()
}

func (l loadRouting) NoteRequestPrefix(key uint64, prefix promptprefix.Prefix) {
	l.v.router.prefix.noteRequest(key, prefix)
}

func (l loadRouting) NoteReplyPrefix(cached int) { l.v.router.prefix.noteReply(cached) }

// LastPrompt is the prompt of key's latest request on its pin, in tokens;
// 0 when unknown.
func (l loadRouting) LastPrompt(key uint64, now int64) int {
	r := l.v.router
	sh := r.sessions.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.entry(key, now, int64(l.v.cfg.SessionTTL)); e != nil {
		return e.lastPrompt
	}
	return 0
}
