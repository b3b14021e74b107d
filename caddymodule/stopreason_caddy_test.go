package caddymodule_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/testnet"
	"github.com/lmwarden/caddy-warden/internal/testrun"
	"github.com/lmwarden/caddy-warden/panel"
)

// startSim runs the vLLM simulator on a free loopback port until the test
// ends; its replies are 1 to 4 tokens long, cut at max_tokens when that is
// lower. args are more of its flags.
func startSim(t *testing.T, args ...string) string {
	t.Helper()
	port := testnet.Port(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, vllmsimBinary(t), append([]string{"--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--model", "m", "--time-scale", "20", "--output-len", "uniform:1:4"}, args...)...)
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
	})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	testnet.WaitListening(t, addr, 30*time.Second)
	return addr
}

// lingering is load control on with residents lingering a minute, and
// warden_stop_reason reading the replies.
func lingering() caddySetup {
	return loadControlWith(map[string]any{"linger": "1m"})
}

// readingFleet is Caddy in front of one simulator, with load control on
// (residents linger a minute) and warden_stop_reason reading the replies;
// simArgs are more of the simulator's flags.
func readingFleet(t *testing.T, simArgs ...string) *fleet {
	t.Helper()
	sim := startSim(t, simArgs...)
	f, _ := runCaddy(t, lingering(), sim)
	return f
}

// reply sends a turn of conv through Caddy and reads its reply to the end.
func reply(t *testing.T, f *fleet, path, conv, body string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+f.site+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Claude-Code-Session-Id", conv)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s %v\n%s", conv, resp.Status, err, out)
	}
	return string(out)
}

// A reply that ends the agent's task (Anthropic's end_turn, OpenAI's
// finish_reason stop, a completed Responses reply without a call) frees its
// conversation's place in load control at once with warden_stop_reason in
// the site, streamed or not; a reply cut at max_tokens or calling a tool
// keeps it for linger.
func TestTaskEndFreesResidencyThroughCaddy(t *testing.T) {
	sim := startSim(t)
	anthropic := func(maxTokens int, stream bool) string {
		return fmt.Sprintf(`{"model":"m","max_tokens":%d,"stream":%t,"messages":[{"role":"user","content":"hello"}]}`, maxTokens, stream)
	}
	openai := `{"model":"m","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hello"}]}`
	const shell = `{"type":"function","name":"shell","parameters":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}`
	responses := func(choice string) string {
		return `{"model":"m","max_output_tokens":100,"stream":true,"input":"hello","tools":[` + shell + `],"tool_choice":"` + choice + `"}`
	}
	anthropicTool := `{"model":"m","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hello"}],` +
		`"tools":[{"name":"Bash","input_schema":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}],"tool_choice":{"type":"any"}}`
	residents := func(f *fleet) (int, uint64) {
		st := f.status(t)
		n := 0
		for _, r := range st.Replicas {
			n += r.Residents
		}
		return n, st.LoadControl.TaskEnded
	}

	f, _ := runCaddy(t, lingering(), sim)
	steps := []struct {
		conv, path, body, says string
		residents              int
		ended                  uint64
	}{
		{"a", "/v1/messages", anthropic(100, false), `"stop_reason":"end_turn"`, 0, 1},
		{"b", "/v1/messages", anthropic(100, true), `"stop_reason":"end_turn"`, 0, 2},
		{"c", "/v1/chat/completions", openai, `"finish_reason":"stop"`, 0, 3},
		{"d", "/v1/responses", responses("none"), `"status":"completed"`, 0, 4},
		{"e", "/v1/messages", anthropic(1, true), `"stop_reason":"max_tokens"`, 1, 4},
		{"f", "/v1/messages", anthropicTool, `"stop_reason":"tool_use"`, 2, 4},
		{"g", "/v1/responses", responses("required"), `"type":"function_call"`, 3, 4},
	}
	for _, s := range steps {
		if out := reply(t, f, s.path, s.conv, s.body); !strings.Contains(out, s.says) {
			t.Fatalf("%s: the simulator's reply does not say %s:\n%s", s.conv, s.says, out)
		}
		// The request's end reaches load control just after its
		// client read the reply.
		testrun.Eventually(t, 10*time.Second, fmt.Sprintf("%d resident and %d tasks ended after %s (%s)", s.residents, s.ended, s.conv, s.says), func() bool {
			n, ended := residents(f)
			return n == s.residents && ended == s.ended
		})
	}
}

