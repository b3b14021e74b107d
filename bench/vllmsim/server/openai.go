package server

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
)

type openAIPromptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type openAIUsage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *openAIPromptDetails `json:"prompt_tokens_details,omitempty"`
}

// openAIUsageOf reports cached tokens as vLLM does: only with prompt tokens details enabled
// and only when some were cached.
func (s *Server) openAIUsageOf(u usage) openAIUsage {
	out := openAIUsage{PromptTokens: u.promptTokens, CompletionTokens: u.completionTokens, TotalTokens: u.promptTokens + u.completionTokens}
	if s.cfg.PromptTokensDetails && u.cachedTokens > 0 {
		out.PromptTokensDetails = &openAIPromptDetails{CachedTokens: u.cachedTokens}
	}
	return out
}

// openAIReply is one reply: text, or with a forced tool_choice a tool call whose arguments
// carry the text (see toolArgs).
type openAIReply struct {
	s       *Server
	id      string
	created int64
	model   string
	call    *toolCall // nil for a text reply
	args    toolArgs
}

func (o *openAIReply) finishReason(r engine.FinishReason) string {
	if o.call != nil && r == engine.FinishStop {
		return "tool_calls"
	}
	return r.String()
}

func (o *openAIReply) callID() string {
	return "chatcmpl-tool-" + strings.TrimPrefix(o.id, "chatcmpl-")
}

func newOpenAIWriter(s *Server, w http.ResponseWriter, req chatRequest) replyWriter {
	reply := openAIReply{s: s, id: fmt.Sprintf("chatcmpl-%016x", requestCounter.Add(1)), created: time.Now().Unix(), model: cmpOr(req.model, s.cfg.modelName())}
	if req.choice == choiceTool {
		reply.call, reply.args = &req.call, toolArgs{arg: req.call.arg}
	}
	if !req.stream {
		return &openAIWhole{openAIReply: reply, w: w}
	}
	st := &openAIStream{openAIReply: reply, sse: newSSEWriter(w), includeUsage: req.includeUsage}
	st.chunkPrefix = fmt.Appendf(nil, `{"id":%q,"object":"chat.completion.chunk","created":%d,"model":%s,"choices":[{"index":0,"delta":`,
		reply.id, reply.created, quote(reply.model))
	return st
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// openAIStream writes chat.completion.chunk events, then the usage chunk if asked, then [DONE].
// A tool call streams as vLLM's does: the role chunk, a chunk naming the call, then its
// arguments in delta.tool_calls.
type openAIStream struct {
	openAIReply
	sse          sseWriter
	includeUsage bool
	chunkPrefix  []byte // a chunk up to its delta, the same for every chunk
	buf          []byte
}

func (o *openAIStream) chunk(delta string, finishReason string) {
	o.buf = append(o.buf[:0], o.chunkPrefix...)
	o.buf = append(o.buf, delta...)
	o.buf = append(o.buf, `,"logprobs":null,"finish_reason":`...)
	if finishReason == "" {
		o.buf = append(o.buf, "null"...)
	} else {
		o.buf = append(o.buf, quote(finishReason)...)
	}
	o.buf = append(o.buf, "}]}"...)
	o.sse.send("", o.buf)
}

func (o *openAIStream) first(usage) {
	o.chunk(`{"role":"assistant","content":""}`, "")
	if o.call != nil {
		o.chunk(fmt.Sprintf(`{"tool_calls":[{"id":%q,"type":"function","index":0,"function":{"name":%s,"arguments":""}}]}`,
			o.callID(), quote(o.call.name)), "")
	}
}

// delta is the chunk delta carrying a token's text ("" for none).
func (o *openAIStream) delta(piece string, last bool) string {
	switch {
	case o.call != nil:
		return `{"tool_calls":[{"index":0,"function":{"arguments":` + string(quote(o.args.piece(piece, last))) + `}}]}`
	case piece != "":
		return `{"content":` + string(quote(piece)) + `}`
	}
	return ""
}

func (o *openAIStream) text(piece string) {
	if d := o.delta(piece, false); d != "" {
		o.chunk(d, "")
		o.sse.flush()
	}
}

func (o *openAIStream) end(piece string, u usage) {
	o.chunk(cmpOr(o.delta(piece, true), "{}"), o.finishReason(u.reason))
	if o.includeUsage {
		o.sse.sendJSON("", map[string]any{
			"id": o.id, "object": "chat.completion.chunk", "created": o.created, "model": o.model,
			"choices": []any{}, "usage": o.s.openAIUsageOf(u),
		})
	}
	o.sse.send("", []byte("[DONE]"))
	o.sse.flush()
}

// openAIWhole collects the reply and writes one chat.completion object.
type openAIWhole struct {
	openAIReply
	w     http.ResponseWriter
	reply strings.Builder
}

func (o *openAIWhole) first(usage) {}

func (o *openAIWhole) text(piece string) { o.reply.WriteString(piece) }

func (o *openAIWhole) end(piece string, u usage) {
	o.reply.WriteString(piece)
	message := map[string]any{"role": "assistant", "content": o.reply.String()}
	if o.call != nil {
		message["content"] = nil
		message["tool_calls"] = []any{map[string]any{
			"id": o.callID(), "type": "function",
			"function": map[string]string{"name": o.call.name, "arguments": o.args.whole(o.reply.String())},
		}}
	}
	writeJSON(o.w, http.StatusOK, map[string]any{
		"id": o.id, "object": "chat.completion", "created": o.created, "model": o.model,
		"choices": []any{map[string]any{
			"index":         0,
			"message":       message,
			"logprobs":      nil,
			"finish_reason": o.finishReason(u.reason),
		}},
		"usage": o.s.openAIUsageOf(u),
	})
}
