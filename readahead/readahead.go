// Package readahead reads the start of a request body before the request
// is proxied (to key its conversation, name its model or size its prompt)
// and hands the body on intact: the bytes read first, then a read error
// met, then the rest. A Budget bounds the bytes held in memory at once
// across requests.
package readahead

import (
	"bytes"
	"io"
	"net/http"
	"strings"
)

// MayBeJSON reports whether r has a body that may be a chat request: not
// an upload or a form.
func MayBeJSON(r *http.Request) bool {
	if r.Body == nil || r.Body == http.NoBody {
		return false
	}
	ct := r.Header.Get("Content-Type")
	return ct == "" || strings.Contains(strings.ToLower(ct), "json")
}

// Head reads the first bytes of r's body, at most n of them, and hands the
// body on intact. A body announced shorter is read to one byte past its
// announced end, so that one longer than announced is still read whole.
func Head(r *http.Request, n int) []byte {
	if r.ContentLength > 0 && r.ContentLength < int64(n) {
		n = int(r.ContentLength) + 1
	}
	head := make([]byte, n)
	read, err := io.ReadFull(r.Body, head)
	head = head[:read]
	replay(r, head, err, err == io.EOF || err == io.ErrUnexpectedEOF)
	return head
}

// Ahead reports how much of r's body was read ahead and whether that is
// the whole body; ok is false when none of it was.
func Ahead(r *http.Request) (n int, whole, ok bool) {
	b, ok := r.Body.(replayedBody)
	return b.readAhead, b.whole, ok
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

// errorReader passes on a read error met while reading ahead (EOF ends the
// body as it would have).
type errorReader struct{ err error }

func (e errorReader) Read([]byte) (int, error) {
	if e.err == nil || e.err == io.ErrUnexpectedEOF {
		return 0, io.EOF
	}
	return 0, e.err
}
