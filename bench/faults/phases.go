package faults

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lmwarden/caddy-warden/health"
)

// Phase timings, in metrics intervals.
const (
	reloadSpacing   = 3   // between two steps of the reload phase
	settleIntervals = 5   // after a phase, so that pins are checked after recovery too
	recoverLimit    = 200 // how long a replica may take to take new conversations again
	slowMetricsBy   = 3   // a slow /metrics answers this late: past warden's timeout (0.9 interval)
)

// reloads runs ten POST /load (some changing the spill threshold), two
// affinity toggles and a spill threshold change through the admin API,
// under load. Expected: no failed request, every pin kept, counters
// continuous. A runtime change is a config change: it holds until a
// loaded config says otherwise.
func (h *harness) reloads(ctx context.Context) (Row, error) {
	loads := 0
	var offAt time.Time
	return h.runPhase(ctx, phase{
		progress: "reloads",
		fault:    "10 config reloads + affinity off/on ×2 + spill threshold changes",
		begin: func(ctx context.Context, row *Row) error {
			for _, step := range h.reloadSteps(row, &loads, &offAt) {
				if err := step(); err != nil {
					return fmt.Errorf("faults: reload phase: %v", err)
				}
				sleep(ctx, reloadSpacing*h.interval)
			}
			return nil
		},
		after: settleIntervals * h.interval,
		check: func(s span, row *Row) {
			t := countTraffic(s.reqs, s.w, "", time.Time{})
			p := followPins(s.reqs, s.w, h.pinRules(pinFault{}))
			row.Sent, row.Failed, row.PinsChecked, row.PinsLost = t.sent, t.failed, p.checked, p.lost
			row.Notes = append(row.Notes, failureNote(t)...)
			samples, pollErrs, violations := h.admin.in(s.w)
			row.Violations = append(row.Violations, violations...)
			row.Notes = append(row.Notes, fmt.Sprintf("%d POST /load; admin JSON polled %d times, requests counter %s, since unchanged",
				loads, len(samples), counterSpan(samples)))
			if len(pollErrs) > 0 {
				row.Notes = append(row.Notes, fmt.Sprintf("%d admin polls failed during reloads (first: %s)", len(pollErrs), pollErrs[0]))
			}
			if n := spillsIn(samples); n > 0 {
				row.Notes = append(row.Notes, fmt.Sprintf("%d requests spilled", n))
			}
			if loads != 10 {
				row.Violations = append(row.Violations, fmt.Sprintf("%d reloads instead of 10", loads))
			}
			row.Violations = append(row.Violations, expectNone(t.failed, "requests failed")...)
			row.Violations = append(row.Violations, lostPins(p)...)
		},
	})
}

// reloadSteps are the reload phase's config changes and the checks of the
// settings they leave, in order; loads counts the POST /load, offAt is
// when affinity last went off.
func (h *harness) reloadSteps(row *Row, loads *int, offAt *time.Time) []func() error {
	load := func(spill string) func() error {
		return func() error {
			*loads++
			config, err := h.cluster.Config(h.config.caddyfile(spill))
			if err != nil {
				return err
			}
			return h.caddy.Do(http.MethodPost, "/load", []byte(config), nil, "Cache-Control", "must-revalidate")
		}
	}
	affinity := func(on bool) func() error {
		return func() error {
			at := time.Now()
			if err := h.caddy.Do(http.MethodPost, "/warden/models/m/affinity", map[string]bool{"enabled": on}, nil); err != nil {
				return err
			}
			if on {
				h.affinityOff = append(h.affinityOff, window{*offAt, time.Now()})
			} else {
				*offAt = at
			}
			return nil
		}
	}
	spillAPI := func(n int) func() error {
		return func() error {
			return h.caddy.Do(http.MethodPost, "/warden/models/m/spill_threshold", map[string]int{"value": n}, nil)
		}
	}
	// expect checks a runtime setting after a step.
	expect := func(what string, ok func(modelStatus) bool) func() error {
		return func() error {
			var st modelStatus
			if err := h.caddy.Do(http.MethodGet, "/warden/models/m", nil, &st); err != nil {
				return err
			}
			if !ok(st) {
				row.Violations = append(row.Violations, fmt.Sprintf("%s: affinity %v, spill threshold %d", what, st.Affinity, st.SpillThreshold))
			}
			return nil
		}
	}
	return []func() error{
		load("auto"),
		load("auto"),
		affinity(false),
		expect("affinity off through the API applies", func(st modelStatus) bool { return !st.Affinity }),
		load("auto"),
		expect("a loaded config with affinity on applies it", func(st modelStatus) bool { return st.Affinity }),
		affinity(true),
		load("16"),
		expect("spill_threshold 16 in the Caddyfile applies", func(st modelStatus) bool { return st.SpillThreshold == 16 }),
		spillAPI(12),
		expect("a spill threshold set through the API applies", func(st modelStatus) bool { return st.SpillThreshold == 12 }),
		load("16"),
		expect("a loaded config's spill threshold applies", func(st modelStatus) bool { return st.SpillThreshold == 16 }),
		load("auto"),
		expect("spill_threshold auto in the Caddyfile applies", func(st modelStatus) bool {
			return st.SpillAuto && st.SpillThreshold == 0
		}),
		load("auto"),
		affinity(false),
		affinity(true),
		load("auto"),
		load("auto"),
		load("auto"),
	}
}

