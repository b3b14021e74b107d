package caddymodule

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lmwarden/caddy-warden/sessionkey"
)

var on, off = ptr(true), ptr(false)

func ptr[T any](v T) *T { return &v }

// hashOf is the key of a raw ID, 0 for none.
func hashOf(id string) uint64 {
	if id == "" {
		return 0
	}
	return sessionkey.Hash(id)
}

// sessionRequest is a POST with the body and headers given.
func sessionRequest(body io.Reader, header ...string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/messages", body)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	return r
}

// trackedBody records whether it was read or closed.
type trackedBody struct {
	io.Reader
	read, closed bool
}

func (b *trackedBody) Read(p []byte) (int, error) { b.read = true; return b.Reader.Read(p) }
func (b *trackedBody) Close() error               { b.closed = true; return nil }

const anthropicBody = `{"model":"m","metadata":{"user_id":"{\"device_id\":\"d\",\"account_uuid\":\"a\",\"session_id\":\"s-anthropic\"}"},"messages":[]}`

func TestSessionKeyHeadersFirst(t *testing.T) {
	fromBody := &ModelConfig{SessionFromBody: on}
	body := &trackedBody{Reader: strings.NewReader(anthropicBody)}
	r := sessionRequest(nil, "X-Session-Id", "from-header")
	r.Body = body
	if got := sessionKey(r, fromBody).Key; got != hashOf("from-header") {
		t.Errorf("key %x, want the header's", got)
	}
	if body.read || r.Body != io.ReadCloser(body) {
		t.Error("the body was read although a header named the session")
	}

	// Custom session_headers replace the defaults, in their order.
	custom := &ModelConfig{SessionHeaders: []string{"X-Conversation", "X-Tenant-Session"}}
	r = sessionRequest(nil, "X-Claude-Code-Session-Id", "default", "X-Tenant-Session", "tenant", "X-Conversation", "conv")
	if got := sessionKey(r, custom).Key; got != hashOf("conv") {
		t.Errorf("custom headers: key %x, want conv", got)
	}
	r = sessionRequest(nil, "X-Claude-Code-Session-Id", "default", "X-Tenant-Session", "tenant")
	if got := sessionKey(r, custom).Key; got != hashOf("tenant") {
		t.Errorf("custom headers: key %x, want tenant", got)
	}
	r = sessionRequest(nil, "X-Claude-Code-Session-Id", "default")
	if got := sessionKey(r, custom).Key; got != hashOf("") {
		t.Errorf("custom headers: key %x from a default header", got)
	}
	// An empty header is absent.
	r = sessionRequest(nil, "X-Claude-Code-Session-Id", "", "Session-Id", "last")
	if got := sessionKey(r, &ModelConfig{}).Key; got != hashOf("last") {
		t.Errorf("key %x, want last", got)
	}
}

func TestSessionKeyBodyOnlyWhenAsked(t *testing.T) {
	body := &trackedBody{Reader: strings.NewReader(anthropicBody)}
	r := sessionRequest(nil)
	r.Body = body
	if got := sessionKey(r, &ModelConfig{SessionFromBody: off, Fingerprint: off}).Key; got != hashOf("") {
		t.Errorf("session_from_body and fingerprint off: key %x", got)
	}
	if body.read || r.Body != io.ReadCloser(body) {
		t.Error("session_from_body and fingerprint off: the body was read or replaced")
	}
	for _, b := range []io.ReadCloser{nil, http.NoBody} {
		r := sessionRequest(nil)
		r.Body = b
		if got := sessionKey(r, &ModelConfig{SessionFromBody: on}).Key; got != hashOf("") || r.Body != b {
			t.Errorf("body %v: key %x, body now %v", b, got, r.Body)
		}
	}
}

func TestSessionKeyFromBody(t *testing.T) {
	cfg := &ModelConfig{SessionFromBody: on}
	for _, c := range []struct{ name, body, want string }{
		{"Anthropic metadata.user_id holding JSON", anthropicBody, "s-anthropic"},
		{"Anthropic metadata.user_id, older form", `{"metadata":{"user_id":"user_abc_account_def_session_s-legacy"},"messages":[]}`, "s-legacy"},
		{"OpenAI user", `{"model":"m","user":"u-openai","messages":[]}`, "u-openai"},
		{"vLLM session_id", `{"session_id":"s-vllm","messages":[]}`, "s-vllm"},
		{"no session", `{"model":"m","messages":[]}`, ""},
		{"not JSON", "\x00\x01 binary", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := sessionRequest(strings.NewReader(c.body))
			if got := sessionKey(r, cfg).Key; got != hashOf(c.want) {
				t.Errorf("key %x, want %q", got, c.want)
			}
			if got, err := io.ReadAll(r.Body); err != nil || string(got) != c.body {
				t.Errorf("body handed on: %q, %v; want %q", got, err, c.body)
			}
		})
	}
}

