package caddymodule

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lmwarden/caddy-warden/inflight"
	"github.com/lmwarden/caddy-warden/loadcontrol"
	"github.com/lmwarden/caddy-warden/metrics"
	"github.com/lmwarden/caddy-warden/promptprefix"
	"github.com/lmwarden/caddy-warden/readahead"
	"github.com/lmwarden/caddy-warden/selection"
	"github.com/lmwarden/caddy-warden/sessionkey"
)

// varQueued is how long the turn waited for load control, in seconds; set
// only when load control saw the turn.
const varQueued = "warden.queued_s"

// Outcomes (warden.outcome) of a turn load control turned away; Select then
// finds no upstream and Caddy answers 503.
const (
	outcomeRefused   = "refused"   // the queue was full; the answer has Retry-After
	outcomeCancelled = "cancelled" // its client left while it waited
)

// admit asks load control whether the request's turn, routed as req, may
// go to a replica now, and holds it in the request's own goroutine while it
// must wait. It reports false when the turn must not be sent: the queue is
// full, or its client left while it waited.
func (p *Policy) admit(view *selection.View, r *http.Request, w http.ResponseWriter, held *inflight.Request, req selection.Request) bool {
	if !view.Admission().Enabled {
		return true // checked first so that, off, it allocates nothing
	}
	if held.ID.Auxiliary {
		return true // a side call the agent names: small, and its own prompt
	}
	if countsTokens(r) {
		return true // no turn: the server only tokenizes the prompt
	}
	ctx := r.Context()
	ready := make(chan struct{})
	// After the body read for its prefix, if it was: the wait counts the
	// rest of the upload, as max_wait does.
	start := p.clock.Now()
	// The ticket keeps req.Usable: other requests' ends admit the turn with it.
	req.Now, req.Flow = start, sessionkey.Flow(r.Header, p.cfg.LoadControl.flowHeader())
	t := view.Admit(req, held.Body, func() { close(ready) })
	held.Ticket = t
	if t == nil {
		return true // affinity off, or no key to hold the turn by
	}
	switch t.State() {
	case loadcontrol.Refused:
		if w != nil {
			w.Header().Set("Retry-After", retryAfter(view.Admission().Linger))
		}
		caddyhttp.SetVar(ctx, varOutcome, outcomeRefused)
		return false
	case loadcontrol.Waiting:
		sent := p.wait(view, r, t, ready)
		waited := p.clock.Now().Sub(start).Seconds()
		caddyhttp.SetVar(ctx, varQueued, waited)
		metrics.ObserveWait(p.Model, waited)
		if sent {
			p.keepPrompt(r, held)
		}
		return sent
	}
	caddyhttp.SetVar(ctx, varQueued, 0.0)
	p.keepPrompt(r, held)
	return true
}

// wait holds a queued turn until load control admits it, its client leaves
// (the turn leaves the queue without a trace) or max_wait passes (the turn
// is forced through); it reports whether the turn may be sent. max_wait
// counts the body's upload too, so a client that sends it slowly cannot
// stretch the wait.
func (p *Policy) wait(view *selection.View, r *http.Request, t *loadcontrol.Ticket, ready <-chan struct{}) bool {
	timeout := p.clock.After(view.MaxWait())
	readBody(r)
	select {
	case <-ready:
		if r.Context().Err() == nil {
			return true
		}
	case <-r.Context().Done():
	case <-timeout:
		t.Force(p.clock.Now()) // false: admitted meanwhile, which is as good
		return true
	}
	// Its client left, before the turn was admitted or as it was (select
	// picks either): a turn admitted and never sent ends at once.
	t.Cancel(p.clock.Now())
	caddyhttp.SetVar(r.Context(), varOutcome, outcomeCancelled)
	return false
}

// countsTokens reports whether r asks the server for the size of a prompt
// (Anthropic's count_tokens, which Claude Code calls and vLLM serves) rather
// than for a reply: its conversation's replica answers it, but load control
// does not hold it as a turn of the conversation.
func countsTokens(r *http.Request) bool {
	return strings.HasSuffix(r.URL.Path, "/messages/count_tokens")
}

// retryAfter is the Retry-After of a refused turn, in whole seconds: one
// linger, after which a resident conversation that sent no new turn has
// left and the queue has moved. It stays well under the minute past which
// some clients' SDKs ignore the header.
func retryAfter(linger time.Duration) string {
	return strconv.Itoa(max(1, int(math.Ceil(linger.Seconds()))))
}

// requestBody is the request body's size, which sizes its prompt: from
// Content-Length, else from what the session key's scan read of the body,
// partial unless the scan reached its end; 0 when neither tells.
func requestBody(r *http.Request) loadcontrol.Body {
	if r.ContentLength > 0 {
		return loadcontrol.Body{Bytes: r.ContentLength}
	}
	if n, whole, ok := readahead.Ahead(r); ok {
		return loadcontrol.Body{Bytes: int64(n), Partial: !whole}
	}
	return loadcontrol.Body{}
}

// maxHeldBodies bounds the request bodies load control holds in memory at
// once, in the whole process: bodies read for their prompt's prefix (and
// their parse while it runs) and bodies of waiting turns. Without it,
// max_queue turns of a few MiB each could hold gigabytes. Past it a body is
// not read (or, of unannounced length, only as far as the budget allows):
// the turn loses only what the read was for, a sample of the shared
// prefix, or noticing over HTTP/1 that its client left before it is sent.
const maxHeldBodies = 256 << 20

// heldBodies is the process's budget: load control's bodies and the model
// matcher's, across models and config reloads, share the same memory.
var heldBodies = readahead.NewBudget(maxHeldBodies)

// maxPrefixBody bounds the body read for its prefix parts: a larger one
// (images, documents) is handed on unread, and teaches nothing.
const maxPrefixBody = 8 << 20

// readPrefix reads the body of a turn warden wants the prefix of
// (View.WantsPrefix: a new conversation's, while the replies have not told
// it), hands it on intact and sets body to its size and the system prompt
// and tool parts it declares, wherever they stand in it (Claude Code sends
// them after the messages), from which warden learns the prefix
// conversations share. A body of unannounced length read whole also gives
// its exact size.
func readPrefix(r *http.Request, body *loadcontrol.Body) {
	if !readahead.MayBeJSON(r) {
		return
	}
	data, whole := heldBodies.Read(r, maxPrefixBody)
	*body = requestBody(r)
	if whole {
		// A string value as long as the body (no agent sends one, a client
		// may) grows the parser's buffer to about the body's size again.
		heldBodies.During(int64(len(data)), func() { body.Prefix = promptprefix.Read(data) })
	}
}

// readBody reads the rest of the request body into memory and hands it on
// intact. HTTP/1 notices a client that left (and cancels the request's
// context) only once the handler has read the body to its end, so a turn
// that waits reads it first, as far as the process's budget for bodies
// allows; HTTP/2 notices without it. A read error is handed on as it came.
func readBody(r *http.Request) {
	if r.ProtoMajor >= 2 || r.Body == nil || r.Body == http.NoBody {
		return
	}
	if _, whole, _ := readahead.Ahead(r); whole {
		return // readPrefix read it
	}
	heldBodies.Read(r, maxHeldBodies)
}
