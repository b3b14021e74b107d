package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/tokenizer"
)

// responsesReplyOf is what a test client saw of one /v1/responses reply.
type responsesReplyOf struct {
	status   int
	engine   string
	events   []string // event: names, in order
	text     string   // the deltas joined
	done     string   // response.output_text.done's text
	final    responsesObject
	body     string // non-streamed or error body
	sequence []int  // sequence_number of each event
}

type responsesObject struct {
	ID                string `json:"id"`
	Object            string `json:"object"`
	Status            string `json:"status"`
	Model             string `json:"model"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Output []struct {
		ID        string `json:"id"`
		Type      string `json:"type"`
		Role      string `json:"role"`
		Status    string `json:"status"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
		Content   []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage *responsesUsage `json:"usage"`
}

func (o responsesObject) text() string {
	var b strings.Builder
	for _, item := range o.Output {
		for _, c := range item.Content {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

func postResponses(t *testing.T, s *Server, body map[string]any, headers ...string) responsesReplyOf {
	t.Helper()
	payload, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, s.url("/v1/responses"), bytes.NewReader(payload))
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := responsesReplyOf{status: resp.StatusCode, engine: resp.Header.Get(EngineHeader)}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		out.body = b.String()
		if resp.StatusCode == http.StatusOK {
			if err := json.Unmarshal(b.Bytes(), &out.final); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	var text strings.Builder
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	name := ""
	for lines.Scan() {
		line := lines.Text()
		if n, ok := strings.CutPrefix(line, "event: "); ok {
			name = n
			out.events = append(out.events, n)
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type           string          `json:"type"`
			SequenceNumber int             `json:"sequence_number"`
			Delta          string          `json:"delta"`
			Text           string          `json:"text"`
			Response       responsesObject `json:"response"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("bad event %q: %v", data, err)
		}
		if ev.Type != name {
			t.Fatalf("event %q carries type %q", name, ev.Type)
		}
		out.sequence = append(out.sequence, ev.SequenceNumber)
		switch ev.Type {
		case "response.output_text.delta", "response.function_call_arguments.delta":
			text.WriteString(ev.Delta)
		case "response.output_text.done":
			out.done = ev.Text
		case "response.completed":
			out.final = ev.Response
		}
	}
	if err := lines.Err(); err != nil {
		t.Fatal(err)
	}
	out.text = text.String()
	return out
}

// responsesBody is a Codex-like request: instructions, a developer message, then the turns
// as message items with input_text / output_text parts.
func responsesBody(instructions string, msgs ...tokenizer.Message) map[string]any {
	input := []any{map[string]any{"type": "message", "role": "developer", "content": []any{
		map[string]string{"type": "input_text", "text": "<permissions>sandboxed</permissions>"},
	}}}
	for _, m := range msgs {
		part := "input_text"
		if m.Role == "assistant" {
			part = "output_text"
		}
		input = append(input, map[string]any{"type": "message", "role": m.Role, "content": []any{
			map[string]string{"type": part, "text": m.Content},
		}})
	}
	return map[string]any{
		"model": DefaultModel, "instructions": instructions, "input": input, "stream": true,
		"store": false, "tools": []any{}, "tool_choice": "auto", "parallel_tool_calls": false,
		"reasoning": nil, "include": []any{}, "prompt_cache_key": "thread-1",
	}
}

func TestResponsesStreamFollowsVLLMsEventSequence(t *testing.T) {
	s := startServer(t, func(c *Config) { c.ID = "sim" })
	body := responsesBody("be brief", user("hi"))
	body["max_output_tokens"] = 3
	r := postResponses(t, s, body)
	if r.status != http.StatusOK || r.engine != "sim/0" {
		t.Fatalf("status %d engine %q", r.status, r.engine)
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added " +
		"response.output_text.delta response.output_text.delta response.output_text.delta " +
		"response.output_text.done response.content_part.done response.output_item.done response.completed"
	if got := strings.Join(r.events, " "); got != want {
		t.Fatalf("events\n%s\nwant\n%s", got, want)
	}
	for i, n := range r.sequence {
		if n != i {
			t.Fatalf("sequence numbers %v; want 0, 1, 2...", r.sequence)
		}
	}
	f := r.final
	if f.Object != "response" || !strings.HasPrefix(f.ID, "resp_") || f.Model != DefaultModel {
		t.Errorf("response object %+v", f)
	}
	if f.Status != "incomplete" || f.IncompleteDetails == nil || f.IncompleteDetails.Reason != "max_output_tokens" {
		t.Errorf("cut by max_output_tokens: status %q details %+v; want incomplete, max_output_tokens", f.Status, f.IncompleteDetails)
	}
	if r.text == "" || r.text != r.done || r.text != f.text() || len(f.Output) != 1 || f.Output[0].Role != "assistant" || f.Output[0].Status != "completed" {
		t.Errorf("deltas %q, done %q, final output %+v; want one completed assistant message with the same text", r.text, r.done, f.Output)
	}
	u := f.Usage
	if u == nil || u.OutputTokens != 3 || u.TotalTokens != u.InputTokens+3 {
		t.Fatalf("usage %+v", u)
	}
	tokens, err := PromptTokens("/v1/responses", mustJSON(t, body))
	if err != nil || len(tokens) != u.InputTokens {
		t.Errorf("usage input_tokens %d, PromptTokens %d (%v)", u.InputTokens, len(tokens), err)
	}
}

func TestResponsesRenderLikeChatCompletions(t *testing.T) {
	s := startServer(t, nil)
	sys, msgs := words(5, 100), []tokenizer.Message{user(words(6, 200))}
	viaChat := post(t, s, "/v1/chat/completions", openAIBody(sys, 2, msgs...))
	body := map[string]any{"model": DefaultModel, "instructions": sys, "input": msgs[0].Content, "max_output_tokens": 2, "stream": true}
	viaResponses := postResponses(t, s, body)
	u := viaResponses.final.Usage
	if u.InputTokens != viaChat.prompt || u.InputTokensDetails.CachedTokens != (viaChat.prompt-1)/16*16 {
		t.Fatalf("chat prompt %d tokens; responses %d, cached %d: the two APIs render differently",
			viaChat.prompt, u.InputTokens, u.InputTokensDetails.CachedTokens)
	}
	if viaResponses.text != viaChat.text {
		t.Fatal("the same prompt got different replies")
	}
}

func TestResponsesHistoryHitsTheGeneratedReply(t *testing.T) {
	s := startServer(t, nil)
	instructions := words(7, 300)
	history := []tokenizer.Message{user(words(8, 100))}
	body := responsesBody(instructions, history...)
	body["max_output_tokens"] = 50
	first := postResponses(t, s, body)
	history = append(history, tokenizer.Message{Role: "assistant", Content: first.text}, user("and then?"))
	body = responsesBody(instructions, history...)
	body["max_output_tokens"] = 5
	// A reasoning item and a tool call with its output, as Codex resends them, render too.
	input := body["input"].([]any)
	input = append(input,
		map[string]any{"type": "reasoning", "id": "rs_1", "summary": []any{}, "encrypted_content": nil},
		map[string]any{"type": "function_call", "call_id": "c1", "name": "shell", "arguments": `{"command":["ls"]}`},
		map[string]any{"type": "function_call_output", "call_id": "c1", "output": "README.md"},
	)
	body["input"] = input
	second := postResponses(t, s, body)
	f, s1 := first.final.Usage, second.final.Usage
	if want := (f.InputTokens + f.OutputTokens - 1) / 16 * 16; s1.InputTokensDetails.CachedTokens != want {
		t.Errorf("second turn cached %d tokens, want %d (prompt %d + reply %d)", s1.InputTokensDetails.CachedTokens, want, f.InputTokens, f.OutputTokens)
	}
}

func TestResponsesWithoutStreaming(t *testing.T) {
	s := startServer(t, func(c *Config) { c.OutputLen, _ = ParseOutputLen("uniform:2:4") })
	body := responsesBody("s", user("hi"))
	body["stream"] = false
	r := postResponses(t, s, body)
	f := r.final
	n := f.Usage.OutputTokens
	if r.status != http.StatusOK || f.Status != "completed" || f.IncompleteDetails != nil || n < 2 || n > 4 ||
		len(f.Output) != 1 || f.Output[0].Type != "message" || f.Output[0].Content[0].Type != "output_text" ||
		len(f.text()) != (n-1)*tokenizer.CharsPerToken {
		t.Fatalf("status %d, response %s", r.status, r.body)
	}
	body["stream"] = true
	if streamed := postResponses(t, s, body); streamed.text != f.text() {
		t.Fatalf("streamed %q, whole %q: the same prompt must get the same reply", streamed.text, f.text())
	}
}

func TestResponsesErrors(t *testing.T) {
	s := startServer(t, nil)
	for name, tc := range map[string]struct {
		body   map[string]any
		status int
		want   string
	}{
		"unknown model":        {map[string]any{"model": "gpt-9", "input": "x"}, 404, "does not exist"},
		"no input":             {map[string]any{"model": DefaultModel}, 400, "input"},
		"bad input":            {map[string]any{"input": 7}, 400, "input"},
		"previous_response_id": {map[string]any{"input": "x", "previous_response_id": "resp_1"}, 404, "not found"},
		"too long":             {map[string]any{"input": words(1, 5000), "max_output_tokens": 30000}, 400, "maximum context length"},
	} {
		r := postResponses(t, s, tc.body)
		if r.status != tc.status || !strings.Contains(r.body, tc.want) || !strings.Contains(r.body, `"error"`) {
			t.Errorf("%s: status %d body %s; want %d containing %q", name, r.status, r.body, tc.status, tc.want)
		}
	}
}

func TestOnRequestSeesEveryAPIAndItsEngine(t *testing.T) {
	var mu sync.Mutex
	var seen []Served
	s := startServer(t, func(c *Config) {
		c.ID, c.DataParallelSize = "x", 2
		c.OnRequest = func(r Served) { mu.Lock(); seen = append(seen, r); mu.Unlock() }
	})
	body := map[string]any{"input": "hi", "max_output_tokens": 2, "prompt_cache_key": "t1"}
	postResponses(t, s, body, "Session-Id", "s1", RankHeader, "1")
	post(t, s, "/v1/messages", anthropicBody("s", 2, user("hi")), "X-Claude-Code-Session-Id", "c1")
	post(t, s, "/v1/chat/completions", openAIBody("s", 2, user("hi")))
	postResponses(t, s, map[string]any{"model": "nope", "input": "x"}) // refused: not seen
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 {
		t.Fatalf("OnRequest saw %d requests, want 3", len(seen))
	}
	if r := seen[0]; r.Path != "/v1/responses" || r.Engine != "x/1" || r.Header.Get("Session-Id") != "s1" || !bytes.Contains(r.Body, []byte(`"t1"`)) {
		t.Errorf("first: %+v", r)
	}
	if r := seen[1]; r.Path != "/v1/messages" || r.Header.Get("X-Claude-Code-Session-Id") != "c1" {
		t.Errorf("second: %+v", r)
	}
	if seen[2].Path != "/v1/chat/completions" {
		t.Errorf("third: %+v", seen[2])
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