// kill kills the replica holding the most probe conversations, restarts it
// after a while and waits until it takes a new conversation again.
// Expected: only requests already streaming from it fail; each of its
// conversations is re-placed by its next request, within two metrics
// intervals; no other pin moves; it takes new conversations once healthy.
func (h *harness) kill(ctx context.Context) (Row, error) {
	victim := h.busiestReplica()
	addr := h.sims[victim].Addr
	name := server(victim)
	return h.runPhase(ctx, phase{
		progress: "kill " + name,
		fault:    fmt.Sprintf("replica %s killed, restarted %d intervals later", name, h.o.holdIntervals()),
		begin: func(context.Context, *Row) error {
			h.sims[victim].Kill()
			h.restarts = append(h.restarts, restart{name, time.Now()})
			return nil
		},
		hold:    h.holdFor(),
		end:     func(ctx context.Context, _ *Row) error { return h.sims[victim].Restart(ctx) },
		recover: h.awaitNewcomer(name),
		after:   settleIntervals * h.interval,
		check:   func(s span, row *Row) { h.checkKill(s, row, addr, name) },
	})
}

// checkKill measures the kill phase of the replica name at addr.
func (h *harness) checkKill(s span, row *Row, addr, name string) {
	// Until it takes new conversations again (Caddy's fail_duration may keep
	// it out after the restart), its conversations may move off it.
	killAt, usableAgain := s.began, s.recovered
	if usableAgain.IsZero() {
		usableAgain = s.w.to
	}
	t := countTraffic(s.reqs, s.w, name, killAt)
	p := followPins(s.reqs, s.w, h.pinRules(pinFault{name, window{killAt, usableAgain}}))
	row.Sent, row.Failed, row.CutStreaming = t.sent, t.failed, t.cutStreaming
	row.Notes = append(row.Notes, failureNote(t)...)
	row.PinsChecked, row.PinsLost, row.Moved = p.checked, p.lost, p.moved
	row.Violations = append(row.Violations, expectNone(t.failed-t.cutStreaming, "requests failed before streaming (not retried elsewhere)")...)
	row.Violations = append(row.Violations, lostPins(p)...)

	pinned := pinnedAt(s.reqs, killAt, name, fromProbe, h.affinityOff)
	var worst time.Duration
	for _, conv := range pinned {
		r, ok := firstRequestsAfter(s.reqs, killAt, []string{conv})[conv]
		switch {
		case !ok:
			row.Violations = append(row.Violations, conv+" sent nothing after the kill")
		case !r.ok || r.server() == name:
			row.Violations = append(row.Violations, fmt.Sprintf("%s's first request after the kill was not re-placed (status %d, engine %q)", conv, r.status, r.engine))
		default:
			worst = max(worst, r.end.Sub(r.start))
		}
	}
	row.Notes = append(row.Notes, fmt.Sprintf("%d probe conversations were pinned to %s: each re-placed by its first request after the kill, the slowest in %s",
		len(pinned), name, Table{MetricsInterval: h.interval}.inIntervals(worst)))
	// A measured time is held to its bound in the benchmark's full run;
	// the short one (a test) reports it, as a loaded machine may slow any
	// request.
	if worst > 2*h.interval && !h.o.Short {
		row.Violations = append(row.Violations, "re-placing a conversation took more than two metrics intervals")
	}
	samples, _, violations := h.admin.in(s.w)
	row.Violations = append(row.Violations, violations...)
	if at, ok := firstSample(samples[indexAfter(samples, killAt):], addr, false); ok {
		row.Notes = append(row.Notes, "warden saw it unhealthy after "+Table{MetricsInterval: h.interval}.inIntervals(at.Sub(killAt)))
	}
	row.Notes = append(row.Notes, "recovery counted from the restart; Caddy's fail_duration keeps a failed upstream out "+
		h.o.scaled(retrySettings.failDuration).String()+" after its last failure")
	h.checkHealthLog(row, addr, window{killAt, s.w.to}, false)
}

