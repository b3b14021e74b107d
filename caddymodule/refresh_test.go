package caddymodule

import (
	"encoding/json"
	"maps"
	"testing"
)

// A refresh asks for one token and no stream, in each API's own field,
// and keeps the rest of the request as it was; a body that is not a JSON
// object is not kept.
func TestRefreshBodyAsksForOneToken(t *testing.T) {
	cases := []struct {
		path, body string
		want       map[string]string // every field, as JSON
	}{
		{"/v1/messages", `{"model":"m","max_tokens":4096,"stream":true,"system":"s","messages":[{"role":"user","content":"hi"}]}`,
			map[string]string{"model": `"m"`, "max_tokens": "1", "stream": "false", "system": `"s"`, "messages": `[{"role":"user","content":"hi"}]`}},
		{"/v1/chat/completions", `{"model":"m","max_completion_tokens":500,"stream":true,"stream_options":{"include_usage":true},"n":2,"messages":[]}`,
			map[string]string{"model": `"m"`, "max_tokens": "1", "max_completion_tokens": "1", "stream": "false", "messages": "[]"}},
		{"/v1/responses", `{"model":"m","input":"hi","stream":true}`,
			map[string]string{"model": `"m"`, "input": `"hi"`, "max_output_tokens": "1", "stream": "false"}},
	}
	for _, c := range cases {
		out, ok := refreshBody(c.path, []byte(c.body))
		var got map[string]json.RawMessage
		if !ok || json.Unmarshal(out, &got) != nil {
			t.Fatalf("%s: %s, %v", c.path, out, ok)
		}
		fields := map[string]string{}
		for k, v := range got {
			fields[k] = string(v)
		}
		if !maps.Equal(fields, c.want) {
			t.Errorf("%s: %s, want the fields %v", c.path, out, c.want)
		}
	}
	for _, body := range []string{``, `[1]`, `null`, `{"model":`} {
		if out, ok := refreshBody("/v1/messages", []byte(body)); ok {
			t.Errorf("%q made %s, want none", body, out)
		}
	}
}
