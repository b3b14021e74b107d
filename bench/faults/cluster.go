package faults

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Faults of the Caddy side itself (issue 14): Redis killed under several
// instances, one instance of several killed, and a lone instance restarted
// gracefully. What is at stake is where conversations go afterwards.

// convergeIntervals is how long, after Redis or an instance comes back, the
// load runs before the phase is measured.
const convergeIntervals = 30

// redisOutage kills the Redis the instances share, keeps it down for
// RedisOutage (wall time), restarts it empty and lets the load run on.
// Expected: no failed request. Measured: the share of turns served on their
// conversation's replica during the outage (instances fall back to what
// they hold), and after the restart, and when every conversation had
// settled on the replica it ended on.
func (h *harness) redisOutage(ctx context.Context) (Row, error) {
	return h.runPhase(ctx, phase{
		progress: fmt.Sprintf("redis killed for %v", h.o.RedisOutage),
		fault:    fmt.Sprintf("Redis killed for %v wall (%v simulated), restarted empty", h.o.RedisOutage, time.Duration(float64(h.o.RedisOutage)*h.o.TimeScale)),
		begin:    func(context.Context, *Row) error { h.cluster.Redis.Kill(); return nil },
		hold:     h.o.RedisOutage,
		end:      func(ctx context.Context, _ *Row) error { return h.cluster.Redis.Restart(ctx) },
		after:    convergeIntervals * h.interval,
		check:    checkRedisOutage,
	})
}

func checkRedisOutage(s span, row *Row) {
	killAt, restartAt := s.began, s.ended
	t := countTraffic(s.reqs, s.w, "", time.Time{})
	p := followPins(s.reqs, s.w, pinRules{})
	row.Sent, row.Failed = t.sent, t.failed
	row.PinsChecked, row.PinsLost = p.checked, p.lost
	row.Notes = append(row.Notes, failureNote(t)...)
	row.Violations = append(row.Violations, expectNone(t.failed, "requests failed")...)

	homes := pinsAt(s.reqs, killAt)
	on, all := stickiness(s.reqs, window{killAt, restartAt}, homes)
	row.Notes = append(row.Notes, "during the outage: "+share(on, all)+" of turns on their conversation's replica (as of the kill, or its first turn for a new one)")
	on, all = stickiness(s.reqs, window{restartAt, s.w.to}, pinsAt(s.reqs, restartAt))
	row.Notes = append(row.Notes, "after the restart: "+share(on, all)+" of turns on the replica their conversation was on at the restart")
	if last, ok := lastOffFinal(s.reqs, restartAt, s.w.to); ok {
		row.Recovery = last.Sub(restartAt)
		row.Notes = append(row.Notes, "recovery: the last turn served off the replica its conversation ended on started that long after the restart")
	} else {
		row.Notes = append(row.Notes, "every turn after the restart was on the replica its conversation ended on")
	}
	if p.lost > 0 {
		row.Notes = append(row.Notes, "conversations served elsewhere (not a violation: no shared pins while Redis is down): "+truncate(p.lostPaths, 3))
	}
}

// instanceKill kills the last Caddy instance (SIGKILL: no final snapshot),
// restarts it after the hold and lets the load run on. Expected: only
// requests already streaming through it fail (the front retries the
// others); of the conversations it served before the kill, at least 99%
// are sent to the same replica by the restarted instance, which knows them
// only from the shared pin store.
func (h *harness) instanceKill(ctx context.Context) (Row, error) {
	victim := len(h.cluster.Instances) - 1
	name := h.cluster.Instances[victim].Name
	return h.runPhase(ctx, phase{
		progress: "kill caddy " + name,
		fault:    fmt.Sprintf("Caddy instance %s of %d killed, restarted %d intervals later", name, len(h.cluster.Instances), h.o.holdIntervals()),
		begin:    func(context.Context, *Row) error { h.cluster.Kill(victim); return nil },
		hold:     h.holdFor(),
		end:      func(context.Context, *Row) error { return h.cluster.StartInstance(victim) },
		after:    convergeIntervals * h.interval,
		check:    func(s span, row *Row) { checkInstanceKill(s, row, name) },
	})
}

