package caddymodule

import (
	"bytes"
	"io"
	"net/http"
	"strings"

	"github.com/lmwarden/caddy-warden/selection"
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
	if !ids && !fingerprint || !jsonBody(r) {
		return sessionkey.Identity{}
	}
	size := cfg.bodyScanBytes()
	if r.ContentLength > 0 && r.ContentLength < int64(size) {
		size = int(r.ContentLength) + 1 // +1: a body longer than announced is still read whole
	}
	prefix := make([]byte, size)
	n, err := io.ReadFull(r.Body, prefix)
	prefix = prefix[:n]
	replay(r, prefix, err, err == io.EOF || err == io.ErrUnexpectedEOF)
	return sessionkey.ReadBody(prefix, ids, fingerprint)
}

// jsonBody reports whether r has a body that may be a chat request: not an
// upload or a form.
func jsonBody(r *http.Request) bool {
	if r.Body == nil || r.Body == http.NoBody {
		return false
	}
	ct := r.Header.Get("Content-Type")
	return ct == "" || strings.Contains(strings.ToLower(ct), "json")
}

// routeRequest is what selection needs from a request's identity.
func routeRequest(id sessionkey.Identity) selection.Request {
	req := selection.Request{Hash: id.Key, Parent: id.Parent, Continues: id.Continues, Renamed: id.Renamed}
	switch id.Hint {
	case sessionkey.Compacting:
		req.Compaction = selection.Compacting
	case sessionkey.Compacted:
		req.Compaction = selection.CompactedPrefix
	}
	return req
}

// replay hands on the body of r whole although its first bytes, read,
// were read ahead, then err (a read error met), then the rest; whole says
// that the bytes read are the whole body, which is then not read again: a
// failed dial closes it, and a read after that would fail Caddy's retry.
func replay(r *http.Request, read []byte, err error, whole bool) {
	parts := []io.Reader{bytes.NewReader(read), errorReader{err}}
	if !whole {
		parts = append(parts, r.Body)
	}
	r.Body = replayedBody{
		Reader:    io.MultiReader(parts...),
		Closer:    r.Body,
		readAhead: len(read),
		whole:     whole,
	}
}

// replayedBody serves the bytes read ahead again, then the rest of the body.
type replayedBody struct {
	io.Reader
	io.Closer
	readAhead int
	whole     bool
}

// errorReader passes on a read error met while scanning (EOF ends the body
// as it would have).
type errorReader struct{ err error }

func (e errorReader) Read([]byte) (int, error) {
	if e.err == nil || e.err == io.ErrUnexpectedEOF {
		return 0, io.EOF
	}
	return 0, e.err
}
