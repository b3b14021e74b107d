package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lmwarden/caddy-warden/sessionkey"
)

// modelRequest is a POST of body as Caddy hands it to matchers: with the
// request's variables, and announced (Content-Length) or chunked. chunks
// reads the body a few bytes at a time, as a slow client sends it. The
// request ends with the test, giving back the bytes read of the process's
// budget for bodies.
func modelRequest(t testing.TB, body []byte, announced, chunks bool) *http.Request {
	ctx, end := context.WithCancel(context.Background())
	t.Cleanup(end)
	return modelRequestIn(ctx, body, announced, chunks)
}

func modelRequestIn(ctx context.Context, body []byte, announced, chunks bool) *http.Request {
	var rd io.Reader = bytes.NewReader(body)
	if chunks {
		rd = iotest.HalfReader(rd)
	}
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/messages", rd)
	r.Header.Set("Content-Type", "application/json")
	if !announced {
		r.ContentLength = -1
	}
	return r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
}

// handedOn checks that the request's body reads as sent.
func handedOn(t *testing.T, name string, r *http.Request, want []byte) {
	t.Helper()
	got, err := io.ReadAll(r.Body)
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("%s: handed on %d bytes (%v), want the %d sent", name, len(got), err, len(want))
	}
}

func TestMatchModel(t *testing.T) {
	long := strings.Repeat(`{"role":"user","content":"the same words again and again"},`, 20_000) // ~1 MiB
	for _, c := range []struct {
		name, body string
		match      bool
	}{
		{"Anthropic", `{"model":"claude-haiku-4-5","max_tokens":8,"messages":[]}`, true},
		{"Chat Completions, model last", `{"messages":[` + long + `{"role":"user","content":"hi"}],"model":"qwen3-4b"}`, true},
		{"Responses", `{"model":"qwen3-4b","input":"hi"}`, true},
		{"count_tokens", `{"model":"claude-haiku-4-5-20251001","messages":[{"role":"user","content":"count"}]}`, true},
		{"another model", `{"model":"qwen3-coder","messages":[]}`, false},
		{"a pattern does not cross /", `{"model":"claude-haiku/x","messages":[]}`, false},
		{"no model", `{"messages":[` + long + `{"role":"user","content":"hi"}]}`, false},
		{"a model in a message", `{"messages":[{"role":"user","content":"{\"model\":\"qwen3-4b\"}"}]}`, false},
		{"not JSON", `model=qwen3-4b`, false},
		{"cut", `{"model":"qwen3-4`, false},
		{"empty", ``, false},
	} {
		m := MatchModel{"claude-haiku-*", "qwen3-4b"}
		for _, announced := range []bool{true, false} {
			name := fmt.Sprintf("%s, announced %v", c.name, announced)
			r := modelRequest(t, []byte(c.body), announced, true)
			if got, err := m.MatchWithError(r); got != c.match || err != nil {
				t.Errorf("%s: matched %v (%v), want %v", name, got, err, c.match)
			}
			handedOn(t, name, r, []byte(c.body))
		}
	}
}

// The body is read once per request, however many warden_model matchers
// read its model, and the model is a request variable.
func TestMatchModelReadsOnce(t *testing.T) {
	body := []byte(`{"model":"qwen3-coder","messages":[]}`)
	r := modelRequest(t, body, true, false)
	small, large := MatchModel{"qwen3-4b"}, MatchModel{"qwen3-coder"}
	if got, _ := small.MatchWithError(r); got {
		t.Error("the small model's matcher matched")
	}
	read := r.Body
	if got, _ := large.MatchWithError(r); !got {
		t.Error("the large model's matcher did not match")
	}
	if r.Body != read {
		t.Error("the second matcher read the body again")
	}
	if got := caddyhttp.GetVar(r.Context(), varModel); got != "qwen3-coder" {
		t.Errorf("{http.vars.%s} = %v", varModel, got)
	}
	handedOn(t, "two matchers", r, body)
}

