package caddymodule

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/lmwarden/caddy-warden/inflight"
	"github.com/lmwarden/caddy-warden/livemodel"
	"github.com/lmwarden/caddy-warden/readahead"
	"github.com/lmwarden/caddy-warden/selection"
)

// maxRefreshBody bounds the body kept for refreshes: a larger one (images,
// documents) is not kept, and its conversation's cache not refreshed.
const maxRefreshBody = 4 << 20

// refreshHeaders are the request headers a refresh carries: what vLLM (or a
// gateway in front of it) may ask of a request besides its body.
var refreshHeaders = []string{"Authorization", "X-Api-Key", "Anthropic-Version", "Anthropic-Beta"}

// keepPrompt keeps a turn's request for the refreshes of its conversation's
// cache while load control keeps it for a person within their share
// (livemodel/refresh.go): its whole body, read here and handed on intact.
// A side call's is not the conversation's prompt.
func (p *Policy) keepPrompt(view *selection.View, r *http.Request, held *inflight.Request, flow uint64) {
	if held.Ticket.SideCall() || !view.WithinShare(flow) || !readahead.MayBeJSON(r) {
		return
	}
	data, whole := heldBodies.Read(r, maxRefreshBody)
	if !whole {
		return
	}
	body, ok := refreshBody(r.URL.Path, data)
	if !ok {
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

// refreshBody is a chat request's body made to generate one token, without
// a stream: the same prompt, so that the engine finds it cached and frees
// its blocks anew. The Responses API bounds its output with
// max_output_tokens, the others with max_tokens (or max_completion_tokens).
func refreshBody(path string, body []byte) ([]byte, bool) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil || fields == nil {
		return nil, false
	}
	one := json.RawMessage("1")
	if strings.HasSuffix(path, "/responses") {
		fields["max_output_tokens"] = one
	} else {
		fields["max_tokens"] = one
		if _, ok := fields["max_completion_tokens"]; ok {
			fields["max_completion_tokens"] = one
		}
	}
	fields["stream"] = json.RawMessage("false")
	delete(fields, "stream_options")
	delete(fields, "n")
	out, err := json.Marshal(fields)
	return out, err == nil
}
