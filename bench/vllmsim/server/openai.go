package server

import (
	"fmt"
	"net/http"
	"strings"
	"time"
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

type openAIReply struct {
	s       *Server
	id      string
	created int64
	model   string
}

func newOpenAIWriter(s *Server, w http.ResponseWriter, req chatRequest) replyWriter {
	reply := openAIReply{s: s, id: fmt.Sprintf("chatcmpl-%016x", requestCounter.Add(1)), created: time.Now().Unix(), model: cmpOr(req.model, s.cfg.modelName())}
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

func (o *openAIStream) first(usage) { o.chunk(`{"role":"assistant","content":""}`, "") }

func (o *openAIStream) text(piece string) {
	if piece != "" {
		o.chunk(`{"content":`+string(quote(piece))+`}`, "")
		o.sse.flush()
	}
}

func (o *openAIStream) end(piece string, u usage) {
	delta := "{}"
	if piece != "" {
		delta = `{"content":` + string(quote(piece)) + `}`
	}
	o.chunk(delta, u.reason.String())
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
	writeJSON(o.w, http.StatusOK, map[string]any{
		"id": o.id, "object": "chat.completion", "created": o.created, "model": o.model,
		"choices": []any{map[string]any{
			"index":         0,
			"message":       map[string]any{"role": "assistant", "content": o.reply.String()},
			"logprobs":      nil,
			"finish_reason": u.reason.String(),
		}},
		"usage": o.s.openAIUsageOf(u),
	})
}
