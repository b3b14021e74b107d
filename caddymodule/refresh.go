package caddymodule

import (
	"net/http"
	"strings"

	"github.com/lmwarden/caddy-warden/inflight"
	"github.com/lmwarden/caddy-warden/livemodel"
	"github.com/lmwarden/caddy-warden/readahead"
	"github.com/lmwarden/caddy-warden/sessionkey"
)

// maxRefreshBody bounds the body kept for refreshes: a larger one (images,
// documents) is not kept, and its conversation's cache not refreshed.
const maxRefreshBody = 4 << 20

// refreshHeaders are the request headers a refresh carries: what vLLM (or a
// gateway in front of it) may ask of a request besides its body.
var refreshHeaders = []string{"Authorization", "X-Api-Key", "Anthropic-Version", "Anthropic-Beta"}

// refreshedAPIs end the paths of the APIs whose turns are refreshed: those
// that generate from a conversation's prompt.
var refreshedAPIs = []string{"/messages", "/chat/completions", "/completions", "/responses"}

// keepPrompt keeps a turn's request for the refreshes of its conversation's
// cache while load control keeps it for a person within their share
// (livemodel/refresh.go): its whole body, read here and handed on intact.
// A side call's is not the conversation's prompt, unless it is the first
// turn on a compacted prefix: the conversation goes on from there.
func (p *Policy) keepPrompt(r *http.Request, held *inflight.Request) {
	if !refreshed(r.URL.Path) || !readahead.MayBeJSON(r) || !held.Ticket.KeepsPrompt(held.ID.Hint == sessionkey.Compacted) {
		return
	}
	body, whole := heldBodies.Read(r, maxRefreshBody)
	if !whole {
		return
	}
	header := http.Header{"Content-Type": {"application/json"}}
	for _, name := range refreshHeaders {
		if v := r.Header.Values(name); len(v) > 0 {
			header[name] = v
		}
	}
	p.live.KeepPrompt(held.ID.Key, livemodel.Prompt{Path: r.URL.RequestURI(), Header: header, Body: body}, p.clock.Now())
}

// refreshed reports whether a turn on path is refreshed.
func refreshed(path string) bool {
	for _, api := range refreshedAPIs {
		if strings.HasSuffix(path, api) {
			return true
		}
	}
	return false
}
