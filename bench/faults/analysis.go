package faults

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// origin says which client sent a request.
type origin uint8

const (
	fromAgent    origin = iota // a closed-loop agentload session
	fromProbe                  // a long-lived probe conversation, one turn per metrics interval
	fromNewcomer               // a one-turn conversation, one per metrics interval
)

// request is the client's record of one request through Caddy.
type request struct {
	conv   string
	origin origin
	start  time.Time
	end    time.Time
	// engine is the simulator's X-Vllmsim-Engine header ("r1/0"); empty
	// when no response arrived.
	engine string
	// instance is the Caddy instance that answered (e2e.InstanceHeader:
	// "i0"), empty when none did.
	instance string
	// outcome is warden's routing outcome (outcomeHeader), empty when no
	// response arrived.
	outcome string
	status  int
	ok      bool   // a complete 200 stream
	cut     bool   // ended by the end of the run: neither success nor failure
	err     string // why it failed
}

func (r request) failed() bool { return !r.ok && !r.cut }

// movedByCost reports whether warden moved the request's conversation off its
// pin because another replica would start its turn sooner (spilled, or
// rehomed where the pin had likely evicted its cache): the conversation's
// pin is where the request went.
func (r request) movedByCost() bool { return r.outcome == "spilled" || r.outcome == "rehomed" }

// byLoad reports whether warden routed r by load alone while affinity was
// off (one of the spans). A request sent as affinity goes off or on may be
// routed by either setting, and one routed by the pin counts like any
// other: a spill then moves the pin.
func (r request) byLoad(affinityOff []window) bool {
	return r.outcome == "unpinned" && slices.ContainsFunc(affinityOff, func(x window) bool { return x.overlaps(r.start, r.end) })
}

// streaming reports whether the response had started: such a request cannot
// be retried by the proxy once its replica dies.
func (r request) streaming() bool { return r.status == 200 && r.engine != "" }

// server is the simulator that served the request ("r1"), or "".
func (r request) server() string { return serverOf(r.engine) }

func serverOf(engine string) string {
	s, _, _ := strings.Cut(engine, "/")
	return s
}

// window is a span of wall time, [from, to).
type window struct{ from, to time.Time }

func (w window) contains(t time.Time) bool { return !t.Before(w.from) && t.Before(w.to) }

func (w window) overlaps(from, to time.Time) bool { return from.Before(w.to) && to.After(w.from) }

