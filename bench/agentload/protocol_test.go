package agentload

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

// sse formats events as a server writes them.
func sse(events ...[2]string) string {
	var b strings.Builder
	for _, ev := range events {
		if ev[0] != "" {
			b.WriteString("event: " + ev[0] + "\n")
		}
		b.WriteString("data: " + ev[1] + "\n\n")
	}
	return b.String()
}

var anthropicHead = [][2]string{
	{"message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":100,"output_tokens":1,"cache_read_input_tokens":900,"cache_creation_input_tokens":0}}}`},
	{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`},
	{"ping", `{"type":"ping"}`},
	{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`},
	{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" world"}}`},
}

var anthropicTail = [][2]string{
	{"content_block_stop", `{"type":"content_block_stop","index":0}`},
	{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":7}}`},
	{"message_stop", `{"type":"message_stop"}`},
}

func TestReadAnthropicStream(t *testing.T) {
	out, err := readStream(APIAnthropic, strings.NewReader(sse(append(anthropicHead, anthropicTail...)...)))
	if err != nil {
		t.Fatal(err)
	}
	if out.text != "Hello world" || out.firstToken.IsZero() {
		t.Errorf("text %q, first token %v", out.text, out.firstToken)
	}
	if out.outputTokens != 7 || out.promptTokens != 1000 || out.cachedTokens != 900 || !out.cacheReported {
		t.Errorf("usage: output %d prompt %d cached %d reported %v", out.outputTokens, out.promptTokens, out.cachedTokens, out.cacheReported)
	}
}

func TestReadAnthropicStreamTruncated(t *testing.T) {
	out, err := readStream(APIAnthropic, strings.NewReader(sse(anthropicHead...)))
	if !errors.Is(err, errStreamTruncated) {
		t.Fatalf("error %v, want truncation", err)
	}
	// message_start's output_tokens is a placeholder: the deltas are the count.
	if out.outputTokens != 2 || out.text != "Hello world" {
		t.Errorf("output %d text %q", out.outputTokens, out.text)
	}
}

func TestReadAnthropicStreamError(t *testing.T) {
	stream := sse(anthropicHead[0], [2]string{"error", `{"type":"error","error":{"type":"overloaded_error","message":"busy"}}`})
	_, err := readStream(APIAnthropic, strings.NewReader(stream))
	if err == nil || !strings.Contains(err.Error(), "overloaded_error") || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("error %v", err)
	}
}

func openAIStream(usage string) string {
	events := [][2]string{
		{"", `{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`},
		{"", `{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}`},
		{"", `{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" there"},"finish_reason":"length"}]}`},
	}
	if usage != "" {
		events = append(events, [2]string{"", `{"id":"c1","object":"chat.completion.chunk","choices":[],"usage":` + usage + `}`})
	}
	return sse(append(events, [2]string{"", "[DONE]"})...)
}

func TestReadOpenAIStream(t *testing.T) {
	for _, c := range []struct {
		name                   string
		usage                  string
		output, prompt, cached int
		reported               bool
	}{
		{"cached", `{"prompt_tokens":500,"completion_tokens":6,"total_tokens":506,"prompt_tokens_details":{"cached_tokens":320}}`, 6, 500, 320, true},
		{"nothing cached", `{"prompt_tokens":500,"completion_tokens":6,"total_tokens":506}`, 6, 500, 0, false},
		{"no usage", "", 2, 0, 0, false},
	} {
		out, err := readStream(APIOpenAI, strings.NewReader(openAIStream(c.usage)))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if out.text != "Hi there" || out.firstToken.IsZero() {
			t.Errorf("%s: text %q", c.name, out.text)
		}
		if out.outputTokens != c.output || out.promptTokens != c.prompt || out.cachedTokens != c.cached || out.cacheReported != c.reported {
			t.Errorf("%s: got output %d prompt %d cached %d reported %v", c.name, out.outputTokens, out.promptTokens, out.cachedTokens, out.cacheReported)
		}
	}
}

func TestReadOpenAIStreamFailures(t *testing.T) {
	whole := openAIStream(`{"prompt_tokens":5,"completion_tokens":2}`)
	truncated := whole[:strings.Index(whole, "data: [DONE]")]
	if _, err := readStream(APIOpenAI, strings.NewReader(truncated)); !errors.Is(err, errStreamTruncated) {
		t.Errorf("truncated stream: %v", err)
	}
	withError := sse([2]string{"", `{"error":{"message":"out of KV cache","type":"InternalServerError","code":500}}`})
	if _, err := readStream(APIOpenAI, strings.NewReader(withError)); err == nil || !strings.Contains(err.Error(), "out of KV cache") {
		t.Errorf("error chunk: %v", err)
	}
	if _, err := readStream(APIOpenAI, strings.NewReader(sse([2]string{"", "{not json"}))); err == nil {
		t.Error("bad JSON accepted")
	}
}

