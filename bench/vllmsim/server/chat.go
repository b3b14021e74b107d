package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/tokenizer"
)

// EngineHeader names the engine that served a response: "<server id>/<rank>".
const EngineHeader = "X-Vllmsim-Engine"

// RankHeader is vLLM's header pinning a request to a data-parallel rank.
const RankHeader = "X-data-parallel-rank"

// maxBodyBytes bounds a request body; long agent histories stay far below it.
const maxBodyBytes = 64 << 20

var requestCounter atomic.Uint64

// usage is what a finished reply reports.
type usage struct {
	promptTokens, cachedTokens, completionTokens int
	reason                                       engine.FinishReason
}

// replyWriter writes one reply in one API's format, streamed or whole.
type replyWriter interface {
	// first is called once, when the first token arrives and before its text.
	first(u usage)
	// text adds the text of a token that is not the last.
	text(piece string)
	// end adds the last token's text and closes the reply.
	end(piece string, u usage)
}

// chatAPI is what differs between the OpenAI and Anthropic endpoints.
type chatAPI struct {
	parse      func(body []byte) (chatRequest, error)
	writeError func(w http.ResponseWriter, status int, message string)
	newWriter  func(s *Server, w http.ResponseWriter, req chatRequest) replyWriter
}

var openAIChat = chatAPI{parse: parseOpenAI, writeError: writeOpenAIError, newWriter: newOpenAIWriter}

var anthropicMessages = chatAPI{parse: parseAnthropic, writeError: writeAnthropicError, newWriter: newAnthropicWriter}

func (s *Server) handleChatCompletions(w http.ResponseWriter, r *http.Request) {
	s.serveChat(w, r, openAIChat)
}

func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	s.serveChat(w, r, anthropicMessages)
}

