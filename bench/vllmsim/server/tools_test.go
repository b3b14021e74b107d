package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/tokenizer"
)

var (
	bashSchema = map[string]any{"type": "object", "properties": map[string]any{"command": map[string]string{"type": "string"}}, "required": []string{"command"}}
	readSchema = map[string]any{"type": "object", "properties": map[string]any{"file_path": map[string]string{"type": "string"}}, "required": []string{"file_path"}}

	anthropicTools = []any{
		map[string]any{"name": "Bash", "description": "Run a command", "input_schema": bashSchema},
		map[string]any{"name": "Read", "description": "Read a file", "input_schema": readSchema},
	}
	openAITools = []any{
		map[string]any{"type": "function", "function": map[string]any{"name": "Bash", "parameters": bashSchema}},
		map[string]any{"type": "function", "function": map[string]any{"name": "Read", "parameters": readSchema}},
	}
	responsesTools = []any{
		map[string]any{"type": "function", "name": "Bash", "parameters": bashSchema},
		map[string]any{"type": "function", "name": "Read", "parameters": readSchema},
	}
)

// withToolChoice adds tools and a tool_choice to a request body.
func withToolChoice(body map[string]any, tools []any, choice any) map[string]any {
	body["tools"], body["tool_choice"] = tools, choice
	return body
}

