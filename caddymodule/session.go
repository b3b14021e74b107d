package caddymodule

import (
	"net/http"

	"github.com/lmwarden/caddy-warden/readahead"
	"github.com/lmwarden/caddy-warden/sessionkey"
)

// sessionKey names the request's conversation from the model's session
// headers (with the agents' sub-agent and compaction headers) or, when none
// names it, from the first bytes of its JSON body, which is handed on
// intact: an ID field (session_from_body), else the conversation's
// fingerprint (fingerprint). A request a header names costs no allocation.
func sessionKey(r *http.Request, cfg *ModelConfig) sessionkey.Identity {
	if id := cfg.keyRules().FromHeaders(r.Header); id.Key != 0 {
		return id
	}
	ids, fingerprint := cfg.sessionFromBody(), cfg.fingerprint()
	if !ids && !fingerprint || !readahead.MayBeJSON(r) {
		return sessionkey.Identity{}
	}
	return sessionkey.ReadBody(readahead.Head(r, cfg.bodyScanBytes()), ids, fingerprint)
}
