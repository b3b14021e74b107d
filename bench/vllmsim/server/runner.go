package server

import (
	"context"
	"log"
	"sync"
	"time"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
)

// tokenEvent is one generated token as a handler sees it.
type tokenEvent struct {
	token        uint32
	first        bool
	finished     bool
	reason       engine.FinishReason
	cachedTokens int
}

// call is one request in an engine, with the channel its handler reads tokens from.
type call struct {
	req    *engine.Request
	events chan tokenEvent // room for every token, so the engine never waits for a client
}

type delivery struct {
	call  *call
	event tokenEvent
}

// engineRunner drives one engine in simulated time from its own goroutine.
type engineRunner struct {
	rank  int
	clock simClock
	wake  chan struct{}
	// kvEvents publishes the engine's KV events, when they are on; set before run starts.
	kvEvents *kvPublisher

	mu            sync.Mutex
	eng           *engine.Engine
	calls         map[*engine.Request]*call
	latestArrival time.Duration // no step may start before a request it could schedule
}

func newEngineRunner(rank int, e *engine.Engine, clock simClock) *engineRunner {
	return &engineRunner{rank: rank, clock: clock, wake: make(chan struct{}, 1), eng: e, calls: map[*engine.Request]*call{}}
}

// submit adds a request to the engine and returns its call.
func (r *engineRunner) submit(req *engine.Request) (*call, error) {
	c := &call{req: req, events: make(chan tokenEvent, len(req.Output))}
	r.mu.Lock()
	now := r.clock.now()
	err := r.eng.Add(req, now)
	if err == nil {
		r.calls[req] = c
		r.latestArrival = now
	}
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return c, nil
}

// abort takes a request out of the engine if it is still there (its client went away).
func (r *engineRunner) abort(c *call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.eng.Abort(c.req) {
		delete(r.calls, c.req)
	}
}

func (r *engineRunner) stats() engine.Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eng.Stats()
}

// run steps the engine until ctx ends. Each step's tokens reach their handlers when the
// step's simulated end comes on the wall clock. A step starts where the previous one ended,
// not when the goroutine woke up, so sleep overshoot does not accumulate; but never before the
// latest arrival, which also moves an idle engine to the present.
func (r *engineRunner) run(ctx context.Context) {
	var busyUntil time.Duration // simulated end of the last step
	var out []delivery
	timer := time.NewTimer(0)
	<-timer.C
	for {
		r.mu.Lock()
		start := max(busyUntil, r.latestArrival)
		dur, events := r.eng.Step(start)
		kv := r.eng.TakeKVEvents()
		out = out[:0]
		for _, ev := range events {
			c := r.calls[ev.Req]
			if ev.Finished {
				delete(r.calls, ev.Req)
			}
			out = append(out, delivery{c, tokenEvent{
				token: ev.Token, first: ev.First, finished: ev.Finished,
				reason: ev.Req.FinishReason, cachedTokens: ev.Req.CachedTokens,
			}})
		}
		r.mu.Unlock()
		if dur == 0 {
			select {
			case <-r.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		busyUntil = start + dur
		timer.Reset(time.Until(r.clock.wallAt(busyUntil)))
		select {
		case <-timer.C:
		case <-ctx.Done():
			return
		}
		// Like vLLM, a step's cache changes go out when the step ends, before its tokens.
		if len(kv) > 0 {
			if err := r.kvEvents.publish(kv); err != nil {
				log.Printf("vllmsim: rank %d: publishing KV events: %v", r.rank, err)
			}
		}
		for _, d := range out {
			d.call.events <- d.event
		}
		clear(out)
	}
}
