package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/tokenizer"
)

// The OpenAI Responses API (POST /v1/responses) as vLLM serves it for a model without the
// Harmony format: stateless (vLLM does not store responses unless VLLM_ENABLE_RESPONSES_API_STORE
// is set, so `store` is ignored and a previous_response_id is not found), the prompt rendered
// with the chat template from `instructions` (a system turn) followed by the input items.

var responsesAPI = chatAPI{parse: parseResponses, writeError: writeOpenAIError, newWriter: newResponsesWriter}

func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	s.serveChat(w, r, responsesAPI)
}

// statusError is a request error with its own HTTP status (400 otherwise).
type statusError struct {
	status int
	msg    string
}

func (e statusError) Error() string { return e.msg }

// responsesRequest is the part of a Responses API request the simulator reads; the rest
// (store, include, reasoning, text, prompt_cache_key, client_metadata...) is accepted and
// ignored, as a stateless vLLM does.
type responsesRequest struct {
	Model              string          `json:"model"`
	Instructions       string          `json:"instructions"`
	Input              json.RawMessage `json:"input"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Stream             bool            `json:"stream"`
	Tools              json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	PreviousResponseID string          `json:"previous_response_id"`
}

// responsesItem is one input item: a message (with or without "type"), a function or custom
// tool call and its output, reasoning, or another kind the simulator renders as a placeholder.
type responsesItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Input     string          `json:"input"`
	Output    json.RawMessage `json:"output"`
}

// parseResponses reads a POST /v1/responses body. `input` is a string (one user message) or a
// list of items; instructions become the system turn, developer messages system turns, as in
// parseOpenAI; tool definitions join the system prompt.
func parseResponses(body []byte) (chatRequest, error) {
	var in responsesRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return chatRequest{}, fmt.Errorf("invalid JSON body: %w", err)
	}
	if in.PreviousResponseID != "" {
		return chatRequest{}, statusError{http.StatusNotFound, fmt.Sprintf("Response with id '%s' not found.", in.PreviousResponseID)}
	}
	out := chatRequest{model: in.Model, maxTokens: in.MaxOutputTokens, stream: in.Stream, system: in.Instructions}
	var err error
	if out.choice, out.call, err = parseToolChoice(in.ToolChoice, in.Tools); err != nil {
		return chatRequest{}, err
	}
	raw := bytes.TrimSpace(in.Input)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return chatRequest{}, errors.New("input: field required")
	case raw[0] == '"':
		var text string
		if err := json.Unmarshal(raw, &text); err != nil {
			return chatRequest{}, fmt.Errorf("input: %w", err)
		}
		out.messages = []tokenizer.Message{{Role: "user", Content: text}}
	default:
		var items []responsesItem
		if err := json.Unmarshal(raw, &items); err != nil {
			return chatRequest{}, errors.New("input must be a string or a list of input items")
		}
		for i, item := range items {
			msg, ok, err := item.message()
			if err != nil {
				return chatRequest{}, fmt.Errorf("input[%d]: %w", i, err)
			}
			if ok {
				out.messages = append(out.messages, msg)
			}
		}
	}
	if len(out.messages) == 0 && out.system == "" {
		return chatRequest{}, errors.New("input: at least one item is required")
	}
	if out.system != "" || withTools("", in.Tools) != "" {
		out.system = withTools(out.system, in.Tools)
	}
	return out, nil
}

// message renders one input item as a chat turn; ok is false for items that add nothing
// to the prompt (reasoning).
func (it responsesItem) message() (tokenizer.Message, bool, error) {
	switch it.Type {
	case "", "message":
		text, err := contentText(it.Content, false)
		if err != nil {
			return tokenizer.Message{}, false, err
		}
		role := it.Role
		switch role {
		case "developer":
			role = "system"
		case "":
			return tokenizer.Message{}, false, errors.New("message: role required")
		}
		return tokenizer.Message{Role: role, Content: text}, true, nil
	case "function_call":
		return tokenizer.Message{Role: "assistant", Content: it.Name + " " + it.Arguments}, true, nil
	case "custom_tool_call":
		return tokenizer.Message{Role: "assistant", Content: it.Name + " " + it.Input}, true, nil
	case "function_call_output", "custom_tool_call_output":
		text, err := contentText(it.Output, false)
		if err != nil {
			return tokenizer.Message{}, false, fmt.Errorf("%s: %w", it.Type, err)
		}
		return tokenizer.Message{Role: "tool", Content: text}, true, nil
	case "reasoning":
		return tokenizer.Message{}, false, nil // earlier reasoning is not rendered back
	default:
		return tokenizer.Message{Role: "assistant", Content: "[" + it.Type + "]"}, true, nil
	}
}

type responsesInputDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type responsesOutputDetails struct {
	ReasoningTokens int `json:"reasoning_tokens"`
}

type responsesUsage struct {
	InputTokens         int                    `json:"input_tokens"`
	InputTokensDetails  responsesInputDetails  `json:"input_tokens_details"`
	OutputTokens        int                    `json:"output_tokens"`
	OutputTokensDetails responsesOutputDetails `json:"output_tokens_details"`
	TotalTokens         int                    `json:"total_tokens"`
}

// responsesUsageOf reports the whole prompt as input_tokens and the cached part in
// input_tokens_details.cached_tokens (0 without prompt tokens details).
func (s *Server) responsesUsageOf(u usage) responsesUsage {
	out := responsesUsage{InputTokens: u.promptTokens, OutputTokens: u.completionTokens, TotalTokens: u.promptTokens + u.completionTokens}
	if s.cfg.PromptTokensDetails {
		out.InputTokensDetails.CachedTokens = u.cachedTokens
	}
	return out
}

// responsesReply builds the response object and its one output item: a message, or with a
// forced tool_choice a function_call whose arguments carry the text (see toolArgs).
type responsesReply struct {
	s            *Server
	id, msgID    string
	created      int64
	model        string
	instructions string
	maxTokens    *int
	call         *toolCall // nil for a message
	args         toolArgs
	reply        strings.Builder // the text so far
}

func newResponsesWriter(s *Server, w http.ResponseWriter, req chatRequest) replyWriter {
	n := requestCounter.Add(1)
	reply := responsesReply{
		s: s, id: fmt.Sprintf("resp_%016x", n), msgID: fmt.Sprintf("msg_%016x", n),
		created: time.Now().Unix(), model: cmpOr(req.model, s.cfg.modelName()),
		instructions: req.system, maxTokens: req.maxTokens,
	}
	if req.choice == choiceTool {
		reply.msgID = fmt.Sprintf("fc_%016x", n)
		reply.call, reply.args = &req.call, toolArgs{arg: req.call.arg}
	}
	if !req.stream {
		return &responsesWhole{responsesReply: reply, w: w}
	}
	st := &responsesStream{responsesReply: reply, sse: newSSEWriter(w)}
	// vLLM announces the response before the engine produces anything.
	st.event("response.created", map[string]any{"response": st.object("in_progress", nil, nil)})
	st.event("response.in_progress", map[string]any{"response": st.object("in_progress", nil, nil)})
	st.sse.flush()
	return st
}

func (r *responsesReply) outputText() map[string]any {
	return map[string]any{"type": "output_text", "text": r.reply.String(), "annotations": []any{}, "logprobs": []any{}}
}

// item is the output item in a given status: the message, or the function call.
func (r *responsesReply) item(status string) map[string]any {
	if r.call != nil {
		args := ""
		if status == "completed" {
			args = r.args.whole(r.reply.String())
		}
		return map[string]any{
			"id": r.msgID, "type": "function_call", "status": status, "name": r.call.name,
			"call_id": "call_" + strings.TrimPrefix(r.msgID, "fc_"), "arguments": args,
		}
	}
	content := []any{}
	if status == "completed" {
		content = []any{r.outputText()}
	}
	return map[string]any{"id": r.msgID, "type": "message", "role": "assistant", "status": status, "content": content}
}

// object is the response object in a given status, with its output and usage (nil while
// in progress).
func (r *responsesReply) object(status string, output []any, u *responsesUsage) map[string]any {
	if output == nil {
		output = []any{}
	}
	var incomplete any
	if status == "incomplete" {
		incomplete = map[string]string{"reason": "max_output_tokens"}
	}
	var instructions any
	if r.instructions != "" {
		instructions = r.instructions
	}
	return map[string]any{
		"id": r.id, "object": "response", "created_at": r.created, "model": r.model,
		"status": status, "incomplete_details": incomplete, "error": nil,
		"instructions": instructions, "output": output, "usage": u,
		"max_output_tokens": r.maxTokens, "previous_response_id": nil,
		"parallel_tool_calls": true, "tool_choice": "auto", "tools": []any{},
		"temperature": 1.0, "top_p": 1.0, "truncation": "disabled", "background": false,
		"store": false, "metadata": map[string]any{}, "reasoning": nil, "service_tier": "auto",
		"text": map[string]any{"format": map[string]string{"type": "text"}}, "user": nil,
	}
}

// final is the finished response: completed, or incomplete when max_output_tokens cut it.
func (r *responsesReply) final(u usage) map[string]any {
	status := "completed"
	if u.reason == engine.FinishLength && r.maxTokens != nil {
		status = "incomplete"
	}
	usage := r.s.responsesUsageOf(u)
	return r.object(status, []any{r.item("completed")}, &usage)
}

// responsesStream writes vLLM's event sequence for a text reply: response.created,
// response.in_progress, then at the first token response.output_item.added and
// response.content_part.added, response.output_text.delta per token, response.output_text.done,
// response.content_part.done, response.output_item.done, and response.completed with usage.
// A function call has no content part: response.function_call_arguments.delta per token and
// response.function_call_arguments.done take the place of the text events.
// Each event is named (event: TYPE) and carries its type and a sequence_number.
type responsesStream struct {
	responsesReply
	sse sseWriter
	seq int
}

func (o *responsesStream) event(kind string, fields map[string]any) {
	fields["type"] = kind
	fields["sequence_number"] = o.seq
	o.seq++
	o.sse.sendJSON(kind, fields)
}

func (o *responsesStream) first(usage) {
	o.event("response.output_item.added", map[string]any{"output_index": 0, "item": o.item("in_progress")})
	if o.call != nil {
		return
	}
	o.event("response.content_part.added", map[string]any{
		"item_id": o.msgID, "output_index": 0, "content_index": 0,
		"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}, "logprobs": []any{}},
	})
}

func (o *responsesStream) delta(piece string, last bool) {
	if o.call != nil {
		o.reply.WriteString(piece)
		o.event("response.function_call_arguments.delta", map[string]any{
			"item_id": o.msgID, "output_index": 0, "delta": o.args.piece(piece, last),
		})
		return
	}
	if piece == "" {
		return
	}
	o.reply.WriteString(piece)
	o.event("response.output_text.delta", map[string]any{
		"item_id": o.msgID, "output_index": 0, "content_index": 0, "delta": piece, "logprobs": []any{},
	})
}

func (o *responsesStream) text(piece string) {
	o.delta(piece, false)
	o.sse.flush()
}

func (o *responsesStream) end(piece string, u usage) {
	o.delta(piece, true)
	if o.call != nil {
		o.event("response.function_call_arguments.done", map[string]any{
			"item_id": o.msgID, "output_index": 0, "arguments": o.args.whole(o.reply.String()),
		})
		o.event("response.output_item.done", map[string]any{"output_index": 0, "item": o.item("completed")})
		o.event("response.completed", map[string]any{"response": o.final(u)})
		o.sse.flush()
		return
	}
	text := o.reply.String()
	o.event("response.output_text.done", map[string]any{
		"item_id": o.msgID, "output_index": 0, "content_index": 0, "text": text, "logprobs": []any{},
	})
	o.event("response.content_part.done", map[string]any{
		"item_id": o.msgID, "output_index": 0, "content_index": 0, "part": o.outputText(),
	})
	o.event("response.output_item.done", map[string]any{"output_index": 0, "item": o.item("completed")})
	o.event("response.completed", map[string]any{"response": o.final(u)})
	o.sse.flush()
}

// responsesWhole collects the reply and writes one response object.
type responsesWhole struct {
	responsesReply
	w http.ResponseWriter
}

func (o *responsesWhole) first(usage) {}

func (o *responsesWhole) text(piece string) { o.reply.WriteString(piece) }

func (o *responsesWhole) end(piece string, u usage) {
	o.reply.WriteString(piece)
	writeJSON(o.w, http.StatusOK, o.final(u))
}