// metricsFault makes replica i's /metrics misbehave for a while. Expected:
// no failed request; after the metrics go stale, no new conversation on it;
// one log line when it turns unhealthy and one when it recovers; it takes
// new conversations again once its metrics are back.
func (h *harness) metricsFault(ctx context.Context, kind string, i int) (Row, error) {
	switches := map[string]any{"metrics": kind}
	if kind == "slow" {
		switches["metrics_delay"] = (slowMetricsBy * h.interval).String()
	}
	return h.replicaFault(ctx, i, metricsFaultNames[kind], switches, health.DefaultStaleIntervals+1)
}

// healthFault makes replica i's /health answer 503 while /metrics still
// answers, as vLLM does when its engine died.
func (h *harness) healthFault(ctx context.Context, i int) (Row, error) {
	return h.replicaFault(ctx, i, "/health 503, /metrics fine", map[string]any{"health_status": http.StatusServiceUnavailable}, 2)
}

// metricsFaultNames describe the simulator's /metrics faults in the table.
var metricsFaultNames = map[string]string{
	"slow":     "/metrics slower than the timeout",
	"garbage":  "/metrics garbage",
	"huge":     "/metrics 16 MiB (limit 4 MiB)",
	"missing":  "/metrics without vLLM series",
	"nan":      "/metrics NaN",
	"negative": "/metrics negative",
}

// metricsFaults lists the /metrics faults a run goes through.
func (o Options) metricsFaults() []string {
	if o.Short {
		return []string{"slow", "garbage", "nan"}
	}
	return []string{"slow", "garbage", "huge", "missing", "nan", "negative"}
}

// replicaFault sets fault switches on replica i, holds them, clears them
// and measures. After grace intervals the replica must get no new
// conversation.
func (h *harness) replicaFault(ctx context.Context, i int, fault string, switches map[string]any, grace int) (Row, error) {
	name := server(i)
	return h.runPhase(ctx, phase{
		progress: fault + " on " + name,
		fault:    fmt.Sprintf("%s on %s for %d intervals", fault, name, h.o.holdIntervals()),
		begin:    func(ctx context.Context, _ *Row) error { return h.setSimFaults(ctx, i, switches) },
		hold:     h.holdFor(),
		end:      func(ctx context.Context, _ *Row) error { return h.setSimFaults(ctx, i, nil) },
		recover:  h.awaitNewcomer(name),
		after:    settleIntervals * h.interval,
		check:    func(s span, row *Row) { h.checkReplicaFault(s, row, i, grace) },
	})
}

// checkReplicaFault measures the fault phase of replica i.
func (h *harness) checkReplicaFault(s span, row *Row, i, grace int) {
	addr, name := h.sims[i].Addr, server(i)
	faultAt, clearAt := s.began, s.ended
	samples, _, violations := h.admin.in(s.w)
	usableAgain := s.w.to
	if healthyAgain, ok := firstSample(samples[indexAfter(samples, clearAt):], addr, true); ok && !s.recovered.IsZero() {
		usableAgain = later(s.recovered, healthyAgain)
	}
	t := countTraffic(s.reqs, s.w, "", time.Time{})
	p := followPins(s.reqs, s.w, h.pinRules(pinFault{name, window{faultAt, usableAgain}}))
	row.Sent, row.Failed = t.sent, t.failed
	row.Notes = append(row.Notes, failureNote(t)...)
	row.PinsChecked, row.PinsLost, row.Moved = p.checked, p.lost, p.moved
	row.Violations = append(row.Violations, violations...)
	row.Violations = append(row.Violations, expectNone(t.failed, "requests failed")...)
	row.Violations = append(row.Violations, lostPins(p)...)

	graceEnd := faultAt.Add(time.Duration(grace) * h.interval)
	early, earlyAll := newcomersOn(s.reqs, window{faultAt, graceEnd}, name)
	late, lateAll := newcomersOn(s.reqs, window{graceEnd, clearAt}, name)
	row.Notes = append(row.Notes, fmt.Sprintf("new conversations on %s: %d of %d in the first %d intervals, %d of %d after",
		name, early, earlyAll, grace, late, lateAll))
	if late > 0 {
		row.Violations = append(row.Violations, fmt.Sprintf("%d new conversations went to the faulty replica after %d intervals", late, grace))
	}
	if at, ok := firstSample(samples[indexAfter(samples, faultAt):], addr, false); ok && at.Before(clearAt.Add(h.interval)) {
		row.Notes = append(row.Notes, "unhealthy in warden after "+Table{MetricsInterval: h.interval}.inIntervals(at.Sub(faultAt)))
	} else {
		row.Violations = append(row.Violations, "warden never marked the replica unhealthy")
	}
	h.checkHealthLog(row, addr, window{faultAt, s.w.to}, true)
}

