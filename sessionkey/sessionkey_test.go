package sessionkey

import (
	"net/http"
	"testing"
)

func TestFromHeaders(t *testing.T) {
	h := http.Header{}
	h.Set("Session-Id", "late")
	h.Set("X-Session-Id", "early")
	if got := FromHeaders(h, []string{"X-Claude-Code-Session-Id", "X-Session-Id", "Session-Id"}); got != "early" {
		t.Fatalf("got %q", got)
	}
	if got := FromHeaders(http.Header{}, []string{"X-Session-Id"}); got != "" {
		t.Fatalf("got %q from no headers", got)
	}
}

func TestFromBody(t *testing.T) {
	cases := []struct{ name, body, want string }{
		{"claude code metadata", `{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":{"user_id":"{\"device_id\":\"d\",\"account_uuid\":\"a\",\"session_id\":\"s-1\"}"},"stream":true}`, "s-1"},
		{"legacy user_id", `{"metadata":{"user_id":"user_abc_account_def_session_s-2"}}`, "s-2"},
		{"plain user_id", `{"metadata":{"user_id":"someone"}}`, "someone"},
		{"openai user", `{"model":"m","user":"u-3","messages":[]}`, "u-3"},
		{"vllm session_id beats user", `{"user":"u","session_id":"s-4"}`, "s-4"},
		{"cut short after the key", `{"user":"u-5","messages":[{"role":"user","content":"aaaa`, "u-5"},
		{"cut short before the key", `{"messages":[{"role":"user","content":"aaaa`, ""},
		{"not json", `garbage`, ""},
		{"array", `[1,2]`, ""},
		{"wrong type", `{"metadata":{"user_id":42},"user":"u-6"}`, "u-6"},
		{"empty", ``, ""},
	}
	for _, c := range cases {
		if got := FromBody([]byte(c.body)); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}