// The prompt sizes and cached parts the simulator's replies report, in each
// API's words, reach load control through Caddy: it learns the bytes per
// token, and a conversation's second turn, resident, finds its prompt
// cached while the first turns found nothing.
func TestRepliesUsageThroughCaddy(t *testing.T) {
	f := readingFleet(t)
	// A distinct long message per API, so that only a conversation's own
	// first turn is cached at its second; every reply calls a tool, so that
	// no task ends and each conversation stays resident.
	text := func(api string) string { return strings.Repeat(api+" lorem ipsum dolor sit amet. ", 200) }
	const (
		params    = `{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}`
		anthropic = `"tools":[{"name":"Bash","input_schema":` + params + `}],"tool_choice":{"type":"any"}`
		openai    = `"tools":[{"type":"function","function":{"name":"bash","parameters":` + params + `}}],"tool_choice":"required"`
		responses = `"tools":[{"type":"function","name":"shell","parameters":` + params + `}],"tool_choice":"required"`
	)
	turns := []struct{ conv, path, body string }{
		{"anthropic", "/v1/messages", `{"model":"m","max_tokens":8,"stream":true,` + anthropic + `,"messages":[{"role":"user","content":"` + text("anthropic") + `"}]}`},
		{"openai", "/v1/chat/completions", `{"model":"m","max_tokens":8,"stream":true,"stream_options":{"include_usage":true},` + openai + `,"messages":[{"role":"user","content":"` + text("openai") + `"}]}`},
		{"responses", "/v1/responses", `{"model":"m","max_output_tokens":8,"stream":true,` + responses + `,"input":"` + text("responses") + `"}`},
	}
	for range 2 {
		for _, turn := range turns {
			reply(t, f, turn.path, turn.conv, turn.body)
		}
	}
	var got panel.ReplyUsageStatus
	testrun.Eventually(t, 10*time.Second, "6 replies read, at least the 3 second turns' with a cached part", func() bool {
		got = f.status(t).LoadControl.Replies
		return got.Read == 6 && got.CacheReported >= 3
	})
	t.Logf("read %d replies (%d with a cached part), %.3f bytes per token; resident %d tokens, %v%% cached; non-resident %d, %v%% cached",
		got.Read, got.CacheReported, got.BytesPerToken, got.Resident.PromptTokens, deref(got.Resident.CachedPercent), got.NonResident.PromptTokens, deref(got.NonResident.CachedPercent))
	// The bodies carry the template-less text at 4 bytes per simulator
	// token, plus some JSON; the chat template adds a few tokens.
	if got.BytesPerToken < 3.8 || got.BytesPerToken > 4.5 {
		t.Errorf("learned %.2f bytes per token, want about 4", got.BytesPerToken)
	}
	if p := got.Resident.CachedPercent; p == nil || *p < 90 {
		t.Errorf("resident turns found %v%% of their prompt cached, want over 90%%", deref(p))
	}
	if p := got.NonResident.CachedPercent; p == nil || *p > 10 {
		t.Errorf("first turns found %v%% of their prompt cached, want under 10%%", deref(p))
	}
	if got.Resident.PromptTokens < 3*1000 || got.NonResident.PromptTokens != got.Resident.PromptTokens {
		t.Errorf("prompt tokens: resident %d, non-resident %d; want equal and over 3,000", got.Resident.PromptTokens, got.NonResident.PromptTokens)
	}
}

// A client may stop reading at the reply's last event and hang up, as the
// load generator does, before the upstream has closed its stream: the
// request's end then comes before the handler returns, and what the reply
// said must still reach load control.
func TestReplyReadWhenItsClientLeavesAtItsLastEvent(t *testing.T) {
	backend := startFakeVLLM(t, "a", 1)
	f, _ := runCaddy(t, lingering(), backend.addr)
	req, err := http.NewRequest(http.MethodPost, "http://"+f.site+"/v1/messages", strings.NewReader(`{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	gate, open := newGate(t)
	req.Header.Set("X-Claude-Code-Session-Id", "a")
	req.Header.Set(lingerGateHeader, gate)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	events := bufio.NewScanner(resp.Body)
	for events.Scan() && !strings.Contains(events.Text(), `"message_stop"`) {
	}
	resp.Body.Close()
	// The upstream's stream stays open until the gate opens: the reply's
	// end_turn and usage are read before it ends.
	testrun.Eventually(t, 10*time.Second, "1 task ended and 1 reply read", func() bool {
		got := f.status(t).LoadControl
		return got.TaskEnded == 1 && got.Replies.Read == 1
	})
	open()
}

func deref(p *float64) any {
	if p == nil {
		return "null"
	}
	return *p
}

// An upstream that compresses what its client accepts (a server with
// compression on, or a proxy in front of vLLM) still has its replies read:
// warden_stop_reason no longer offers the client's encodings upstream, and
// the client still gets the reply it accepts.
func TestRepliesOfACompressingUpstreamAreRead(t *testing.T) {
	f, _ := runCaddy(t, lingering(), gzipping(t, startSim(t)))
	body := `{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("lorem ipsum ", 100) + `"}]}`
	for _, conv := range []string{"a", "b"} {
		if out := reply(t, f, "/v1/messages", conv, body); !strings.Contains(out, "message_stop") { // Go's client asks for gzip
			t.Fatalf("%s: the reply the client read has no message_stop:\n%.300s", conv, out)
		}
	}
	testrun.Eventually(t, 10*time.Second, "both replies read", func() bool { return f.status(t).LoadControl.Replies.Read == 2 })
}

// gzipping is a proxy in front of addr that answers every request that
// accepts gzip with its reply compressed whole; it runs until the test ends
// and returns its address.
func gzipping(t *testing.T, addr string) string {
	t.Helper()
	upstream := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(&url.URL{Scheme: "http", Host: addr}) }}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		compress := strings.Contains(r.Header.Get("Accept-Encoding"), "gzip")
		r.Header.Del("Accept-Encoding")
		reply := httptest.NewRecorder()
		upstream.ServeHTTP(reply, r)
		body := reply.Body.Bytes()
		if compress {
			var zipped bytes.Buffer
			gz := gzip.NewWriter(&zipped)
			_, _ = gz.Write(body)
			_ = gz.Close()
			body = zipped.Bytes()
			reply.Header().Set("Content-Encoding", "gzip")
		}
		maps.Copy(w.Header(), reply.Header())
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(reply.Code)
		_, _ = w.Write(body)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}
