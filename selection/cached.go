package selection

import (
	"math"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// What a conversation's pin still caches. A pin is kept for the cache it
// holds, so the cost of a turn there counts only the part of its prompt the
// pin has lost (cost.go).
//
// The estimate reads the engine's own counters. vLLM frees a finished
// request's KV blocks to the end of its free queue, last block first, and
// allocates, evicting cached blocks, from the front. So a conversation's
// blocks survive until the engine has written (Load.Written: prompt tokens
// it computed plus tokens it generated) as many tokens as its free room
// held when the conversation's last request ended; past that it loses its
// history from the end, one token for each token written. Where the
// replica's KV cache events are followed (chains.go), they say exactly
// which blocks it evicted.

// onPin marks d, a request on its conversation's pin (e, its shard
// locked), so that Release tells the entry when the conversation's last
// request there ends.
func (d Decision) onPin(v *View, e *session, key uint64, prompt int) Decision {
	if e.pin == d.rep {
		e.sent(d.rep)
		e.busy++
		e.released = false
		if prompt > 0 {
			e.lastPrompt = prompt
		}
		d.router, d.key, d.entry, d.moves = v.router, key, e, e.moves
	}
	return d
}

// ended records that d, a request on its conversation's pin, ended with
// reply: when it was the last one there, the entry notes the pin's writes
// and free room now, and what reply says of the chain it stored. A request
// sent before the conversation moved, or before its entry was replaced,
// is not counted in busy: even if the conversation came back to the same
// replica since, its end says nothing of the new turn.
func (r *Router) ended(d Decision, reply loadcontrol.Reply) {
	sh := r.sessions.shard(d.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.byKey[d.key]
	if e != d.entry || e.moves != d.moves || e.busy <= 0 {
		return
	}
	rep := e.pin
	if e.busy--; e.busy > 0 {
		return
	}
	e.replied(reply)
	l := rep.load.Load()
	// Written is 0 both without the counters and before the engine wrote
	// anything: either way there is nothing to judge by.
	e.released = l.Known && l.KVTokens > 0 && l.Written > 0
	e.relWritten, e.relRouted = l.Written, float64(rep.routed.Load())
	e.relRestarts = rep.restarts.Load()
	// The free room ahead of its blocks: what the engine's last scrape,
	// taken while the turn ran, showed free.
	e.relFree = math.Round(float64(l.KVTokens) * (1 - l.KVUsage))
}

// cachedTokens is how much of its last prompt the conversation's pin
// likely holds: all of it while a request of the conversation runs there
// or nothing tells otherwise; less what the pin has evicted of it since
// its last request there ended, by its KV cache events where they tell,
// else by the tokens written past the free room it had then, as its
// counters show them or, sooner, as we sent them (requests still queued
// there will write theirs before this turn runs); none once the pin's
// counters went back (a restarted engine lost it all, even once they have
// climbed past their old value).
func (e *session) cachedTokens() int {
	if e.busy > 0 || e.lastPrompt <= 0 {
		return max(e.lastPrompt, 0)
	}
	if evicted, ok := e.evictedByChain(); ok {
		return max(0, e.lastPrompt-evicted)
	}
	if !e.released {
		return e.lastPrompt
	}
	l := e.pin.load.Load()
	if !l.Known || l.Written <= 0 {
		return e.lastPrompt
	}
	if l.Written < e.relWritten || e.pin.restarts.Load() != e.relRestarts {
		return 0
	}
	written := max(l.Written-e.relWritten, float64(e.pin.routed.Load())-e.relRouted)
	evicted := written - e.relFree
	return int(max(0, float64(e.lastPrompt)-max(0, evicted)))
}