// serveChat runs one request: parse, tokenize, choose an engine, then relay its tokens.
func (s *Server) serveChat(w http.ResponseWriter, r *http.Request, api chatAPI) {
	refuse := s.refuser(w, r, api)
	req, body, ok := s.readRequest(w, r, api, refuse)
	if !ok {
		return
	}
	prompt := tokenizer.ChatTokens(req.system, req.messages)
	maxModelLen := s.cfg.Profile.MaxModelLen
	maxTokens := maxModelLen - len(prompt)
	if req.maxTokens != nil {
		maxTokens = *req.maxTokens
	}
	switch {
	case len(prompt) >= maxModelLen:
		refuse(http.StatusBadRequest, fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens.", maxModelLen, len(prompt)))
		return
	case maxTokens < 1:
		refuse(http.StatusBadRequest, fmt.Sprintf("max_tokens must be at least 1, got %d.", maxTokens))
		return
	case len(prompt)+maxTokens > maxModelLen:
		refuse(http.StatusBadRequest, fmt.Sprintf("'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).",
			maxTokens, maxModelLen, len(prompt), maxTokens, maxModelLen, len(prompt)))
		return
	}
	rank, err := s.chooseRank(r)
	if err != nil {
		refuse(http.StatusBadRequest, err.Error())
		return
	}
	defer s.rankDone(rank)

	seed := promptSeed(s.cfg.Seed, prompt)
	outputLen := s.cfg.OutputLen.Draw(seed, maxTokens)
	// A reply whose kind tool_choice decided is one the model ended, whatever its length
	// (see toolChoice).
	stopped := outputLen < maxTokens || req.choice != choiceAuto
	engineReq := &engine.Request{
		ID:        strconv.FormatUint(requestCounter.Add(1), 10),
		Prompt:    prompt,
		MaxTokens: maxTokens,
		Output:    tokenizer.Reply(seed, outputLen, stopped),
		Stopped:   stopped,
	}
	runner := s.engines[rank]
	c, err := runner.submit(engineReq)
	if err != nil {
		refuse(http.StatusBadRequest, err.Error())
		return
	}
	engineID := fmt.Sprintf("%s/%d", s.ID(), rank)
	if s.cfg.OnRequest != nil {
		s.cfg.OnRequest(Served{Path: r.URL.Path, Engine: engineID, Header: r.Header.Clone(), Body: body})
	}
	w.Header().Set(EngineHeader, engineID)
	out := api.newWriter(s, w, req)
	dieAfter := 0
	if s.Faults().DieMidStream {
		dieAfter = max(1, outputLen/2)
	}
	u := usage{promptTokens: len(prompt)}
	for {
		select {
		case ev := <-c.events:
			u.completionTokens++
			u.cachedTokens = ev.cachedTokens
			if ev.first {
				out.first(u)
			}
			if ev.finished {
				u.reason = ev.reason
				out.end(tokenizer.Piece(ev.token), u)
				return
			}
			out.text(tokenizer.Piece(ev.token))
			if u.completionTokens == dieAfter {
				runner.abort(c)
				panic(http.ErrAbortHandler) // drops the connection mid-reply
			}
		case <-r.Context().Done():
			runner.abort(c)
			return
		}
	}
}

// refuser answers a request with an error in its API's shape, and tells OnRefuse.
func (s *Server) refuser(w http.ResponseWriter, r *http.Request, api chatAPI) func(status int, message string) {
	return func(status int, message string) {
		api.writeError(w, status, message)
		if s.cfg.OnRefuse != nil {
			s.cfg.OnRefuse(Refused{Path: r.URL.Path, Status: status, Message: message})
		}
	}
}

// readRequest reads and parses a request's body and checks that the server serves its
// model; it refuses the request and reports false when not.
func (s *Server) readRequest(w http.ResponseWriter, r *http.Request, api chatAPI, refuse func(int, string)) (chatRequest, []byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		refuse(http.StatusBadRequest, "cannot read body: "+err.Error())
		return chatRequest{}, nil, false
	}
	req, err := api.parse(body)
	if err != nil {
		status := http.StatusBadRequest
		if se, ok := errors.AsType[statusError](err); ok {
			status = se.status
		}
		refuse(status, err.Error())
		return chatRequest{}, nil, false
	}
	if req.model != "" && !s.cfg.servesModel(req.model) {
		refuse(http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", req.model))
		return chatRequest{}, nil, false
	}
	return req, body, true
}

// chooseRank honours X-data-parallel-rank as vLLM does (a non-integer is ignored, an
// out-of-range rank is an error) and otherwise asks the balancer.
func (s *Server) chooseRank(r *http.Request) (int, error) {
	s.lbMu.Lock()
	defer s.lbMu.Unlock()
	if h := r.Header.Get(RankHeader); h != "" {
		if rank, err := strconv.Atoi(h); err == nil {
			if rank < 0 || rank >= len(s.engines) {
				return 0, fmt.Errorf("data_parallel_rank %d is out of range [0, %d).", rank, len(s.engines))
			}
			s.lb.Pin(rank)
			return rank, nil
		}
	}
	return s.lb.Choose(), nil
}

func (s *Server) rankDone(rank int) {
	s.lbMu.Lock()
	s.lb.Done(rank)
	s.lbMu.Unlock()
}

// promptSeed derives a request's generation seed from the server seed and its prompt, so the
// same prompt always gets the same reply.
func promptSeed(seed uint64, prompt []uint32) uint64 {
	h := fnv.New64a()
	var buf [4]byte
	for _, t := range prompt {
		buf[0], buf[1], buf[2], buf[3] = byte(t), byte(t>>8), byte(t>>16), byte(t>>24)
		h.Write(buf[:])
	}
	return mix64(seed ^ h.Sum64())
}

// writeJSON writes v with a Content-Length, so that the response is complete on the wire
// even if the connection closes right after.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

func writeOpenAIError(w http.ResponseWriter, status int, message string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{
		"message": message, "type": errorType(status), "param": nil, "code": status,
	}})
}

func errorType(status int) string {
	if status == http.StatusNotFound {
		return "NotFoundError"
	}
	return "BadRequestError"
}

func writeAnthropicError(w http.ResponseWriter, status int, message string) {
	kind := "invalid_request_error"
	if status == http.StatusNotFound {
		kind = "not_found_error"
	}
	writeJSON(w, status, map[string]any{"type": "error", "error": map[string]string{"type": kind, "message": message}})
}

// sseWriter writes server-sent events and flushes each one.
type sseWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func newSSEWriter(w http.ResponseWriter) sseWriter {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	return sseWriter{w, rc}
}

// send writes one event; an empty name writes a data-only event (OpenAI style).
func (s sseWriter) send(name string, data []byte) {
	if name != "" {
		io.WriteString(s.w, "event: "+name+"\n")
	}
	io.WriteString(s.w, "data: ")
	s.w.Write(data)
	io.WriteString(s.w, "\n\n")
}

func (s sseWriter) sendJSON(name string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own plain structs are marshalled
	}
	s.send(name, b)
}

func (s sseWriter) flush() { s.rc.Flush() }

// quote returns s as a JSON string.
func quote(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}
