package sessionkey

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestModel(t *testing.T) {
	for _, c := range []struct {
		name, body, model string
		more              bool
	}{
		{"Anthropic, first", `{"model":"claude-haiku-4-5","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, "claude-haiku-4-5", false},
		{"chat, after the messages", `{"messages":[{"role":"user","content":"hi"}],"model":"qwen3-4b","stream":true}`, "qwen3-4b", false},
		{"Responses", `{"instructions":"be brief","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"t"}]}],"model":"Qwen/Qwen3-Coder"}`, "Qwen/Qwen3-Coder", false},
		{"blanks", " {\n\t\"model\" :\r\n \"m\" }", "m", false},
		{"escaped name and value", `{"mod\u0065l":"a\/b\u002dc"}`, "a/b-c", false},
		{"the first of two", `{"model":"a","model":"b"}`, "a", false},
		{"in a string", `{"messages":[{"role":"user","content":"{\"model\":\"x\"} \\\"model\\\":\"y\""}]}`, "", false},
		{"nested", `{"metadata":{"model":"x"},"tools":[{"model":"y"}]}`, "", false},
		{"not a string", `{"model":null,"x":{"model":"y"}}`, "", false},
		{"none", `{"max_tokens":8,"temperature":0.5,"stream":false,"n":-1e3}`, "", false},
		{"empty object", `{}`, "", false},
		{"an array", `[{"model":"m"}]`, "", false},
		{"not JSON", `model=m`, "", false},
		{"missing colon", `{"model" "m"}`, "", false},
		{"missing comma", `{"a":1 "model":"m"}`, "", false},
		{"cut before", `{"messages":[{"role":"user","content":"hi`, "", true},
		{"cut in the name", `{"messages":[],"mod`, "", true},
		{"cut in the value", `{"model":"qwen`, "", true},
		{"cut in a number", `{"max_tokens":12`, "", true},
		{"cut after a value", `{"max_tokens":12,`, "", true},
		{"cut after the model", `{"model":"m","messages":[`, "m", false},
		{"empty", ``, "", true},
	} {
		model, more := Model([]byte(c.body))
		if string(model) != c.model || more != c.more {
			t.Errorf("%s: %q, more %v; want %q, more %v", c.name, model, more, c.model, c.more)
		}
	}
}

// referenceModel is what encoding/json reads as the body's first top-level
// model string.
func referenceModel(body []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", false
	}
	for dec.More() {
		name, err := dec.Token()
		if err != nil {
			return "", false
		}
		var value json.RawMessage
		if dec.Decode(&value) != nil {
			return "", false
		}
		if name == "model" {
			var s string
			err := json.Unmarshal(value, &s)
			return s, err == nil
		}
	}
	return "", false
}

// FuzzModel: on a valid JSON body, Model reads what encoding/json does, and
// on every prefix of it either the same model or nothing yet, asking for
// more; on any bytes it neither panics nor reads past them.
func FuzzModel(f *testing.F) {
	for _, seed := range []string{
		`{"model":"claude-haiku-4-5","messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":"a \"model\": \"x\""}],"model":"qwen3-4b"}`,
		`{"mod\u0065l":"\u0071wen"}`,
		`{"a":[1,{"b":"}"}],"model":"m"}`,
		`{"model":7}`,
		`{"x":"\\\\","model":"m"}`,
		"{\"model\":\"\xff\"}",
		`{"model":"m"`,
		`[`,
		``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		model, more := Model(body)
		if len(model) > 3*len(body) {
			t.Fatalf("a model of %d bytes from %d", len(model), len(body))
		}
		if !json.Valid(body) || !utf8.Valid(body) {
			return
		}
		want, found := referenceModel(body)
		if string(model) != want || (model != nil) != found || more {
			t.Fatalf("%q: %q (more %v), want %q (found %v)", body, model, more, want, found)
		}
		for n := range len(body) {
			m, more := Model(body[:n])
			switch {
			case m == nil && !more && found:
				t.Fatalf("cut at %d of %q: no model and no more, want %q", n, body, want)
			case m != nil && string(m) != want:
				t.Fatalf("cut at %d of %q: %q, want %q", n, body, m, want)
			}
		}
	})
}

// bodies are a coding agent's requests of about 1 MiB: the model first
// (Anthropic's SDK, Codex), after the conversation (Python's OpenAI SDK),
// and none.
func bodies() map[string][]byte {
	var messages strings.Builder
	messages.WriteString(`[{"role":"system","content":"You are a coding agent."}`)
	for i := 0; messages.Len() < 1<<20; i++ {
		fmt.Fprintf(&messages, `,{"role":"user","content":[{"type":"text","text":%q}]},{"role":"assistant","content":"done, \"model\": see {below} [%d]"}`,
			strings.Repeat("Read main.go and fix the failing test. ", 40), i)
	}
	messages.WriteString("]")
	m := messages.String()
	return map[string][]byte{
		"first": []byte(`{"model":"claude-sonnet-4-5","max_tokens":32000,"messages":` + m + `,"stream":true}`),
		"last":  []byte(`{"messages":` + m + `,"stream":true,"model":"qwen3-coder"}`),
		"none":  []byte(`{"messages":` + m + `,"stream":true}`),
	}
}

// Reading the model allocates nothing, wherever it stands in the body.
func TestModelAllocs(t *testing.T) {
	for name, body := range bodies() {
		if n := testing.AllocsPerRun(10, func() { Model(body) }); n != 0 {
			t.Errorf("%s: %v allocations", name, n)
		}
	}
}

func BenchmarkModel(b *testing.B) {
	for _, name := range []string{"first", "last", "none"} {
		body := bodies()[name]
		b.Run(fmt.Sprintf("%s-%dKiB", name, len(body)>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				Model(body)
			}
		})
	}
}
