package caddymodule

import (
	"bytes"
	"io"
	"net/http"

	"github.com/lmwarden/caddy-warden/sessionkey"
)

// sessionKey names the request's conversation from the model's session
// headers or, with session_from_body, from the first bytes of its body,
// which is handed on intact.
func sessionKey(r *http.Request, cfg *ModelConfig) string {
	if key := sessionkey.FromHeaders(r.Header, cfg.sessionHeaders()); key != "" || !cfg.SessionFromBody {
		return key
	}
	if r.Body == nil || r.Body == http.NoBody {
		return ""
	}
	prefix := make([]byte, cfg.bodyScanBytes())
	n, err := io.ReadFull(r.Body, prefix)
	prefix = prefix[:n]
	r.Body = replayedBody{Reader: io.MultiReader(bytes.NewReader(prefix), errorReader{err}, r.Body), Closer: r.Body}
	return sessionkey.FromBody(prefix)
}

// replayedBody serves the scanned prefix again, then the rest of the body.
type replayedBody struct {
	io.Reader
	io.Closer
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