// The scan reads at most body_scan_bytes; the proxy gets every byte.
func TestSessionKeyLongBodyIntact(t *testing.T) {
	head := `{"metadata":{"user_id":"{\"session_id\":\"s-early\"}"},"messages":[{"role":"user","content":"`
	long := head + strings.Repeat("x", 100<<10) + `"}],"user":"late"}`
	cfg := &ModelConfig{SessionFromBody: on, BodyScanBytes: len(head) + 10}
	body := &trackedBody{Reader: strings.NewReader(long)}
	r := sessionRequest(nil)
	r.Body = body
	if got := sessionKey(r, cfg).Key; got != hashOf("s-early") {
		t.Errorf("key %x, want s-early", got)
	}
	if got, err := io.ReadAll(r.Body); err != nil || string(got) != long {
		t.Errorf("body handed on: %d bytes, %v; want the %d sent", len(got), err, len(long))
	}
	if err := r.Body.Close(); err != nil || !body.closed {
		t.Errorf("closing the handed-on body: %v, original closed %v", err, body.closed)
	}

	// A session named past the scan limit is not found, and the body is
	// still whole.
	r = sessionRequest(strings.NewReader(`{"messages":[{"content":"` + strings.Repeat("y", 1000) + `"}],"user":"late"}`))
	if got := sessionKey(r, &ModelConfig{SessionFromBody: on, BodyScanBytes: 64}).Key; got != hashOf("") {
		t.Errorf("key %x from past the scan limit", got)
	}
	if got, _ := io.ReadAll(r.Body); len(got) != 1000+len(`{"messages":[{"content":""}],"user":"late"}`) {
		t.Errorf("body handed on: %d bytes", len(got))
	}
}

// failingReader serves data, then fails with err once, then reports EOF:
// like net/http's request body, whose error does not repeat, so the scan
// must keep it for the proxy.
type failingReader struct {
	data []byte
	err  error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if len(f.data) == 0 {
		err := f.err
		f.err = io.EOF
		return 0, err
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

// A read error met while scanning reaches the proxy after the bytes read
// before it, as it would have without the scan.
func TestSessionKeyReadErrorHandedOn(t *testing.T) {
	reset := errors.New("connection reset by peer")
	for _, c := range []struct {
		name    string
		sent    string
		scan    int
		wantKey string
	}{
		{"within the scan", `{"user":"u-1","messages":[{"content":"abc`, 4096, "u-1"},
		{"past the scan", `{"user":"u-2","messages":[{"content":"` + strings.Repeat("z", 500), 64, "u-2"},
		{"before any byte", "", 64, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := sessionRequest(nil)
			r.Body = io.NopCloser(&failingReader{data: []byte(c.sent), err: reset})
			if got := sessionKey(r, &ModelConfig{SessionFromBody: on, BodyScanBytes: c.scan}).Key; got != hashOf(c.wantKey) {
				t.Errorf("key %x, want %q", got, c.wantKey)
			}
			got, err := io.ReadAll(r.Body)
			if string(got) != c.sent {
				t.Errorf("body handed on: %q, want %q", got, c.sent)
			}
			if !errors.Is(err, reset) {
				t.Errorf("read error handed on: %v, want %v", err, reset)
			}
		})
	}
}

// Reading the handed-on body in small pieces gives the same bytes.
func TestSessionKeyBodyReadInPieces(t *testing.T) {
	sent := anthropicBody + strings.Repeat(" ", 300)
	r := sessionRequest(strings.NewReader(sent))
	// The scan ends inside "messages", after the metadata.
	if got := sessionKey(r, &ModelConfig{SessionFromBody: on, BodyScanBytes: len(anthropicBody) - 5}).Key; got != hashOf("s-anthropic") {
		t.Fatalf("key %x", got)
	}
	var out bytes.Buffer
	buf := make([]byte, 7)
	for {
		n, err := r.Body.Read(buf)
		out.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if out.String() != sent {
		t.Errorf("read in pieces: %q, want %q", out.String(), sent)
	}
}