// describe lists the spans that overlap w, relative to its start, between
// prefix and suffix; "" when none does.
func (w window) describe(prefix string, spans []window, suffix string) string {
	var out []string
	for _, s := range spans {
		if w.overlaps(s.from, s.to) {
			out = append(out, fmt.Sprintf("%v-%v", s.from.Sub(w.from).Round(time.Millisecond), s.to.Sub(w.from).Round(time.Millisecond)))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return prefix + " " + strings.Join(out, ", ") + suffix
}

// traffic counts the requests that ended in a window.
type traffic struct {
	sent, failed int
	// cutStreaming are failures of requests that were already streaming
	// from the faulted server when it failed (start before faultAt).
	cutStreaming int
	// errors counts the other failures by cause.
	errors map[string]int
}

func countTraffic(reqs []request, w window, faulted string, faultAt time.Time) traffic {
	var t traffic
	for _, r := range reqs {
		if !w.contains(r.end) || r.cut {
			continue
		}
		t.sent++
		if !r.failed() {
			continue
		}
		t.failed++
		if faulted != "" && r.streaming() && r.server() == faulted && r.start.Before(faultAt) {
			t.cutStreaming++
			continue
		}
		if t.errors == nil {
			t.errors = map[string]int{}
		}
		t.errors[r.err]++
	}
	return t
}

// pinFault says which server failed and when: conversations pinned to it
// may move once, by a request in flight during the fault (one sent just
// before it may be routed, or retried, after it began), without counting
// as a lost pin.
type pinFault struct {
	server string
	during window
}

// pins is what happened to conversations' pins in a window.
type pins struct {
	checked int // conversations with a known pin that were served in the window
	lost    int // of those, served elsewhere without cause
	moved   int // of those, moved once off the faulted server (expected)
	// lostPaths show each lost conversation's servers: when (relative to
	// the window's start) it first went to each in turn.
	lostPaths []string
}

// restart is a replica killed at a time and started again: the caches it
// held were lost then.
type restart struct {
	server string
	at     time.Time
}

// pinRules say which moves of a conversation are expected.
type pinRules struct {
	fault pinFault
	// affinityOff are the spans during which affinity was off.
	affinityOff []window
	// restarts are the replicas restarted so far, in any phase: a
	// conversation that had not come back since its replica restarted
	// lost its cache there, and its next turn may move it (rehomed).
	restarts []restart
}

// restartedSince reports whether server restarted after from and before to.
func (p pinRules) restartedSince(server string, from, to time.Time) bool {
	return slices.ContainsFunc(p.restarts, func(r restart) bool {
		return r.server == server && r.at.After(from) && r.at.Before(to)
	})
}

// followPins walks every conversation's successful requests in order. A
// conversation's pin is the server of its last success before the window
// (or its first in the window). In the window, a request served elsewhere
// is a lost pin, unless it is the conversation's first move, off a faulted
// server by a request in flight during the fault, or off a server that
// restarted since the conversation's last turn there. Requests routed by
// load while affinity was off are skipped: that is their purpose. A turn
// warden moved for its cost (spilled, rehomed) moves the pin: warden chose
// to.
func followPins(reqs []request, w window, rules pinRules) pins {
	byConv := map[string][]request{}
	for _, r := range reqs {
		if r.ok && r.end.Before(w.to) {
			byConv[r.conv] = append(byConv[r.conv], r)
		}
	}
	var p pins
	for _, convReqs := range byConv {
		slices.SortFunc(convReqs, func(a, b request) int { return a.start.Compare(b.start) })
		pin, checked, lost, moved := "", false, false, false
		var onPin time.Time // when the last turn on pin ended
		var path []string
		var lostAt string // the request that lost the pin first
		step := func(r request) string {
			s := fmt.Sprintf("%s@%v", r.server(), r.start.Sub(w.from).Round(time.Millisecond))
			if r.outcome != "" && r.outcome != "sticky" {
				s += "(" + r.outcome + ")"
			}
			return s
		}
		for i, r := range convReqs {
			if i == 0 || r.server() != convReqs[i-1].server() {
				path = append(path, step(r))
			}
			if r.byLoad(rules.affinityOff) {
				continue
			}
			server := r.server()
			if !w.contains(r.start) || pin == "" || r.movedByCost() {
				pin, onPin = server, r.end
				continue
			}
			checked = true
			fault := rules.fault
			switch {
			case server == pin:
			case !moved && fault.server != "" && pin == fault.server && fault.during.overlaps(r.start, r.end),
				!moved && rules.restartedSince(pin, onPin, r.end):
				moved, pin = true, server
			default:
				if !lost {
					lostAt = fmt.Sprintf("%s-%v", step(r), r.end.Sub(w.from).Round(time.Millisecond))
				}
				lost, pin = true, server
			}
			onPin = r.end
		}
		if checked {
			p.checked++
		}
		if lost {
			p.lost++
			p.lostPaths = append(p.lostPaths, fmt.Sprintf("%s %s; first lost by %s%s",
				convReqs[0].conv, strings.Join(path, " "), lostAt, w.describe(" (affinity off", rules.affinityOff, ")")))
		}
		if moved && !lost {
			p.moved++
		}
	}
	return p
}

// pinnedAt lists the conversations of an origin whose last success before t
// (not routed by load while affinity was off) was served by server.
func pinnedAt(reqs []request, t time.Time, server string, o origin, affinityOff []window) []string {
	last := map[string]request{}
	for _, r := range reqs {
		if r.byLoad(affinityOff) {
			continue
		}
		if r.ok && r.origin == o && r.end.Before(t) && r.start.After(last[r.conv].start) {
			last[r.conv] = r
		}
	}
	var convs []string
	for conv, r := range last {
		if r.server() == server {
			convs = append(convs, conv)
		}
	}
	slices.Sort(convs)
	return convs
}

// firstRequestsAfter returns, for each conversation, its first request that
// started at or after t (if any).
func firstRequestsAfter(reqs []request, t time.Time, convs []string) map[string]request {
	out := map[string]request{}
	for _, r := range reqs {
		if !slices.Contains(convs, r.conv) || r.start.Before(t) {
			continue
		}
		if first, seen := out[r.conv]; !seen || r.start.Before(first.start) {
			out[r.conv] = r
		}
	}
	return out
}

// newcomersOn counts the new conversations placed on server among those
// that started in a window.
func newcomersOn(reqs []request, w window, server string) (on, all int) {
	for _, r := range reqs {
		if r.origin != fromNewcomer || !r.ok || !w.contains(r.start) {
			continue
		}
		all++
		if r.server() == server {
			on++
		}
	}
	return on, all
}

// firstNewcomerOn is the start of the first new conversation served by
// server that started at or after t.
func firstNewcomerOn(reqs []request, t time.Time, server string) (time.Time, bool) {
	var first time.Time
	for _, r := range reqs {
		if r.origin == fromNewcomer && r.ok && r.server() == server && !r.start.Before(t) && (first.IsZero() || r.start.Before(first)) {
			first = r.start
		}
	}
	return first, !first.IsZero()
}
