package faults

import (
	"context"
	"time"
)

// phase is one fault of the run, as a row of the fault table: how it
// begins and ends, how long it lasts, and what is checked of it. Every
// phase goes through the same schedule (runPhase): a lead-in under steady
// load, the fault begun and held, then ended, the wait for recovery, and
// the load let run on before the phase's window closes.
type phase struct {
	progress string // told to Options.Progress as the phase starts
	fault    string // the row's Fault
	// begin starts the fault; end stops it (a restart, switches cleared),
	// hold after begin returned. Either may be nil.
	begin, end func(context.Context, *Row) error
	hold       time.Duration
	// recover, if set, waits after the end until the fault's effect is
	// over and returns when it was (zero: never, within its limit).
	recover func(ctx context.Context, ended time.Time, row *Row) time.Time
	// after is how long the load runs on, once recovered, before the
	// window closes: pins are checked after recovery too.
	after time.Duration
	// check measures the window into the row.
	check func(span, *Row)
}

// span is what a phase's checks read: the requests recorded until its
// window closed, the window, and the moments of its schedule.
type span struct {
	reqs []request
	w    window
	// began and ended are when the fault began and ended; recovered when
	// its effect was over (phase.recover), else the window's end.
	began, ended, recovered time.Time
}

// runPhase carries ph through the schedule and returns its row.
func (h *harness) runPhase(ctx context.Context, ph phase) (Row, error) {
	h.progress("%s", ph.progress)
	row := Row{Fault: ph.fault}
	from := time.Now()
	sleep(ctx, reloadSpacing*h.interval)
	s := span{began: time.Now()}
	if ph.begin != nil {
		if err := ph.begin(ctx, &row); err != nil {
			return row, err
		}
	}
	sleep(ctx, ph.hold)
	if ph.end != nil {
		if err := ph.end(ctx, &row); err != nil {
			return row, err
		}
	}
	s.ended = time.Now()
	if ph.recover != nil {
		s.recovered = ph.recover(ctx, s.ended, &row)
	}
	sleep(ctx, ph.after)
	s.w = window{from, time.Now()}
	if s.recovered.IsZero() {
		s.recovered = s.w.to
	}
	s.reqs = h.load.rec.snapshot()
	row.Resent = h.load.retry.resends(s.w)
	ph.check(s, &row)
	return row, nil
}

// holdFor is the usual length of a fault.
func (h *harness) holdFor() time.Duration { return time.Duration(h.o.holdIntervals()) * h.interval }
