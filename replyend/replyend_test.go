package replyend

import (
	"fmt"
	"strings"
	"testing"
)

// Replies as vLLM's OpenAI and Anthropic servers stream them (abridged) and
// as they answer without streaming, with the usage each reports.
var replies = []struct {
	name  string
	reply string
	ended bool
	usage Usage
}{
	{"anthropic stream, text", `event: message_start
data: {"type":"message_start","message":{"id":"msg_1","role":"assistant","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12}}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Done."}}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}

event: message_stop
data: {"type":"message_stop"}

`, true, Usage{PromptTokens: 12, OutputTokens: 2}},
	{"anthropic stream, tool call", `event: message_start
data: {"type":"message_start","message":{"stop_reason":null}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"Bash","input":{}}}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null}}

`, false, Usage{}},
	{"anthropic, cut at max_tokens", `{"type":"message","content":[{"type":"text","text":"…"}],"stop_reason":"max_tokens"}`, false, Usage{}},
	{"anthropic, text, spaced", `{"type": "message", "stop_reason" :  "end_turn"}`, true, Usage{}},
	{"openai stream, text", `data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Done."},"logprobs":null,"finish_reason":null}]}

data: {"id":"c1","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}

data: {"id":"c1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2}}

data: [DONE]

`, true, Usage{PromptTokens: 12, OutputTokens: 2}},
	{"openai stream, tool call", `data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"bash","arguments":"{}"}}]},"finish_reason":null}]}

data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}

data: [DONE]

`, false, Usage{}},
	{"openai, cut at max_tokens", `{"choices":[{"message":{"content":"…"},"finish_reason":"length"}]}`, false, Usage{}},
	{"openai, two choices, one calls a tool", `{"choices":[{"finish_reason":"stop"},{"finish_reason":"tool_calls"}]}`, false, Usage{}},
	{"responses stream, text", `event: response.created
data: {"type":"response.created","response":{"id":"resp_1","object":"response","status":"in_progress","output":[],"tool_choice":"none","tools":[]}}

event: response.output_item.added
data: {"type":"response.output_item.added","output_index":0,"item":{"id":"msg_1","type":"message","role":"assistant","status":"in_progress","content":[]}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_1","delta":"Done."}

event: response.completed
data: {"type":"response.completed","response":{"id":"resp_1","object":"response","status":"completed","output":[{"id":"msg_1","type":"message","status":"completed","content":[{"type":"output_text","text":"Done."}]}]}}

`, true, Usage{}},
	{"responses stream, tool call", `event: response.output_item.added
data: {"type":"response.output_item.added","output_index":0,"item":{"id":"fc_1","type":"function_call","status":"in_progress","name":"shell","arguments":""}}

event: response.function_call_arguments.delta
data: {"type":"response.function_call_arguments.delta","item_id":"fc_1","delta":"{}"}

event: response.completed
data: {"type":"response.completed","response":{"status":"completed","output":[{"id":"fc_1","type":"function_call","status":"completed","name":"shell","arguments":"{}"}]}}

`, false, Usage{}},
	{"responses, cut at max_output_tokens", `{"object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[{"type":"message","status":"incomplete"}]}`, false, Usage{}},
	{"responses, text", `{"object":"response","status":"completed","output":[{"type":"message","status":"completed","content":[{"type":"output_text","text":"Done."}]}]}`, true, Usage{}},
	{"responses, in progress", `{"type":"response.created","response":{"status":"in_progress"}}`, false, Usage{}},
	{"a model writing about the fields", `{"choices":[{"delta":{"content":"set \"finish_reason\":\"stop\" and \"stop_reason\":\"end_turn\""},"finish_reason":null}]}`, false, Usage{}},
	{"no reason", `{"error":{"message":"boom"}}`, false, Usage{}},
	{"openai, a stop string matched", `{"choices":[{"message":{"content":"Done."},"finish_reason":"stop","stop_reason":"</answer>"}]}`, true, Usage{}},
	{"anthropic, a forced tool closed with end_turn", `{"type":"message","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{}}],"stop_reason":"end_turn"}`, false, Usage{}},
	{"openai, a forced tool called with finish_reason stop", `{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"bash","arguments":"{}"}}]},"finish_reason":"stop"}]}`, false, Usage{}},
	{"openai stream, a forced tool called with finish_reason stop", `data: {"choices":[{"index":0,"delta":{"tool_calls":  [ {"index":0,"id":"call_1","type":"function","function":{"name":"bash","arguments":""}}]},"finish_reason":null}]}

data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}

`, false, Usage{}},
	{"openai, text with no tool call listed", `{"choices":[{"message":{"role":"assistant","content":"Done.","tool_calls":[ ]},"finish_reason":"stop"}]}`, true, Usage{}},
	{"openai, tool_calls null", `{"choices":[{"message":{"content":"Done.","tool_calls":null},"finish_reason":"stop"}]}`, true, Usage{}},
	{"responses, cut after a completed item", `{"object":"response","status":"incomplete","output":[{"type":"reasoning","status":"completed"},{"type":"message","status":"incomplete"}]}`, false, Usage{}},
	{"responses stream, failed after a completed item", `data: {"type":"response.output_item.done","item":{"type":"message","status":"completed"}}

data: {"type":"response.failed","response":{"status":"failed"}}

`, false, Usage{}},
	{"anthropic stream, cache reported", `event: message_start
data: {"type":"message_start","message":{"stop_reason":null,"usage":{"input_tokens":300,"output_tokens":0,"cache_read_input_tokens":1200,"cache_creation_input_tokens":0}}}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"input_tokens":300,"output_tokens":40,"cache_read_input_tokens":1200,"cache_creation_input_tokens":0}}

`, false, Usage{PromptTokens: 1500, CachedTokens: 1200, CacheReported: true, OutputTokens: 40}},
	{"openai, cache reported", `{"choices":[{"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1500,"total_tokens":1540,"completion_tokens":40,"prompt_tokens_details":{"cached_tokens":1200}}}`, false, Usage{PromptTokens: 1500, CachedTokens: 1200, CacheReported: true, OutputTokens: 40}},
	{"responses, cache reported", `{"object":"response","status":"completed","output":[{"type":"message"}],"usage":{"input_tokens":1500,"input_tokens_details":{"cached_tokens":0},"output_tokens":40}}`, true, Usage{PromptTokens: 1500, CacheReported: true, OutputTokens: 40}},
	{"responses stream, usage only at the end", `data: {"type":"response.created","response":{"status":"in_progress","usage":null}}

data: {"type":"response.completed","response":{"status":"completed","output":[],"usage":{"input_tokens":1500,"input_tokens_details":{"cached_tokens":1024},"output_tokens":40}}}

`, true, Usage{PromptTokens: 1500, CachedTokens: 1024, CacheReported: true, OutputTokens: 40}},
	{"a model writing about usage", `{"choices":[{"delta":{"content":"\"prompt_tokens\": 5, \"cached_tokens\": 3"},"finish_reason":null}]}`, false, Usage{}},
	{"a count too long", `{"usage":{"prompt_tokens":` + strings.Repeat("9", 100) + `}}`, false, Usage{}},
	{"a count not a number", `{"usage":{"prompt_tokens":-5,"cached_tokens":"7"}}`, false, Usage{}},
	{"a reason too long", `{"stop_reason":"` + strings.Repeat("x", 100) + `"}`, false, Usage{}},
	{"blanks past the bound", `{"stop_reason"` + strings.Repeat(" ", 100) + `:"end_turn"}`, false, Usage{}},
}