func TestAnthropicRequest(t *testing.T) {
	cfg := DefaultConfig()
	s := mustGenerator(t, cfg).NewSession()
	turn, _ := s.Next()
	s.Reply("first answer")
	turn, _ = s.Next()
	req, err := newRequest(context.Background(), "http://127.0.0.1:9/", cfg, s, turn)
	if err != nil {
		t.Fatal(err)
	}
	if req.Method != "POST" || req.URL.String() != "http://127.0.0.1:9/v1/messages?beta=true" {
		t.Errorf("%s %s", req.Method, req.URL)
	}
	for header, want := range map[string]string{
		"anthropic-version":        "2023-06-01",
		"Content-Type":             "application/json",
		"X-Claude-Code-Session-Id": s.ID,
	} {
		if got := req.Header.Get(header); got != want {
			t.Errorf("header %s = %q, want %q", header, got, want)
		}
	}
	var body struct {
		Model     string `json:"model"`
		MaxTokens int    `json:"max_tokens"`
		Stream    bool   `json:"stream"`
		System    []struct {
			Type, Text string
		} `json:"system"`
		Messages []struct {
			Role    string `json:"role"`
			Content []struct {
				Type, Text string
			} `json:"content"`
		} `json:"messages"`
		Metadata struct {
			UserID string `json:"user_id"`
		} `json:"metadata"`
	}
	decodeBody(t, req.Body, &body)
	if body.Model != cfg.Model || body.MaxTokens != turn.MaxTokens || !body.Stream || body.Metadata.UserID != s.UserID {
		t.Errorf("body fields: %+v", body.Metadata)
	}
	if len(body.System) != 1 || body.System[0].Type != "text" || body.System[0].Text != turn.System {
		t.Error("system prompt not sent as one text block")
	}
	if len(body.Messages) != len(turn.Messages) {
		t.Fatalf("%d messages, want %d", len(body.Messages), len(turn.Messages))
	}
	for i, m := range body.Messages {
		if m.Role != turn.Messages[i].Role || len(m.Content) != 1 || m.Content[0].Text != turn.Messages[i].Content {
			t.Errorf("message %d differs from the turn", i)
		}
	}
}

func TestOpenAIRequest(t *testing.T) {
	cfg := DefaultConfig()
	cfg.API, cfg.SessionHeader = APIOpenAI, "X-Session-Id"
	s := mustGenerator(t, cfg).NewSession()
	turn, _ := s.Next()
	req, err := newRequest(context.Background(), "http://127.0.0.1:9", cfg, s, turn)
	if err != nil {
		t.Fatal(err)
	}
	if req.URL.Path != "/v1/chat/completions" || req.Header.Get("X-Session-Id") != s.ID || req.Header.Get("anthropic-version") != "" {
		t.Errorf("%s with headers %v", req.URL, req.Header)
	}
	var body struct {
		Model         string          `json:"model"`
		MaxTokens     int             `json:"max_tokens"`
		Stream        bool            `json:"stream"`
		Messages      []openAIMessage `json:"messages"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	decodeBody(t, req.Body, &body)
	want := []openAIMessage{{Role: "system", Content: turn.System}, {Role: "user", Content: turn.Messages[0].Content}}
	if len(body.Messages) != 2 || body.Messages[0] != want[0] || body.Messages[1] != want[1] {
		t.Error("messages are not the system prompt then the first message")
	}
	if !body.Stream || !body.StreamOptions.IncludeUsage || body.MaxTokens != turn.MaxTokens || body.Model != cfg.Model {
		t.Errorf("body: stream %v usage %v max %d model %q", body.Stream, body.StreamOptions.IncludeUsage, body.MaxTokens, body.Model)
	}
}

func TestNoSessionHeader(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SessionHeader = ""
	s := mustGenerator(t, cfg).NewSession()
	turn, _ := s.Next()
	req, err := newRequest(context.Background(), "http://127.0.0.1:9", cfg, s, turn)
	if err != nil {
		t.Fatal(err)
	}
	if got := req.Header.Get(DefaultSessionHeader); got != "" {
		t.Errorf("session header sent: %q", got)
	}
}

func decodeBody(t *testing.T, body io.Reader, into any) {
	t.Helper()
	if err := json.NewDecoder(body).Decode(into); err != nil {
		t.Fatal(err)
	}
}

// A streamed tool call's arguments count as tokens, and its command is the
// reply the session keeps; the stop reason is read in both protocols.
func TestReadToolCallStreams(t *testing.T) {
	anthropic := sse(anthropicHead[0],
		[2]string{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"Bash","input":{}}}`},
		[2]string{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"command\":\"ls "}}`},
		[2]string{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"-l\"}"}}`},
		anthropicTail[0],
		[2]string{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":2}}`},
		anthropicTail[2])
	openAI := sse(
		[2]string{"", `{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`},
		[2]string{"", `{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"c1","type":"function","index":0,"function":{"name":"Bash","arguments":""}}]},"finish_reason":null}]}`},
		[2]string{"", `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"command\":\"ls "}}]},"finish_reason":null}]}`},
		[2]string{"", `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"-l\"}"}}]},"finish_reason":"tool_calls"}]}`},
		[2]string{"", "[DONE]"})
	for api, c := range map[API]struct{ stream, stop string }{APIAnthropic: {anthropic, "tool_use"}, APIOpenAI: {openAI, "tool_calls"}} {
		out, err := readStream(api, strings.NewReader(c.stream))
		if err != nil {
			t.Fatalf("%s: %v", api, err)
		}
		if out.text != "ls -l" || out.stop != c.stop || out.outputTokens != 2 || out.firstToken.IsZero() {
			t.Errorf("%s: text %q stop %q output %d", api, out.text, out.stop, out.outputTokens)
		}
	}
	text, _ := readStream(APIAnthropic, strings.NewReader(sse(append(anthropicHead, anthropicTail...)...)))
	if text.stop != "end_turn" {
		t.Errorf("text reply: stop %q, want end_turn", text.stop)
	}
}