// A body that is no chat request is left alone: a form, an upload, none.
func TestMatchModelLeavesOtherBodies(t *testing.T) {
	for _, ct := range []string{"multipart/form-data; boundary=x", "application/x-www-form-urlencoded"} {
		body := &trackedBody{Reader: strings.NewReader(`{"model":"m"}`)}
		r := modelRequest(t, nil, true, false)
		r.Body = body
		r.Header.Set("Content-Type", ct)
		if got, _ := (MatchModel{"*"}).MatchWithError(r); got || body.read {
			t.Errorf("%s: matched %v, body read %v", ct, got, body.read)
		}
	}
	r := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
	if got, _ := (MatchModel{"*"}).MatchWithError(r); got {
		t.Error("a GET without a body matched")
	}
}

// A model past maxModelScan is not read, nor one too long to be a name;
// a read error is handed on, after the bytes read.
func TestMatchModelBounds(t *testing.T) {
	far := []byte(`{"messages":["` + strings.Repeat("x", maxModelScan) + `"],"model":"m"}`)
	r := modelRequest(t, far, true, false)
	if got, _ := (MatchModel{"m"}).MatchWithError(r); got {
		t.Error("a model past maxModelScan matched")
	}
	handedOn(t, "past maxModelScan", r, far)

	huge := []byte(`{"model":"` + strings.Repeat("m", maxModelName+1) + `"}`)
	r = modelRequest(t, huge, true, false)
	if got, _ := (MatchModel{"*"}).MatchWithError(r); got {
		t.Error("a model name over maxModelName matched")
	}
	handedOn(t, "a long name", r, huge)

	broken := errors.New("connection reset")
	r = modelRequest(t, nil, false, false)
	r.Body = io.NopCloser(io.MultiReader(strings.NewReader(`{"messages":[`), iotest.ErrReader(broken)))
	if got, err := (MatchModel{"*"}).MatchWithError(r); got || err != nil {
		t.Errorf("a body cut by a read error: matched %v (%v)", got, err)
	}
	got, err := io.ReadAll(r.Body)
	if string(got) != `{"messages":[` || !errors.Is(err, broken) {
		t.Errorf("handed on %q then %v, want the bytes read then the error", got, err)
	}
}

func TestMatchModelCaddyfile(t *testing.T) {
	var m MatchModel
	d := caddyfile.NewTestDispenser("warden_model claude-haiku-* qwen3-4b\nwarden_model Qwen/*")
	if err := m.UnmarshalCaddyfile(d); err != nil || fmt.Sprint(m) != "[claude-haiku-* qwen3-4b Qwen/*]" {
		t.Errorf("%v, %v", m, err)
	}
	for input, want := range map[string]string{
		"warden_model":             "expected at least one model name or pattern",
		"warden_model qwen3-[4b":   `pattern "qwen3-[4b": syntax error in pattern`,
		"warden_model m {\n\tx\n}": "warden_model takes no block",
	} {
		var m MatchModel
		err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", input, err, want)
		}
	}
	if err := (MatchModel{}).Validate(); err == nil {
		t.Error("a JSON matcher without patterns is valid")
	}
	if err := (MatchModel{"a", "["}).Validate(); err == nil {
		t.Error("a JSON matcher with a bad pattern is valid")
	}
}

// FuzzMatchModel sends any bytes, announced or not, at any pace: the
// matcher reads the model sessionkey.Model reads in the bytes it may scan,
// and hands the body on intact.
func FuzzMatchModel(f *testing.F) {
	f.Add([]byte(`{"model":"claude-haiku-4-5","messages":[]}`), true, false)
	f.Add([]byte(`{"messages":[{"role":"user","content":"x"}],"model":"q"}`), false, true)
	f.Add([]byte(`{"model":"m"`), true, true)
	f.Add([]byte(`{"mod\u0065l":"\u0071"}`), false, false)
	f.Add([]byte(`not json`), true, false)
	f.Fuzz(func(t *testing.T, body []byte, announced, chunks bool) {
		r := modelRequest(t, body, announced, chunks)
		got := requestModel(r)
		model, _ := sessionkey.Model(body[:min(len(body), maxModelScan)])
		if len(model) > maxModelName {
			model = nil
		}
		if got != string(model) {
			t.Fatalf("%q: read model %q, want %q", body, got, model)
		}
		handedOn(t, "fuzzed", r, body)
	})
}

