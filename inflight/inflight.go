// Package inflight keeps what warden knows of one proxied request while it
// is in flight: its conversation's identity, the decision of its current
// try (a retry gives the failed try's back), its turn's place with load
// control, and what its reply has said so far, which the request's end
// hands to both.
package inflight

import (
	"sync"
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
	"github.com/lmwarden/caddy-warden/replyend"
	"github.com/lmwarden/caddy-warden/selection"
	"github.com/lmwarden/caddy-warden/sessionkey"
)

// Request is one request in flight. Its String hides the conversation's
// identity (hashed keys) from placeholders that render it.
type Request struct {
	// ID is the conversation's identity, read once per request.
	ID sessionkey.Identity
	// Ticket is set on the first try, before the request's end can run
	// Release; TurnedAway is set then when load control refused the turn
	// or its client left while it waited, so that no retry sends it.
	Ticket     *loadcontrol.Ticket
	TurnedAway bool
	// Body is the request body's size, and its prefix parts when read.
	Body loadcontrol.Body

	// reply is what the reply's reader saw of it as it streamed, and
	// Release takes what it has read by then: a client may hang up at the
	// reply's last event, ending the request before the handler returns.
	replyMu sync.Mutex
	reply   *replyend.Scanner

	// d is the current try's decision; ended is set when the request ended
	// (its client may leave while a try is routed, or before Caddy's
	// retry), after which no decision may be kept.
	mu    sync.Mutex
	d     selection.Decision
	ended bool
}

func (*Request) String() string { return "" }

// Routing is what selection needs from the request's identity.
func (f *Request) Routing() selection.Request {
	id := f.ID
	req := selection.Request{Hash: id.Key, Parent: id.Parent, Continues: id.Continues, Renamed: id.Renamed}
	switch id.Hint {
	case sessionkey.Compacting:
		req.Compaction = selection.Compacting
	case sessionkey.Compacted:
		req.Compaction = selection.CompactedPrefix
	}
	return req
}

// Set makes d the request's decision and releases the previous try's. It
// reports false, and releases d at once, when the request has ended.
func (f *Request) Set(d selection.Decision) bool {
	f.mu.Lock()
	old, ended := f.d, f.ended
	if !ended {
		f.d = d
	}
	f.mu.Unlock()
	old.Release()
	if ended {
		d.Release()
	}
	return !ended
}

// Over reports whether the request has ended.
func (f *Request) Over() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ended
}

// NeedsUsage reports whether the current decision reads the reply's usage.
func (f *Request) NeedsUsage() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.d.NeedsUsage()
}

// ReadReply feeds the reply's next bytes to what Release reads of it.
func (f *Request) ReadReply(p []byte) {
	f.replyMu.Lock()
	defer f.replyMu.Unlock()
	if f.reply == nil {
		f.reply = new(replyend.Scanner)
	}
	f.reply.Write(p)
}

// replyRead is what the reply told so far: whether it ended the agent's
// task, and its usage (the prompt's size, its cached part, the reply's
// size). It is zero for a reply not read.
func (f *Request) replyRead() loadcontrol.Reply {
	f.replyMu.Lock()
	defer f.replyMu.Unlock()
	if f.reply == nil {
		return loadcontrol.Reply{}
	}
	u := f.reply.Usage()
	return loadcontrol.Reply{
		TaskEnded:    f.reply.TaskEnded(),
		PromptTokens: u.PromptTokens, CachedTokens: u.CachedTokens, CacheReported: u.CacheReported,
		OutputTokens: u.OutputTokens,
	}
}

// Release ends the request at now. It gives back the in-flight count
// first, so that a turn load control admits in the room the ticket's end
// frees sees it.
func (f *Request) Release(now time.Time) {
	reply := f.replyRead()
	f.mu.Lock()
	d := f.d
	f.d, f.ended = selection.Decision{}, true
	f.mu.Unlock()
	d.End(now, reply)
	f.Ticket.End(now, reply)
}
