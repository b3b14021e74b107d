package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/tokenizer"
)

type anthropicUsage struct {
	InputTokens              int  `json:"input_tokens"`
	OutputTokens             int  `json:"output_tokens"`
	CacheReadInputTokens     *int `json:"cache_read_input_tokens,omitempty"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens,omitempty"`
}

// anthropicUsageOf splits the prompt as Anthropic does: input_tokens are the uncached ones,
// cache_read_input_tokens the cached ones (vLLM PR #40912). Without prompt tokens details the
// cache fields are left out and input_tokens counts the whole prompt.
func (s *Server) anthropicUsageOf(u usage) anthropicUsage {
	if !s.cfg.PromptTokensDetails {
		return anthropicUsage{InputTokens: u.promptTokens, OutputTokens: u.completionTokens}
	}
	cached, created := u.cachedTokens, 0
	return anthropicUsage{
		InputTokens:              u.promptTokens - cached,
		OutputTokens:             u.completionTokens,
		CacheReadInputTokens:     &cached,
		CacheCreationInputTokens: &created,
	}
}

// anthropicReply is one reply: text, or with a forced tool_choice a tool_use block whose
// input carries the text (see toolArgs).
type anthropicReply struct {
	s     *Server
	id    string
	model string
	call  *toolCall // nil for a text reply
	args  toolArgs
}

func (a *anthropicReply) stopReason(r engine.FinishReason) string {
	switch {
	case r == engine.FinishLength:
		return "max_tokens"
	case a.call != nil:
		return "tool_use"
	}
	return "end_turn"
}

func (a *anthropicReply) toolUse() map[string]any {
	return map[string]any{"type": "tool_use", "id": "toolu_" + strings.TrimPrefix(a.id, "msg_"), "name": a.call.name, "input": map[string]any{}}
}

func newAnthropicWriter(s *Server, w http.ResponseWriter, req chatRequest) replyWriter {
	reply := anthropicReply{s: s, id: fmt.Sprintf("msg_%016x", requestCounter.Add(1)), model: cmpOr(req.model, s.cfg.modelName())}
	if req.choice == choiceTool {
		reply.call, reply.args = &req.call, toolArgs{arg: req.call.arg}
	}
	if !req.stream {
		return &anthropicWhole{anthropicReply: reply, w: w}
	}
	return &anthropicStream{anthropicReply: reply, sse: newSSEWriter(w)}
}

// anthropicStream writes Anthropic's event sequence: message_start, content_block_start, ping,
// content_block_delta... (text_delta, or input_json_delta in a tool_use block),
// content_block_stop, message_delta (with stop reason and usage), message_stop.
type anthropicStream struct {
	anthropicReply
	sse sseWriter
}

// textDeltaPrefix and jsonDeltaPrefix start every content_block_delta event of the single
// content block, text or tool_use.
const (
	textDeltaPrefix = `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":`
	jsonDeltaPrefix = `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":`
)

func (a *anthropicStream) first(u usage) {
	a.sse.sendJSON("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": a.id, "type": "message", "role": "assistant", "model": a.model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": a.s.anthropicUsageOf(u),
	}})
	if a.call != nil {
		a.sse.sendJSON("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": a.toolUse()})
	} else {
		a.sse.send("content_block_start", []byte(`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`))
	}
	a.sse.send("ping", []byte(`{"type":"ping"}`))
}

func (a *anthropicStream) delta(piece string, last bool) {
	switch {
	case a.call != nil:
		a.sse.send("content_block_delta", []byte(jsonDeltaPrefix+string(quote(a.args.piece(piece, last)))+"}}"))
	case piece != "":
		a.sse.send("content_block_delta", []byte(textDeltaPrefix+string(quote(piece))+"}}"))
	}
}

func (a *anthropicStream) text(piece string) {
	a.delta(piece, false)
	a.sse.flush()
}

func (a *anthropicStream) end(piece string, u usage) {
	a.delta(piece, true)
	a.sse.send("content_block_stop", []byte(`{"type":"content_block_stop","index":0}`))
	a.sse.sendJSON("message_delta", map[string]any{
		"type":  "message_delta",
		"delta": map[string]any{"stop_reason": a.stopReason(u.reason), "stop_sequence": nil},
		"usage": a.s.anthropicUsageOf(u),
	})
	a.sse.send("message_stop", []byte(`{"type":"message_stop"}`))
	a.sse.flush()
}

// anthropicWhole collects the reply and writes one message object.
type anthropicWhole struct {
	anthropicReply
	w     http.ResponseWriter
	reply strings.Builder
}

func (a *anthropicWhole) first(usage) {}

func (a *anthropicWhole) text(piece string) { a.reply.WriteString(piece) }

func (a *anthropicWhole) end(piece string, u usage) {
	a.reply.WriteString(piece)
	var block any = map[string]string{"type": "text", "text": a.reply.String()}
	if a.call != nil {
		use := a.toolUse()
		use["input"] = json.RawMessage(a.args.whole(a.reply.String()))
		block = use
	}
	writeJSON(a.w, http.StatusOK, map[string]any{
		"id": a.id, "type": "message", "role": "assistant", "model": a.model,
		"content":     []any{block},
		"stop_reason": a.stopReason(u.reason), "stop_sequence": nil,
		"usage": a.s.anthropicUsageOf(u),
	})
}

var anthropicCount = chatAPI{parse: parseAnthropicCount, writeError: writeAnthropicError}

// handleCountTokens answers Anthropic's count_tokens as vLLM does: the size of the prompt the
// chat template renders (system prompt, tools, messages), which the API server tokenizes
// without running an engine. Off (--count-tokens=false), the path is unknown, as on a vLLM
// before it: FastAPI's 404.
func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	if !s.cfg.CountTokens {
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
		return
	}
	req, body, ok := s.readRequest(w, r, anthropicCount, s.refuser(w, r, anthropicCount))
	if !ok {
		return
	}
	n := len(tokenizer.ChatTokens(req.system, req.messages))
	engine := s.ID() + "/api"
	if s.cfg.OnCount != nil {
		s.cfg.OnCount(Served{Path: r.URL.Path, Engine: engine, Header: r.Header.Clone(), Body: body})
	}
	w.Header().Set(EngineHeader, engine)
	writeJSON(w, http.StatusOK, map[string]any{
		"input_tokens": n, "context_management": map[string]int{"original_input_tokens": n},
	})
}