// bodiesForModel are requests of about 1 MiB: the model first (Claude Code,
// Codex, OpenCode), after the conversation (Python's OpenAI SDK), and none.
func bodiesForModel() map[string][]byte {
	messages := `[` + strings.Repeat(`{"role":"user","content":"Read main.go and fix the failing test, then run the tests again."},`, 12_000) + `{"role":"user","content":"go"}]`
	return map[string][]byte{
		"first": []byte(`{"model":"claude-sonnet-4-5","max_tokens":32000,"messages":` + messages + `}`),
		"last":  []byte(`{"messages":` + messages + `,"stream":true,"model":"qwen3-coder"}`),
		"none":  []byte(`{"messages":` + messages + `,"stream":true}`),
	}
}

// matchOnce runs a matcher, if given, on a fresh request of body, as Caddy
// would for each request, reads the body as the upstream's transport would
// (Read after Read, into a buffer) and ends the request, which gives the
// bytes read back to the budget.
func matchOnce(m MatchModel, body []byte, announced bool) {
	ctx, end := context.WithCancel(context.Background())
	r := modelRequestIn(ctx, body, announced, false)
	if m != nil {
		_, _ = m.MatchWithError(r)
	}
	_, _ = io.Copy(io.Discard, struct{ io.Reader }{r.Body})
	end()
}

// BenchmarkMatchModel times a request through the matcher, and without it
// (unmatched: the request's own cost, its body read by the upstream).
func BenchmarkMatchModel(b *testing.B) {
	m := MatchModel{"claude-haiku-*", "qwen3-4b", "qwen3-coder"}
	for _, name := range []string{"first", "last", "none"} {
		body := bodiesForModel()[name]
		for _, announced := range []bool{true, false} {
			for _, matcher := range []MatchModel{m, nil} {
				b.Run(fmt.Sprintf("%s-%dKiB-announced-%v-matched-%v", name, len(body)>>10, announced, matcher != nil), func(b *testing.B) {
					b.SetBytes(int64(len(body)))
					b.ReportAllocs()
					for b.Loop() {
						matchOnce(matcher, body, announced)
					}
				})
			}
		}
	}
}

// The matcher allocates its scan buffer and a few small values: the bytes
// read (and its first step's buffer), or for a body of unannounced length,
// read in doubling steps, at most four times them. The slack covers the
// small values and the allocator's rounding of a large buffer to pages.
func TestMatchModelAllocs(t *testing.T) {
	m := MatchModel{"claude-haiku-*", "qwen3-4b", "qwen3-coder"}
	for name, body := range bodiesForModel() {
		read := len(body)
		if name == "first" {
			read = firstModelRead
		}
		for _, announced := range []bool{true, false} {
			own, ownAllocs := allocated(func() { matchOnce(nil, body, announced) })
			all, allocs := allocated(func() { matchOnce(m, body, announced) })
			extra := all - min(own, all)
			limit := uint64(read + firstModelRead + 16<<10)
			if !announced {
				limit = uint64(4*read + 16<<10)
			}
			t.Logf("%s, announced %v: %d bytes read; beyond the request's own, %d bytes allocated in %d allocations",
				name, announced, read, extra, allocs-ownAllocs)
			if extra > limit {
				t.Errorf("%s, announced %v: %d bytes allocated for %d read", name, announced, extra, read)
			}
		}
	}
}

// allocated is what f allocates per run, in bytes and in allocations. The
// counters are the process's: other goroutines (a test's servers winding
// down, the runtime) add to them, never take away, so the least of a few
// measurements is f's own.
func allocated(f func()) (bytes, allocs uint64) {
	const runs, tries = 4, 5
	f() // warm up
	bytes, allocs = math.MaxUint64, math.MaxUint64
	for range tries {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range runs {
			f()
		}
		runtime.ReadMemStats(&after)
		bytes = min(bytes, (after.TotalAlloc-before.TotalAlloc)/runs)
		allocs = min(allocs, (after.Mallocs-before.Mallocs)/runs)
	}
	return bytes, allocs
}
