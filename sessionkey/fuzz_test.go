package sessionkey

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzFromBody feeds arbitrary bytes, as a hostile client would send with
// session_from_body on: FromBody must not panic, must answer the same for
// the same bytes, and returns valid UTF-8 of bounded size (JSON decoding
// turns each invalid byte into U+FFFD, three bytes, and never grows more).
func FuzzFromBody(f *testing.F) {
	for _, seed := range []string{
		`{"metadata":{"user_id":"{\"device_id\":\"d\",\"account_uuid\":\"a\",\"session_id\":\"s-1\"}"}}`,
		`{"metadata":{"user_id":"user_abc_account_def_session_s-2"}}`,
		`{"user":"u","session_id":"s-4"}`,
		`{"metadata":{"user_id":42},"user":"u-6"}`,
		`{"messages":[{"role":"user","content":"aaaa`,
		`{"metadata":{"user_id":"\ud800"}}`,
		"{\"user\":\"\xff\xfe\"}",
		`[1,2]`,
		``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		key := FromBody(body)
		if again := FromBody(body); again != key {
			t.Fatalf("not deterministic: %q then %q", key, again)
		}
		if len(key) > 3*len(body) {
			t.Fatalf("key of %d bytes from a body of %d", len(key), len(body))
		}
		if !utf8.ValidString(key) {
			t.Fatalf("key %q is not valid UTF-8", key)
		}
	})
}

// FuzzFromBodyRoundTrip writes Claude Code's request around a session ID
// and cuts it anywhere, as body_scan_bytes would: the ID must come back
// whenever the cut keeps the whole metadata field, and nothing may come back
// when the cut falls before it (no other field names a session there).
func FuzzFromBodyRoundTrip(f *testing.F) {
	f.Add("5f0c8e3a-1b2c-4d5e-8f90-0123456789ab", "hello", uint16(0), false)
	f.Add("s\"-\\1", "a\x00b", uint16(7), true)
	f.Add("\xff\xfe", "\u2028", uint16(200), false)
	f.Add("x_session_y", "", uint16(60), true)
	f.Fuzz(func(t *testing.T, sessionID, content string, cut uint16, beforeMetadata bool) {
		userID := mustMarshal(t, map[string]string{"device_id": "d", "account_uuid": "a", "session_id": sessionID})
		request := mustMarshal(t, map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": content}}})
		metadata := mustMarshal(t, map[string]string{"user_id": string(userID)})
		head := string(request[:len(request)-1]) + `,"metadata":`
		body := head + string(metadata) + `,"stream":true}`
		var want string // the ID as JSON carries it: invalid UTF-8 becomes U+FFFD
		_ = json.Unmarshal(mustMarshal(t, sessionID), &want)
		if want == "" {
			return // an empty session_id falls back to the whole user_id, by design
		}
		if beforeMetadata {
			n := int(cut) % (len(head) + 1)
			if got := FromBody([]byte(body[:n])); got != "" {
				t.Fatalf("cut at %d, before the metadata: got %q from %q", n, got, body[:n])
			}
			return
		}
		whole := len(head) + len(metadata)
		n := whole + int(cut)%(len(body)-whole+1)
		if got := FromBody([]byte(body[:n])); got != want {
			t.Fatalf("cut at %d of %d: got %q, want %q\nbody %q", n, len(body), got, want, body[:n])
		}
	})
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzFromHeaders puts arbitrary bytes in a session header of a request as
// it arrives on the wire: a request Go's parser accepts must yield exactly
// the header's value as parsed, and never a key holding a line break (which
// could forge log lines or headers downstream).
func FuzzFromHeaders(f *testing.F) {
	names := []string{"X-Claude-Code-Session-Id", "X-Session-Id", "X-Session-Affinity", "Session-Id"}
	f.Add("X-Claude-Code-Session-Id", "5f0c8e3a-1b2c-4d5e-8f90-0123456789ab")
	f.Add("x-session-id", " padded\t")
	f.Add("Session-Id", "\xff\xfe\x00")
	f.Add("X-Session-Affinity", "a\r\nX-Injected: 1")
	f.Fuzz(func(t *testing.T, name, value string) {
		raw := "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n" + name + ": " + value + "\r\nContent-Length: 0\r\n\r\n"
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return // refused by the HTTP parser, as Caddy's server would refuse it
		}
		key := FromHeaders(req.Header, names)
		var want string
		for _, n := range names {
			if v := req.Header.Get(n); v != "" {
				want = v
				break
			}
		}
		if key != want {
			t.Fatalf("got %q, want %q", key, want)
		}
		if strings.ContainsAny(key, "\r\n") {
			t.Fatalf("key %q holds a line break", key)
		}
	})
}

// FuzzReadBody feeds arbitrary bytes as a header-less request's body: no
// panic, the same answer for the same bytes, and a key exactly when a source
// says so.
func FuzzReadBody(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","content":"a"}]}`,
		`{"instructions":"i","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"t"}]},{"type":"reasoning"},{"type":"function_call","call_id":"c"}],"prompt_cache_key":"k"}`,
		`{"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
		`{"session_id":"s","messages":[`,
		`{"messages":[{"role":"user","content":1e999}]}`,
		`{"input":"one shot"}`,
		`{"messages":[[[[[[[[[[`,
	} {
		f.Add([]byte(seed), true, true)
	}
	f.Fuzz(func(t *testing.T, body []byte, ids, fingerprint bool) {
		id := ReadBody(body, ids, fingerprint)
		if again := ReadBody(body, ids, fingerprint); again != id {
			t.Fatalf("not deterministic: %+v then %+v", id, again)
		}
		switch {
		case id.Key == 0 && (id.Source != None || id.Parent != 0):
			t.Fatalf("no key but %+v", id)
		case id.Source == Fingerprint && !fingerprint, id.Source == Body && !ids:
			t.Fatalf("%+v from a source that is off", id)
		case id.Source == Header || id.Hint != NoHint:
			t.Fatalf("%+v from a body", id)
		}
	})
}

// FuzzRulesFromHeaders puts arbitrary values in every header the agents'
// rules read: no panic, and a key exactly when a session header is present.
func FuzzRulesFromHeaders(f *testing.F) {
	f.Add("s", "a", "p", "T", `{"request_kind":"compaction"}`, "compact")
	f.Add("", "", "", "", `"request_kind":`, "")
	f.Fuzz(func(t *testing.T, session, agent, parent, thread, meta, subagent string) {
		h := http.Header{}
		for k, v := range map[string]string{"X-Claude-Code-Session-Id": session, "X-Claude-Code-Agent-Id": agent,
			"X-Claude-Code-Parent-Agent-Id": parent, "Thread-Id": thread, "Session-Id": session,
			"X-Codex-Turn-Metadata": meta, "X-Openai-Subagent": subagent, "X-Parent-Session-Id": parent} {
			if v != "" {
				h.Set(k, v)
			}
		}
		id := NewRules(nil, true, true).FromHeaders(h)
		if (id.Key != 0) != (session != "" || thread != "") {
			t.Fatalf("headers %v: %+v", h, id)
		}
		if id.Key != 0 && id.Parent == id.Key {
			t.Fatalf("its own parent: %+v", id)
		}
	})
}