func checkInstanceKill(s span, row *Row, name string) {
	killAt, restartAt := s.began, s.ended
	t := countTraffic(s.reqs, s.w, "", time.Time{})
	cut := 0
	for _, r := range s.reqs {
		if s.w.contains(r.end) && r.failed() && r.instance == name && r.streaming() && r.start.Before(killAt) {
			cut++
		}
	}
	p := followPins(s.reqs, s.w, pinRules{})
	row.Sent, row.Failed, row.CutStreaming = t.sent, t.failed, cut
	row.PinsChecked, row.PinsLost = p.checked, p.lost
	row.Notes = append(row.Notes, failureNote(t)...)
	row.Violations = append(row.Violations, expectNone(t.failed-cut, "requests failed other than those streaming through the killed instance")...)
	if p.lost > 0 {
		row.Violations = append(row.Violations, fmt.Sprintf("%d conversations lost their pin: %s", p.lost, truncate(p.lostPaths, 3)))
	}

	homes := pinsAt(s.reqs, killAt)
	served := servedThrough(s.reqs, name, killAt)
	back, checked := returned(s.reqs, served, homes, restartAt, name)
	anyBack, anyChecked := returned(s.reqs, served, homes, restartAt, "")
	row.Notes = append(row.Notes,
		fmt.Sprintf("%d conversations served by %s before the kill; through the restarted %s, %s went to their replica (%s through any instance)",
			len(served), name, name, share(back, checked), share(anyBack, anyChecked)))
	switch {
	case checked == 0:
		row.Violations = append(row.Violations, "no conversation it served came back through the restarted instance")
	case 100*back < 99*checked:
		row.Violations = append(row.Violations, fmt.Sprintf("only %s of its conversations returned to their replica (want ≥ 99%%)", share(back, checked)))
	}
}

// gracefulRestart stops the only Caddy gracefully (SIGINT: warden writes
// its pin snapshot to Caddy's storage), starts it again on the same storage
// and lets the load run on. Requests fail while it is down (there is no
// other proxy); expected: none after it is back, and at least 99% of the
// conversations pinned before the stop back on their replica.
func (h *harness) gracefulRestart(ctx context.Context) (Row, error) {
	return h.runPhase(ctx, phase{
		progress: "graceful restart",
		fault:    "Caddy stopped gracefully (SIGINT) and started again on the same storage",
		begin: func(context.Context, *Row) error {
			h.admin.restart()
			return h.cluster.StopInstance(0)
		},
		end: func(context.Context, *Row) error {
			if err := h.cluster.StartInstance(0); err != nil {
				return err
			}
			h.caddy = h.cluster.Instances[0].Proc
			h.admin.started(h.caddy)
			return nil
		},
		after: convergeIntervals * h.interval,
		check: h.checkGracefulRestart,
	})
}

func (h *harness) checkGracefulRestart(s span, row *Row) {
	stopAt, startedAt := s.began, s.ended
	t := countTraffic(s.reqs, s.w, "", time.Time{})
	row.Sent, row.Failed = t.sent, t.failed
	row.Notes = append(row.Notes, fmt.Sprintf("down for %v (stop and start); failures while down are expected, no other proxy", startedAt.Sub(stopAt).Round(time.Millisecond)))
	row.Notes = append(row.Notes, failureNote(t)...)
	failedAfter := 0
	for _, r := range s.reqs {
		if r.failed() && !r.start.Before(startedAt) && s.w.contains(r.end) {
			failedAfter++
		}
	}
	row.Violations = append(row.Violations, expectNone(failedAfter, "requests sent after the restart failed")...)

	homes := pinsAt(s.reqs, stopAt)
	var convs []string
	for conv := range homes {
		convs = append(convs, conv)
	}
	slices.Sort(convs)
	back, checked := returned(s.reqs, convs, homes, startedAt, "")
	row.PinsChecked, row.PinsLost = checked, checked-back
	row.Notes = append(row.Notes, fmt.Sprintf("%s of the conversations pinned before the stop (and heard from after) went back to their replica", share(back, checked)))
	if st, ok := h.admin.latest(); ok {
		var placed, replaced uint64
		for _, r := range st.Replicas {
			placed, replaced = placed+r.Placed, replaced+r.Replaced
		}
		ps := st.PinSnapshot
		row.Notes = append(row.Notes, fmt.Sprintf("restarted Caddy's admin JSON: %d pins restored from the snapshot, %d dropped (%d already pinned, %d unknown replica); since the start %d conversations placed, %d re-placed",
			ps.Restored, ps.Dropped, ps.AlreadyPinned, ps.UnknownReplica, placed, replaced))
	}
	if moved := movedAfter(s.reqs, convs, homes, startedAt); len(moved) > 0 {
		row.Notes = append(row.Notes, "elsewhere after the restart (server@time since the restart): "+truncate(moved, 5))
	}
	switch {
	case checked == 0:
		row.Violations = append(row.Violations, "no conversation pinned before the stop was heard from after it")
	case 100*back < 99*checked:
		row.Violations = append(row.Violations, fmt.Sprintf("only %s of conversations returned to their replica (want ≥ 99%%)", share(back, checked)))
	}
}

