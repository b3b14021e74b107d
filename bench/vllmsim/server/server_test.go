package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/dplb"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/tokenizer"
)

// startServer runs a server on a free loopback port for the test's duration.
func startServer(t *testing.T, configure func(*Config)) *Server {
	t.Helper()
	cfg := DefaultConfig()
	cfg.TimeScale = 10
	if configure != nil {
		configure(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func (s *Server) url(path string) string { return "http://" + s.Addr() + path }

// reply is what a test client saw of one response.
type reply struct {
	status     int
	engine     string
	text       string
	ttft       time.Duration // from sending the request to the first text
	prompt     int
	cached     int
	completion int
	stop       string
	tool       string   // the name of the tool called, streamed
	args       string   // the streamed tool call's arguments, joined
	events     []string // SSE event names, or data-only events as "data"
	body       string   // non-streamed body
	err        error    // a stream that broke off
}

// post sends body to path with headers and reads the reply, streamed or not.
func post(t *testing.T, s *Server, path string, body any, headers ...string) reply {
	t.Helper()
	payload, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, s.url(path), bytes.NewReader(payload))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	sent := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := reply{status: resp.StatusCode, engine: resp.Header.Get(EngineHeader)}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		out.body = string(b)
		return out
	}
	var text strings.Builder
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	for lines.Scan() {
		line := lines.Text()
		if name, ok := strings.CutPrefix(line, "event: "); ok {
			out.events = append(out.events, name)
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if strings.HasPrefix(path, "/v1/chat") {
			out.events = append(out.events, "data")
		}
		if data == "[DONE]" {
			continue
		}
		type toolCallDelta struct {
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		}
		var ev struct {
			Delta struct {
				Text        string `json:"text"`
				PartialJSON string `json:"partial_json"`
				StopReason  string `json:"stop_reason"`
			} `json:"delta"`
			ContentBlock struct {
				Name string `json:"name"`
			} `json:"content_block"`
			Message struct {
				Usage anthropicUsage `json:"usage"`
			} `json:"message"`
			Usage   json.RawMessage `json:"usage"`
			Choices []struct {
				Delta struct {
					Content   string          `json:"content"`
					ToolCalls []toolCallDelta `json:"tool_calls"`
				} `json:"delta"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("bad event %q: %v", data, err)
		}
		piece := ev.Delta.Text
		for _, c := range ev.Choices {
			piece += c.Delta.Content
			out.stop += c.FinishReason
			for _, call := range c.Delta.ToolCalls {
				out.tool += call.Function.Name
				out.args += call.Function.Arguments
			}
		}
		out.tool += ev.ContentBlock.Name
		out.args += ev.Delta.PartialJSON
		if piece != "" && text.Len() == 0 {
			out.ttft = time.Since(sent)
		}
		text.WriteString(piece)
		out.stop += ev.Delta.StopReason
		if ev.Usage != nil {
			out.readUsage(t, ev.Usage)
		}
	}
	out.err = lines.Err()
	out.text = text.String()
	return out
}

// readUsage reads OpenAI or Anthropic usage into prompt, cached and completion tokens.
func (r *reply) readUsage(t *testing.T, raw json.RawMessage) {
	var u struct {
		openAIUsage
		anthropicUsage
	}
	if err := json.Unmarshal(raw, &u); err != nil {
		t.Fatal(err)
	}
	if u.PromptTokens > 0 {
		r.prompt, r.completion = u.PromptTokens, u.CompletionTokens
		if u.PromptTokensDetails != nil {
			r.cached = u.PromptTokensDetails.CachedTokens
		}
		return
	}
	r.prompt, r.completion = u.InputTokens, u.OutputTokens
	if u.CacheReadInputTokens != nil {
		r.cached = *u.CacheReadInputTokens
		r.prompt += r.cached
	}
}

func anthropicBody(system string, maxTokens int, msgs ...tokenizer.Message) map[string]any {
	messages := make([]any, len(msgs))
	for i, m := range msgs {
		messages[i] = map[string]any{"role": m.Role, "content": []any{
			map[string]any{"type": "text", "text": m.Content, "cache_control": map[string]string{"type": "ephemeral"}},
		}}
	}
	return map[string]any{
		"model": DefaultModel, "max_tokens": maxTokens, "stream": true,
		"system":   []any{map[string]string{"type": "text", "text": system}},
		"messages": messages, "metadata": map[string]string{"user_id": `{"session_id":"s1"}`},
	}
}

func openAIBody(system string, maxTokens int, msgs ...tokenizer.Message) map[string]any {
	messages := []any{map[string]string{"role": "system", "content": system}}
	for _, m := range msgs {
		messages = append(messages, map[string]string{"role": m.Role, "content": m.Content})
	}
	return map[string]any{
		"model": DefaultModel, "max_tokens": maxTokens, "stream": true,
		"stream_options": map[string]bool{"include_usage": true}, "messages": messages,
	}
}

func user(text string) tokenizer.Message { return tokenizer.Message{Role: "user", Content: text} }

// words returns about n tokens of text.
func words(seed, n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n*tokenizer.CharsPerToken; i++ {
		fmt.Fprintf(&b, "w%d_%d ", seed, i)
	}
	return b.String()[:n*tokenizer.CharsPerToken]
}

// scrape returns the value of each series of /metrics, keyed like
// `vllm:prefix_cache_hits_total{engine="0"}` (model_name left out).
func scrape(t *testing.T, s *Server) map[string]float64 {
	t.Helper()
	resp, err := http.Get(s.url("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for name, mf := range families {
		for _, m := range mf.Metric {
			var labels []string
			for _, l := range m.Label {
				if l.GetName() != "model_name" {
					labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
			}
			key := name + "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.Counter != nil:
				out[key] = m.Counter.GetValue()
			case m.Gauge != nil:
				out[key] = m.Gauge.GetValue()
			case m.Histogram != nil:
				out[key] = float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return out
}

func TestRepeatedLongPromptIsServedFromCache(t *testing.T) {
	// At time scale 2 the cold prefill takes 0.8 s of wall time, so the fixed cost of parsing
	// and tokenizing 32 kB (tens of ms under the race detector) cannot hide the cache hit.
	s := startServer(t, func(c *Config) { c.TimeScale = 2 })
	body := anthropicBody("", 4, user(words(1, 7990)))
	first := post(t, s, "/v1/messages", body)
	between := scrape(t, s)
	second := post(t, s, "/v1/messages", body)
	after := scrape(t, s)

	if first.prompt < 8000 || first.cached != 0 {
		t.Fatalf("first request: %d prompt tokens, %d cached; want >= 8000 and 0", first.prompt, first.cached)
	}
	if second.ttft > first.ttft/5 {
		t.Errorf("time to first token: cold %v, cached %v; want at most a fifth", first.ttft, second.ttft)
	}
	hits := after[`vllm:prefix_cache_hits_total{engine="0"}`] - between[`vllm:prefix_cache_hits_total{engine="0"}`]
	if hits < 7900 || second.cached != int(hits) {
		t.Errorf("prefix_cache_hits_total grew by %v, cache_read_input_tokens %d; want both >= 7900", hits, second.cached)
	}
	if first.text != second.text || len(first.text) != 4*tokenizer.CharsPerToken {
		t.Errorf("same prompt, replies %q and %q; want the same 4 tokens", first.text, second.text)
	}
	t.Logf("TTFT cold %v, cached %v at time scale 2; hits +%v", first.ttft, second.ttft, hits)
}

func TestRankHeaderPinsTheEngine(t *testing.T) {
	s := startServer(t, func(c *Config) { c.DataParallelSize = 3; c.ID = "sim-a" })
	before := scrape(t, s)
	r := post(t, s, "/v1/chat/completions", openAIBody("sys", 3, user("pinned")), RankHeader, "2")
	after := scrape(t, s)
	if r.status != http.StatusOK || r.engine != "sim-a/2" {
		t.Fatalf("status %d, engine header %q; want 200 from sim-a/2", r.status, r.engine)
	}
	for rank, want := range []float64{0, 0, float64(r.prompt)} {
		key := fmt.Sprintf(`vllm:prompt_tokens_total{engine="%d"}`, rank)
		if got := after[key] - before[key]; got != want {
			t.Errorf("engine %d: prompt_tokens_total grew by %v, want %v", rank, got, want)
		}
	}

	bad := post(t, s, "/v1/chat/completions", openAIBody("sys", 3, user("x")), RankHeader, "3")
	if bad.status != http.StatusBadRequest || !strings.Contains(bad.body, "out of range [0, 3)") {
		t.Errorf("rank 3 of 3: status %d body %s; want 400 out of range", bad.status, bad.body)
	}
	if ignored := post(t, s, "/v1/chat/completions", openAIBody("sys", 3, user("y")), RankHeader, "two"); ignored.status != http.StatusOK {
		t.Errorf("a non-integer rank must be ignored, got status %d", ignored.status)
	}
}

func TestDenseBalancerRotatesOverEngines(t *testing.T) {
	s := startServer(t, func(c *Config) { c.DataParallelSize = 3; c.ID = "x" })
	var got []string
	for i := range 4 {
		got = append(got, post(t, s, "/v1/messages", anthropicBody("sys", 2, user(words(i, 10)))).engine)
	}
	if want := []string{"x/0", "x/1", "x/2", "x/0"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("engines %v, want %v", got, want)
	}
}

func TestMultiTurnHistoryHitsTheGeneratedReply(t *testing.T) {
	for _, api := range []struct {
		path string
		body func(string, int, ...tokenizer.Message) map[string]any
	}{{"/v1/messages", anthropicBody}, {"/v1/chat/completions", openAIBody}} {
		s := startServer(t, nil)
		system := words(7, 300)
		history := []tokenizer.Message{user(words(8, 100))}
		first := post(t, s, api.path, api.body(system, 50, history...))
		history = append(history, tokenizer.Message{Role: "assistant", Content: first.text}, user("and then?"))
		second := post(t, s, api.path, api.body(system, 5, history...))
		// Everything the first turn computed is cached: its prompt and its reply but the last
		// token, in whole blocks.
		if want := (first.prompt + first.completion - 1) / 16 * 16; second.cached != want {
			t.Errorf("%s: second turn cached %d tokens, want %d (prompt %d + reply %d)", api.path, second.cached, want, first.prompt, first.completion)
		}
	}
}

func TestBothAPIsRenderTheSamePrompt(t *testing.T) {
	s := startServer(t, nil)
	msgs := []tokenizer.Message{user(words(3, 200))}
	viaAnthropic := post(t, s, "/v1/messages", anthropicBody("be brief", 2, msgs...))
	viaOpenAI := post(t, s, "/v1/chat/completions", openAIBody("be brief", 2, msgs...))
	if viaAnthropic.prompt != viaOpenAI.prompt || viaOpenAI.cached != (viaOpenAI.prompt-1)/16*16 {
		t.Fatalf("prompts %d and %d tokens, second cached %d: the two formats render differently",
			viaAnthropic.prompt, viaOpenAI.prompt, viaOpenAI.cached)
	}
	if viaAnthropic.text != viaOpenAI.text {
		t.Fatal("the same prompt got different replies")
	}
}

func TestStreamsFollowEachAPIsEventSequence(t *testing.T) {
	s := startServer(t, nil)
	a := post(t, s, "/v1/messages", anthropicBody("s", 3, user("hi")))
	want := "message_start content_block_start ping content_block_delta content_block_delta content_block_delta content_block_stop message_delta message_stop"
	if got := strings.Join(a.events, " "); got != want || a.stop != "max_tokens" || a.completion != 3 {
		t.Fatalf("anthropic events %q stop %q output %d", got, a.stop, a.completion)
	}
	o := post(t, s, "/v1/chat/completions", openAIBody("s", 3, user("hi")))
	// role chunk, 3 content chunks (the last with finish_reason), usage chunk, [DONE]
	if len(o.events) != 6 || o.stop != "length" || o.completion != 3 {
		t.Fatalf("openai: %d events, stop %q, completion %d", len(o.events), o.stop, o.completion)
	}
	noUsage := openAIBody("s", 3, user("hi"))
	delete(noUsage, "stream_options")
	if o := post(t, s, "/v1/chat/completions", noUsage); len(o.events) != 5 || o.prompt != 0 {
		t.Fatalf("without include_usage: %d events, usage prompt %d; want 5 events and no usage", len(o.events), o.prompt)
	}
}

func TestNonStreamingReplies(t *testing.T) {
	s := startServer(t, func(c *Config) { c.OutputLen, _ = ParseOutputLen("uniform:2:4") })
	body := anthropicBody("s", 10, user("hi"))
	body["stream"] = false
	var msg struct {
		Content    []struct{ Text string } `json:"content"`
		StopReason string                  `json:"stop_reason"`
		Usage      anthropicUsage          `json:"usage"`
	}
	r := post(t, s, "/v1/messages", body)
	if err := json.Unmarshal([]byte(r.body), &msg); err != nil {
		t.Fatal(err)
	}
	n := msg.Usage.OutputTokens
	// A reply that stops by itself ends with <|im_end|>, which has no text.
	if n < 2 || n > 4 || msg.StopReason != "end_turn" || len(msg.Content[0].Text) != (n-1)*tokenizer.CharsPerToken {
		t.Fatalf("uniform:2:4 of max 10: %d tokens, stop %q, text %q", n, msg.StopReason, msg.Content[0].Text)
	}
	chat := openAIBody("s", 10, user("hi"))
	chat["stream"] = false
	var completion struct {
		Choices []struct {
			Message      struct{ Content string } `json:"message"`
			FinishReason string                   `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(post(t, s, "/v1/chat/completions", chat).body), &completion); err != nil {
		t.Fatal(err)
	}
	if c := completion.Choices[0]; c.FinishReason != "stop" || c.Message.Content != msg.Content[0].Text {
		t.Fatalf("chat completion %+v; want the same reply as /v1/messages, finish stop", c)
	}
}

func TestSeedChangesTheReply(t *testing.T) {
	texts := map[uint64]string{}
	for _, seed := range []uint64{1, 2} {
		s := startServer(t, func(c *Config) { c.Seed = seed })
		texts[seed] = post(t, s, "/v1/messages", anthropicBody("s", 8, user("hi"))).text
	}
	if texts[1] == texts[2] {
		t.Fatal("different seeds gave the same reply")
	}
}

func TestRequestErrorsLookLikeVLLMs(t *testing.T) {
	s := startServer(t, nil)
	for name, tc := range map[string]struct {
		path   string
		body   map[string]any
		status int
		want   string
	}{
		"unknown model": {"/v1/chat/completions", map[string]any{"model": "gpt-9", "messages": []any{map[string]string{"role": "user", "content": "x"}}}, 404, "does not exist"},
		"no max_tokens": {"/v1/messages", map[string]any{"messages": []any{map[string]string{"role": "user", "content": "x"}}}, 400, "max_tokens"},
		"too long":      {"/v1/messages", anthropicBody("", 30000, user(words(1, 5000))), 400, "maximum context length"},
		"bad content":   {"/v1/messages", map[string]any{"max_tokens": 1, "messages": []any{map[string]any{"role": "user", "content": 7}}}, 400, "content"},
	} {
		r := post(t, s, tc.path, tc.body)
		if r.status != tc.status || !strings.Contains(r.body, tc.want) {
			t.Errorf("%s: status %d body %s; want %d containing %q", name, r.status, r.body, tc.status, tc.want)
		}
	}
}

// With --served-model-name, as vLLM, the server answers only the names it
// serves, the model's own path included no longer: any other is a 404 in
// each API's error format, which OnRefuse hears.
func TestServesOnlyItsServedNames(t *testing.T) {
	var refused []Refused
	var mu sync.Mutex
	s := startServer(t, func(c *Config) {
		c.ServedModelNames = []string{"qwen3-coder", "coder"}
		c.OnRefuse = func(r Refused) { mu.Lock(); refused = append(refused, r); mu.Unlock() }
	})
	chat := func(model string) map[string]any {
		return map[string]any{"model": model, "max_tokens": 4, "messages": []tokenizer.Message{user("hi")}}
	}
	responses := func(model string) map[string]any {
		return map[string]any{"model": model, "max_output_tokens": 4, "input": "hi"}
	}
	for _, c := range []struct {
		path  string
		body  map[string]any
		error string // the error's JSON, "" for 200
	}{
		{"/v1/messages", chat("qwen3-coder"), ""},
		{"/v1/chat/completions", chat("coder"), ""},
		{"/v1/responses", responses("coder"), ""},
		{"/v1/messages", chat("claude-sonnet-5"), `{"error":{"message":"The model ` + "`claude-sonnet-5`" + ` does not exist.","type":"not_found_error"},"type":"error"}`},
		{"/v1/chat/completions", chat(DefaultModel), `{"error":{"code":404,"message":"The model ` + "`" + DefaultModel + "`" + ` does not exist.","param":null,"type":"NotFoundError"}}`},
		{"/v1/responses", responses("gpt-5"), `{"error":{"code":404,"message":"The model ` + "`gpt-5`" + ` does not exist.","param":null,"type":"NotFoundError"}}`},
	} {
		r := post(t, s, c.path, c.body)
		switch {
		case c.error == "" && r.status != http.StatusOK:
			t.Errorf("%s %v: %d %s, want 200", c.path, c.body["model"], r.status, r.body)
		case c.error != "" && (r.status != http.StatusNotFound || strings.TrimSpace(r.body) != c.error):
			t.Errorf("%s %v: %d %s, want 404 %s", c.path, c.body["model"], r.status, r.body, c.error)
		}
	}
	var models struct {
		Data []struct{ ID, Root string }
	}
	_, list := get(t, "http://"+s.Addr()+"/v1/models")
	if err := json.Unmarshal([]byte(list), &models); err != nil || len(models.Data) != 2 || models.Data[0].ID != "qwen3-coder" || models.Data[1].ID != "coder" || models.Data[0].Root != DefaultModel {
		t.Errorf("/v1/models lists %+v (%v), want qwen3-coder and coder, rooted at %s", models.Data, err, DefaultModel)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(refused) != 3 || refused[0].Status != http.StatusNotFound || refused[0].Path != "/v1/messages" || !strings.Contains(refused[0].Message, "claude-sonnet-5") {
		t.Errorf("OnRefuse heard %+v, want the three 404s", refused)
	}
}

// count_tokens answers the size of the prompt a messages request of the same body would
// have, without an engine; without --count-tokens the path is FastAPI's 404, as on a vLLM
// from before it.
func TestCountTokens(t *testing.T) {
	var counted []Served
	var refused []Refused
	var mu sync.Mutex
	s := startServer(t, func(c *Config) {
		c.ServedModelNames = []string{"qwen3-4b", "claude-haiku-4-5"}
		c.OnCount = func(r Served) { mu.Lock(); counted = append(counted, r); mu.Unlock() }
		c.OnRefuse = func(r Refused) { mu.Lock(); refused = append(refused, r); mu.Unlock() }
	})
	msg := anthropicBody("You are a coding agent.", 16, user(words(1, 300)), tokenizer.Message{Role: "assistant", Content: "ok"}, user("and then?"))
	msg["model"] = "claude-haiku-4-5"
	raw, _ := json.Marshal(msg)
	prompt, err := PromptTokens("/v1/messages", raw)
	if err != nil {
		t.Fatal(err)
	}
	delete(msg, "max_tokens") // count_tokens takes none
	r := post(t, s, "/v1/messages/count_tokens?beta=true", msg)
	var count struct {
		InputTokens       int `json:"input_tokens"`
		ContextManagement struct {
			OriginalInputTokens int `json:"original_input_tokens"`
		} `json:"context_management"`
	}
	if err := json.Unmarshal([]byte(r.body), &count); err != nil || r.status != http.StatusOK ||
		count.InputTokens != len(prompt) || count.ContextManagement.OriginalInputTokens != len(prompt) {
		t.Errorf("count_tokens: %d %s (%v), want %d input tokens", r.status, r.body, err, len(prompt))
	}
	if got := r.engine; got != s.ID()+"/api" {
		t.Errorf("%s: %q, want the server's API", EngineHeader, got)
	}
	msg["model"] = "qwen3-coder"
	if r := post(t, s, "/v1/messages/count_tokens", msg); r.status != http.StatusNotFound || !strings.Contains(r.body, "not_found_error") {
		t.Errorf("count_tokens of a model not served: %d %s, want Anthropic's 404", r.status, r.body)
	}
	if r := post(t, s, "/v1/messages/count_tokens", map[string]any{"model": "qwen3-4b"}); r.status != http.StatusBadRequest {
		t.Errorf("count_tokens without messages: %d %s, want 400", r.status, r.body)
	}
	mu.Lock()
	if len(counted) != 1 || counted[0].Path != "/v1/messages/count_tokens" || len(refused) != 2 {
		t.Errorf("OnCount heard %d, OnRefuse %d; want the one count and the two refusals", len(counted), len(refused))
	}
	mu.Unlock()
	if got, ok := scrape(t, s)[`vllm:prompt_tokens_total{engine="0"}`]; !ok || got != 0 {
		t.Errorf("count_tokens ran an engine: %v prompt tokens (%v)", got, ok)
	}

	old := startServer(t, func(c *Config) { c.CountTokens = false })
	msg["model"] = DefaultModel
	if r := post(t, old, "/v1/messages/count_tokens", msg); r.status != http.StatusNotFound || strings.TrimSpace(r.body) != `{"detail":"Not Found"}` {
		t.Errorf("without count_tokens: %d %s, want FastAPI's 404", r.status, r.body)
	}
}

func TestMetricsExposeEveryVLLMSeries(t *testing.T) {
	s := startServer(t, func(c *Config) { c.DataParallelSize = 2 })
	post(t, s, "/v1/messages", anthropicBody("s", 2, user("hi")))
	m := scrape(t, s)
	for _, name := range []string{
		"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
		"vllm:prompt_tokens_cached_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
		"vllm:time_to_first_token_seconds", "vllm:external_prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total",
	} {
		for rank := range 2 {
			if _, ok := m[fmt.Sprintf(`%s{engine="%d"}`, name, rank)]; !ok {
				t.Errorf("missing %s for engine %d", name, rank)
			}
		}
	}
	if m[`vllm:request_success_total{engine="0",finished_reason="length"}`] != 1 || m[`vllm:generation_tokens_total{engine="0"}`] != 2 {
		t.Error("the finished request is not counted")
	}
	info := `vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",kv_cache_size_tokens="40000",kv_offloading_backend="native",kv_offloading_size="None",num_cpu_blocks="0",num_gpu_blocks="2500",prefix_caching_hash_algo="sha256"}`
	if m[info] != 1 {
		t.Errorf("missing %s", info)
	}
	// Without a host tier: every prompt token computed, no connector transfers.
	prompt := m[`vllm:prompt_tokens_total{engine="0"}`]
	if m[`vllm:prompt_tokens_by_source_total{engine="0",source="local_compute"}`] != prompt || prompt == 0 ||
		m[`vllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer"}`] != 0 {
		t.Errorf("prompt tokens by source do not add up to the %v prompt tokens", prompt)
	}
	for key := range m {
		if strings.HasPrefix(key, "vllm:kv_offload") {
			t.Errorf("%s without a host tier", key)
		}
	}
}

func TestClientThatLeavesAbortsItsRequest(t *testing.T) {
	s := startServer(t, nil)
	resp, err := http.Post(s.url("/v1/messages"), "application/json", strings.NewReader(`{"max_tokens":5000,"stream":true,"messages":[{"role":"user","content":"long"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	bufio.NewReader(resp.Body).ReadString('\n') // the stream has started
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m := scrape(t, s)
		if m[`vllm:request_success_total{engine="0",finished_reason="abort"}`] == 1 && m[`vllm:kv_cache_usage_perc{engine="0"}`] == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("request not aborted: %v", m)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStepsTakeScaledWallTime(t *testing.T) {
	s := startServer(t, nil)
	const outputTokens = 200
	body := anthropicBody("", outputTokens, user(words(5, 1000)))
	body["stream"] = false
	start := time.Now()
	post(t, s, "/v1/messages", body)
	elapsed := time.Since(start)
	p := s.cfg.Profile
	prompt := len(tokenizer.ChatTokens("", []tokenizer.Message{user(words(5, 1000))}))
	simulated := p.StepTime(prompt, 0)
	for i := range outputTokens - 1 {
		simulated += p.StepTime(0, prompt+i)
	}
	want := simulated / 10
	// Lateness must not accumulate over the steps: what remains is HTTP and scheduling.
	if elapsed < want || elapsed > want+50*time.Millisecond {
		t.Fatalf("a reply of %v simulated took %v of wall time at scale 10, want about %v", simulated, elapsed, want)
	}
	t.Logf("%v simulated took %v of wall time at scale 10 (ideal %v)", simulated, elapsed, want)
}

func TestV026BalancerSeesPublishedLoad(t *testing.T) {
	for _, tc := range []struct {
		lb   dplb.Mode
		want string
	}{{dplb.V026Dense, "x/0"}, {dplb.V026, "x/1"}} {
		s := startServer(t, func(c *Config) { c.DataParallelSize = 2; c.LB = tc.lb; c.ID = "x" })
		ctx, cancel := context.WithCancel(context.Background())
		busy, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url("/v1/messages"), strings.NewReader(`{"max_tokens":3000,"messages":[{"role":"user","content":"x"}]}`))
		busy.Header.Set(RankHeader, "0")
		go http.DefaultClient.Do(busy)
		time.Sleep(50 * time.Millisecond) // 500 ms simulated: several publications
		if got := post(t, s, "/v1/messages", anthropicBody("s", 1, user("hi"))).engine; got != tc.want {
			t.Errorf("%s: an unpinned request beside a busy engine 0 went to %s, want %s", tc.lb, got, tc.want)
		}
		cancel()
	}
}

// A server running simulated time faster reports its times in wall seconds,
// as its clients see them: warden learns a prefill rate from them, and one
// taken from simulated seconds would be the time scale off.
func TestReportedTimesAreWallSeconds(t *testing.T) {
	const scale = 4
	s := startServer(t, func(c *Config) { c.TimeScale = scale })
	post(t, s, "/v1/messages", anthropicBody("", 4, user(words(1, 2000))))
	simulated := s.engines[0].stats().TTFT.Sum
	resp, err := http.Get(s.url("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	h := families["vllm:time_to_first_token_seconds"].GetMetric()[0].GetHistogram()
	if simulated <= 0 || math.Abs(h.GetSampleSum()-simulated/scale) > 1e-9 {
		t.Errorf("TTFT sum %v, want the simulated %v over the time scale %d", h.GetSampleSum(), simulated, scale)
	}
	b := h.GetBucket()
	if first := b[0].GetUpperBound(); first != engine.TTFTBuckets[0]/scale {
		t.Errorf("first TTFT bucket ≤ %v, want %v / %d", first, engine.TTFTBuckets[0], scale)
	}
}