// wholeReply is a non-streamed reply of either chat API.
type wholeReply struct {
	Content []struct {
		Type  string            `json:"type"`
		Name  string            `json:"name"`
		Text  string            `json:"text"`
		Input map[string]string `json:"input"`
	} `json:"content"`
	StopReason string `json:"stop_reason"`
	Choices    []struct {
		Message struct {
			Content   *string `json:"content"`
			ToolCalls []struct {
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
}

// call returns the non-streamed reply's stop reason, tool name and arguments.
func (w wholeReply) call(t *testing.T) (stop, name string, args map[string]string) {
	t.Helper()
	if len(w.Choices) == 0 {
		if len(w.Content) != 1 || w.Content[0].Type != "tool_use" {
			t.Fatalf("content %+v, want one tool_use block", w.Content)
		}
		return w.StopReason, w.Content[0].Name, w.Content[0].Input
	}
	m := w.Choices[0].Message
	if m.Content != nil || len(m.ToolCalls) != 1 || m.ToolCalls[0].Type != "function" {
		t.Fatalf("message %+v, want one function call and no content", m)
	}
	if err := json.Unmarshal([]byte(m.ToolCalls[0].Function.Arguments), &args); err != nil {
		t.Fatalf("arguments %q: %v", m.ToolCalls[0].Function.Arguments, err)
	}
	return w.Choices[0].FinishReason, m.ToolCalls[0].Function.Name, args
}

// A forced tool_choice makes the reply a tool call of the forced (or first) tool, streamed
// and not, with the stop of a tool call and as many tokens as a text reply; vLLM counts it
// as finished_reason="stop".
func TestForcedToolChoiceRepliesWithAToolCall(t *testing.T) {
	s := startServer(t, nil)
	before := scrape(t, s)
	const maxTokens = 5
	for _, tc := range []struct {
		name, path string
		body       map[string]any
		tool, arg  string
		stop       string
	}{
		{"anthropic any", "/v1/messages", withToolChoice(anthropicBody("s", maxTokens, user("a")), anthropicTools, map[string]string{"type": "any"}), "Bash", "command", "tool_use"},
		{"anthropic tool", "/v1/messages", withToolChoice(anthropicBody("s", maxTokens, user("b")), anthropicTools, map[string]string{"type": "tool", "name": "Read"}), "Read", "file_path", "tool_use"},
		{"openai required", "/v1/chat/completions", withToolChoice(openAIBody("s", maxTokens, user("c")), openAITools, "required"), "Bash", "command", "tool_calls"},
		{"openai named", "/v1/chat/completions", withToolChoice(openAIBody("s", maxTokens, user("d")), openAITools, map[string]any{"type": "function", "function": map[string]string{"name": "Read"}}), "Read", "file_path", "tool_calls"},
	} {
		r := post(t, s, tc.path, tc.body)
		var args map[string]string
		if err := json.Unmarshal([]byte(r.args), &args); err != nil {
			t.Fatalf("%s: streamed arguments %q: %v", tc.name, r.args, err)
		}
		// The model ends its call with <|im_end|>, which has no text.
		if r.stop != tc.stop || r.tool != tc.tool || r.text != "" || r.completion != maxTokens || len(args) != 1 || len(args[tc.arg]) != (maxTokens-1)*tokenizer.CharsPerToken {
			t.Errorf("%s streamed: stop %q tool %q text %q completion %d args %v; want %s, %s, no text, %d tokens in %s",
				tc.name, r.stop, r.tool, r.text, r.completion, args, tc.stop, tc.tool, maxTokens, tc.arg)
		}
		tc.body["stream"] = false
		var whole wholeReply
		if err := json.Unmarshal([]byte(post(t, s, tc.path, tc.body).body), &whole); err != nil {
			t.Fatal(err)
		}
		if stop, name, wholeArgs := whole.call(t); stop != tc.stop || name != tc.tool || wholeArgs[tc.arg] != args[tc.arg] {
			t.Errorf("%s whole: stop %q tool %q args %v; want the streamed call", tc.name, stop, name, wholeArgs)
		}
	}
	after := scrape(t, s)
	for reason, want := range map[string]float64{"stop": 8, "length": 0} {
		key := `vllm:request_success_total{engine="0",finished_reason="` + reason + `"}`
		if got := after[key] - before[key]; got != want {
			t.Errorf("%s grew by %v, want %v", key, got, want)
		}
	}
}

// tool_choice none gives text the model ended, even at max_tokens (the simulator's liberty:
// with --output-len max the length stands in for the model's choice); auto, given or not,
// keeps today's reply, cut by max_tokens.
func TestToolChoiceNoneEndsTheTurnAndAutoIsUnchanged(t *testing.T) {
	s := startServer(t, nil)
	const maxTokens = 5
	for _, tc := range []struct {
		name, path string
		body       map[string]any
		stop       string
		words      int
	}{
		{"anthropic none", "/v1/messages", withToolChoice(anthropicBody("s", maxTokens, user("a")), anthropicTools, map[string]string{"type": "none"}), "end_turn", maxTokens - 1},
		{"openai none", "/v1/chat/completions", withToolChoice(openAIBody("s", maxTokens, user("b")), openAITools, "none"), "stop", maxTokens - 1},
		{"anthropic auto", "/v1/messages", withToolChoice(anthropicBody("s", maxTokens, user("c")), anthropicTools, map[string]string{"type": "auto"}), "max_tokens", maxTokens},
		{"openai auto", "/v1/chat/completions", withToolChoice(openAIBody("s", maxTokens, user("d")), openAITools, "auto"), "length", maxTokens},
		{"anthropic absent", "/v1/messages", withToolChoice(anthropicBody("s", maxTokens, user("e")), anthropicTools, nil), "max_tokens", maxTokens},
	} {
		before := scrape(t, s)
		r := post(t, s, tc.path, tc.body)
		if r.stop != tc.stop || r.tool != "" || r.args != "" || r.completion != maxTokens || len(r.text) != tc.words*tokenizer.CharsPerToken {
			t.Errorf("%s streamed: stop %q tool %q completion %d text %q; want %s, text of %d tokens", tc.name, r.stop, r.tool, r.completion, r.text, tc.stop, tc.words)
		}
		counted := "stop"
		if tc.words == maxTokens {
			counted = "length"
		}
		key := `vllm:request_success_total{engine="0",finished_reason="` + counted + `"}`
		if got := scrape(t, s)[key] - before[key]; got != 1 {
			t.Errorf("%s: %s grew by %v, want 1", tc.name, key, got)
		}
		tc.body["stream"] = false
		var whole wholeReply
		if err := json.Unmarshal([]byte(post(t, s, tc.path, tc.body).body), &whole); err != nil {
			t.Fatal(err)
		}
		stop, text := whole.StopReason, ""
		if len(whole.Content) == 1 {
			text = whole.Content[0].Text
		}
		if len(whole.Choices) == 1 {
			stop, text = whole.Choices[0].FinishReason, *whole.Choices[0].Message.Content
		}
		if stop != tc.stop || text != r.text {
			t.Errorf("%s whole: stop %q text %q; want %s and the streamed text", tc.name, stop, text, tc.stop)
		}
	}
}

func TestResponsesToolChoice(t *testing.T) {
	s := startServer(t, nil)
	body := withToolChoice(responsesBody("s", user("hi")), responsesTools, "required")
	body["max_output_tokens"] = 3
	r := postResponses(t, s, body)
	want := "response.created response.in_progress response.output_item.added " +
		"response.function_call_arguments.delta response.function_call_arguments.delta response.function_call_arguments.delta " +
		"response.function_call_arguments.done response.output_item.done response.completed"
	if got := strings.Join(r.events, " "); got != want {
		t.Fatalf("events\n%s\nwant\n%s", got, want)
	}
	f := r.final
	if f.Status != "completed" || f.IncompleteDetails != nil || len(f.Output) != 1 {
		t.Fatalf("forced call: status %q, output %+v", f.Status, f.Output)
	}
	item := f.Output[0]
	var args map[string]string
	if err := json.Unmarshal([]byte(item.Arguments), &args); err != nil || item.Type != "function_call" || item.Name != "Bash" ||
		item.Status != "completed" || item.Arguments != r.text || len(args["command"]) != 2*tokenizer.CharsPerToken {
		t.Errorf("output item %+v (%v); want a completed Bash call whose arguments the deltas spelled", item, err)
	}

	body["tool_choice"], body["stream"] = "none", false
	none := postResponses(t, s, body).final
	if none.Status != "completed" || none.IncompleteDetails != nil || none.Output[0].Type != "message" || none.Usage.OutputTokens != 3 {
		t.Errorf("tool_choice none at max_output_tokens: status %q, output %+v; want a completed message", none.Status, none.Output)
	}
}

func TestToolChoiceErrors(t *testing.T) {
	s := startServer(t, nil)
	for name, tc := range map[string]struct {
		path string
		body map[string]any
		want string
	}{
		"required without tools": {"/v1/chat/completions", withToolChoice(openAIBody("s", 2, user("x")), nil, "required"), "`tools` must be set"},
		"unknown tool":           {"/v1/messages", withToolChoice(anthropicBody("s", 2, user("x")), anthropicTools, map[string]string{"type": "tool", "name": "Edit"}), "is not among the tools"},
		"unknown choice":         {"/v1/chat/completions", withToolChoice(openAIBody("s", 2, user("x")), openAITools, "sometimes"), "unknown value"},
	} {
		if r := post(t, s, tc.path, tc.body); r.status != http.StatusBadRequest || !strings.Contains(r.body, tc.want) {
			t.Errorf("%s: status %d body %s; want 400 containing %q", name, r.status, r.body, tc.want)
		}
	}
}