// Every reply reads the same whole, a byte at a time, and cut in two at
// every place.
func TestScannerReadsTheReply(t *testing.T) {
	for _, c := range replies {
		t.Run(c.name, func(t *testing.T) {
			check := func(how string, s *Scanner) {
				t.Helper()
				if got := s.TaskEnded(); got != c.ended {
					t.Fatalf("%s: task ended %v, want %v", how, got, c.ended)
				}
				if got := s.Usage(); got != c.usage {
					t.Fatalf("%s: usage %+v, want %+v", how, got, c.usage)
				}
			}
			var whole Scanner
			whole.Write([]byte(c.reply))
			check("whole", &whole)
			var bytewise Scanner
			for i := range len(c.reply) {
				bytewise.Write([]byte{c.reply[i]})
			}
			check("a byte at a time", &bytewise)
			for cut := range len(c.reply) {
				var s Scanner
				s.Write([]byte(c.reply[:cut]))
				s.Write([]byte(c.reply[cut:]))
				check(fmt.Sprintf("cut at %d (%q|%q)", cut, c.reply[max(0, cut-10):cut], c.reply[cut:min(len(c.reply), cut+10)]), &s)
			}
		})
	}
}

// What the scanner keeps between writes stays small whatever the reply:
// a field cut by a write is kept only up to its bounds.
func TestScannerKeepsLittle(t *testing.T) {
	var s Scanner
	s.Write([]byte(`{"stop_reason":` + strings.Repeat(" ", maxSpace)))
	for range 1000 {
		s.Write([]byte(strings.Repeat(" ", 1000)))
		if len(s.tail) > 64 {
			t.Fatalf("kept %d bytes between writes", len(s.tail))
		}
	}
	s.Write([]byte(`"end_turn"}`))
	if s.TaskEnded() {
		t.Fatal("a reason a megabyte of blanks past its key was read")
	}
}

// A reply full of fields the scanner matches (a non-streamed reply with many
// content parts) is read in one pass per key, not one per field.
func BenchmarkScannerManyFields(b *testing.B) {
	reply := []byte(`{"object":"response","output":[` + strings.Repeat(`{"type":"output_text","text":"x"},`, 10000) + `{"type":"message"}],"status":"completed"}`)
	b.SetBytes(int64(len(reply)))
	for b.Loop() {
		var s Scanner
		s.Write(reply)
		if !s.TaskEnded() {
			b.Fatal("not ended")
		}
	}
}

func BenchmarkScanner(b *testing.B) {
	chunk := []byte(`data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	b.SetBytes(int64(len(chunk)))
	var s Scanner
	for b.Loop() {
		s.Write(chunk)
	}
}