// awaitNewcomer is a phase's recover: it waits until a new conversation
// started after the fault ended is served by the replica, records how long
// after the end it started as the row's recovery, and returns when; zero
// if it never was.
func (h *harness) awaitNewcomer(name string) func(context.Context, time.Time, *Row) time.Time {
	return func(ctx context.Context, ended time.Time, row *Row) time.Time {
		var at time.Time
		err := h.until(ctx, recoverLimit*h.interval, "a new conversation on "+name, func() bool {
			var ok bool
			at, ok = firstNewcomerOn(h.load.rec.snapshot(), ended, name)
			return ok
		})
		if err != nil {
			row.Violations = append(row.Violations, err.Error())
			return time.Time{}
		}
		row.Recovery = at.Sub(ended)
		return at
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// checkHealthLog checks warden's health log lines about a replica: one per
// change of state, ending healthy; exactly one unhealthy line when once is
// set.
func (h *harness) checkHealthLog(row *Row, addr string, w window, once bool) {
	lines := h.logs.healthLines(addr, w)
	unhealthy, healthy := 0, 0
	var reasons []string
	for _, l := range lines {
		if l.healthy {
			healthy++
		} else {
			unhealthy++
			reasons = append(reasons, strconv.Quote(reasonKind(l.reason)))
		}
	}
	row.Notes = append(row.Notes, fmt.Sprintf("log: %d unhealthy line(s) %v, %d healthy", unhealthy, reasons, healthy))
	switch {
	case repeatedStates(lines) > 0:
		row.Violations = append(row.Violations, fmt.Sprintf("%d health log lines repeat the state before them", repeatedStates(lines)))
	case unhealthy == 0 || (once && unhealthy != 1):
		row.Violations = append(row.Violations, fmt.Sprintf("%d unhealthy log lines, want %s", unhealthy, map[bool]string{true: "1", false: "at least 1"}[once]))
	case len(lines) == 0 || !lines[len(lines)-1].healthy:
		row.Violations = append(row.Violations, "no log line says the replica is healthy again")
	}
}

// busiestReplica is the replica holding the most probe conversations.
func (h *harness) busiestReplica() int {
	reqs := h.load.rec.snapshot()
	best, most := 0, -1
	for i := range h.sims {
		if n := len(pinnedAt(reqs, time.Now(), server(i), fromProbe, h.affinityOff)); n > most {
			best, most = i, n
		}
	}
	return best
}

// indexAfter is the index of the first sample taken at or after t.
func indexAfter(samples []adminSample, t time.Time) int {
	i, _ := slices.BinarySearchFunc(samples, t, func(s adminSample, t time.Time) int { return s.at.Compare(t) })
	return i
}

// failureNote lists the causes of failures, if any.
func failureNote(t traffic) []string {
	if len(t.errors) == 0 {
		return nil
	}
	var causes []string
	for cause, n := range t.errors {
		causes = append(causes, fmt.Sprintf("%d× %q", n, cause))
	}
	slices.Sort(causes)
	return []string{"failures: " + strings.Join(causes, ", ")}
}

// counterSpan shows the requests counter over a phase.
func counterSpan(samples []adminSample) string {
	if len(samples) == 0 {
		return "not read"
	}
	return fmt.Sprintf("%d → %d", samples[0].st.Requests, samples[len(samples)-1].st.Requests)
}

func spillsIn(samples []adminSample) uint64 {
	if len(samples) == 0 {
		return 0
	}
	return samples[len(samples)-1].st.spills() - samples[0].st.spills()
}

func expectNone(n int, what string) []string {
	if n == 0 {
		return nil
	}
	return []string{fmt.Sprintf("%d %s", n, what)}
}

// lostPins is the violation for lost pins, naming the conversations and
// the servers each went through.
func lostPins(p pins) []string {
	if p.lost == 0 {
		return nil
	}
	return []string{fmt.Sprintf("%d conversations lost their pin: %s", p.lost, strings.Join(p.lostPaths, "; "))}
}