// pinsAt maps each conversation to the server of its last success that
// ended before t.
func pinsAt(reqs []request, t time.Time) map[string]string {
	last := map[string]request{}
	for _, r := range reqs {
		if r.ok && r.end.Before(t) && r.end.After(last[r.conv].end) {
			last[r.conv] = r
		}
	}
	out := map[string]string{}
	for conv, r := range last {
		out[conv] = r.server()
	}
	return out
}

// stickiness counts the successes that started in w and, of them, those on
// their conversation's home server; a conversation without one takes the
// server of its first success in w, which is not counted.
func stickiness(reqs []request, w window, homes map[string]string) (on, all int) {
	inW := slices.DeleteFunc(slices.Clone(reqs), func(r request) bool { return !r.ok || !w.contains(r.start) })
	slices.SortFunc(inW, func(a, b request) int { return a.start.Compare(b.start) })
	home := map[string]string{}
	for conv, s := range homes {
		home[conv] = s
	}
	for _, r := range inW {
		h, ok := home[r.conv]
		if !ok {
			home[r.conv] = r.server()
			continue
		}
		all++
		if r.server() == h {
			on++
		}
	}
	return on, all
}

// lastOffFinal is the start of the latest success, started in [from, to),
// served elsewhere than the server its conversation's last success in that
// span went to; false when there is none.
func lastOffFinal(reqs []request, from, to time.Time) (time.Time, bool) {
	w := window{from, to}
	final := map[string]request{}
	for _, r := range reqs {
		if r.ok && w.contains(r.start) && r.start.After(final[r.conv].start) {
			final[r.conv] = r
		}
	}
	var last time.Time
	for _, r := range reqs {
		if r.ok && w.contains(r.start) && r.server() != final[r.conv].server() && r.start.After(last) {
			last = r.start
		}
	}
	return last, !last.IsZero()
}

// servedThrough lists the conversations with a success through instance
// that ended before t.
func servedThrough(reqs []request, instance string, t time.Time) []string {
	seen := map[string]bool{}
	for _, r := range reqs {
		if r.ok && r.instance == instance && r.end.Before(t) {
			seen[r.conv] = true
		}
	}
	var out []string
	for conv := range seen {
		out = append(out, conv)
	}
	slices.Sort(out)
	return out
}

// returned checks, for each of convs with a home, its successes started at
// or after t (through instance, if not empty), in order: checked counts
// those with any, back those whose every such success was on the home
// server, or on the server a spill or a re-homing (warden's choice) moved it to.
func returned(reqs []request, convs []string, homes map[string]string, t time.Time, instance string) (back, checked int) {
	for _, conv := range convs {
		home, ok := homes[conv]
		if !ok {
			continue
		}
		var after []request
		for _, r := range reqs {
			if r.conv == conv && r.ok && !r.start.Before(t) && (instance == "" || r.instance == instance) {
				after = append(after, r)
			}
		}
		slices.SortFunc(after, func(a, b request) int { return a.start.Compare(b.start) })
		seen, all := len(after) > 0, true
		for _, r := range after {
			if r.movedByCost() {
				home = r.server()
			}
			all = all && r.server() == home
		}
		if seen {
			checked++
			if all {
				back++
			}
		}
	}
	return back, checked
}

// movedAfter shows, for each of convs whose successes from t on were not
// all on its home (moves for cost aside), the servers they went to and when,
// relative to t, with warden's outcome where it was not sticky.
func movedAfter(reqs []request, convs []string, homes map[string]string, t time.Time) []string {
	var out []string
	for _, conv := range convs {
		var after []request
		for _, r := range reqs {
			if r.conv == conv && r.ok && !r.start.Before(t) {
				after = append(after, r)
			}
		}
		if !slices.ContainsFunc(after, func(r request) bool { return !r.movedByCost() && r.server() != homes[conv] }) {
			continue
		}
		slices.SortFunc(after, func(a, b request) int { return a.start.Compare(b.start) })
		path := conv + " (was " + homes[conv] + "):"
		for _, r := range after {
			path += fmt.Sprintf(" %s@%v", r.server(), r.start.Sub(t).Round(time.Millisecond))
			if r.outcome != "" && r.outcome != "sticky" {
				path += "(" + r.outcome + ")"
			}
		}
		out = append(out, path)
	}
	return out
}

func share(n, of int) string {
	if of == 0 {
		return "— (none)"
	}
	return fmt.Sprintf("%.1f%% (%d/%d)", 100*float64(n)/float64(of), n, of)
}

func truncate(items []string, n int) string {
	if len(items) <= n {
		return fmt.Sprint(items)
	}
	return fmt.Sprintf("%v and %d more", items[:n], len(items)-n)
}
