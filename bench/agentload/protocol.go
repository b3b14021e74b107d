package agentload

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// anthropicVersion is the API version Claude Code announces.
const anthropicVersion = "2023-06-01"

// Claude Code's sub-agent and hint headers. A sub-agent that another
// sub-agent spawned would also send X-Claude-Code-Parent-Agent-Id; the load
// generator's sub-agents are all spawned by the session's main agent, so
// they send none. RequestClassHeader is "auxiliary" on a side call.
const (
	AgentHeader        = "X-Claude-Code-Agent-Id"
	CompactionHeader   = "X-Claude-Code-Compaction"
	CompactedHeader    = "X-Claude-Code-Context-Compacted"
	RequestClassHeader = "X-Claude-Code-Request-Class"
)

// errStreamTruncated means the body ended before the protocol's final event.
var errStreamTruncated = errors.New("stream ended before its final event")

// streamOutcome is what one streamed response told the client.
type streamOutcome struct {
	// text is the assistant's reply, all text deltas concatenated.
	text string
	// firstToken is when the first non-empty text delta arrived.
	firstToken time.Time
	// outputTokens comes from the server's usage, or counts text deltas when
	// the stream ended before usage arrived.
	outputTokens int
	// promptTokens is the prompt size the server reported (0 if none).
	promptTokens int
	// cachedTokens is how many prompt tokens the server served from cache.
	cachedTokens int
	// cacheReported is true when the server reported cachedTokens.
	cacheReported bool
	// stop is the server's stop_reason or finish_reason ("" if none came).
	stop string
}

// textStream gathers the deltas common to both protocols: text, and the
// arguments of a tool call.
type textStream struct {
	text       strings.Builder
	args       strings.Builder
	firstToken time.Time
	deltas     int
}

func (t *textStream) add(delta string) { t.addTo(&t.text, delta) }

func (t *textStream) addArgs(delta string) { t.addTo(&t.args, delta) }

func (t *textStream) addTo(b *strings.Builder, delta string) {
	if delta == "" {
		return
	}
	if t.firstToken.IsZero() {
		t.firstToken = time.Now()
	}
	b.WriteString(delta)
	t.deltas++
}

// reply is what the session keeps of the answer: its text, then the
// command of its tool call (the raw arguments if they hold none). Keeping
// the command as text resends what the model generated, so the next turn's
// prompt hits the cache as a text reply's does.
func (t *textStream) reply() string {
	if t.args.Len() == 0 {
		return t.text.String()
	}
	var call struct {
		Command string `json:"command"`
	}
	if json.Unmarshal([]byte(t.args.String()), &call) == nil && call.Command != "" {
		return t.text.String() + call.Command
	}
	return t.text.String() + t.args.String()
}

// bashDescription and bashSchema define the one tool offered, a trimmed
// version of Claude Code's Bash tool: enough for a forced call to have a
// shape, small enough to leave prompt sizes nearly unchanged.
const bashDescription = "Executes a bash command and returns its output."

var bashSchema = json.RawMessage(`{"type":"object","properties":{"command":{"type":"string","description":"The command to execute"}},"required":["command"]}`)

// endsTask says whether the turn's reply is text that ends its agent's
// task rather than a tool call: true on the last request of a conversation
// (the session's last turn, a sub-agent's last turn, whose text is its
// report to its parent, and a summarising request, whose summary is text).
// The requests force the answer through tool_choice, so that a simulated
// model gives each turn the stop a real one would.
// A side call's reply is text too: a title, a summary.
func endsTask(t Turn) bool { return t.Final || t.Side }

// newRequest builds the streaming request for turn t of session s.
func newRequest(ctx context.Context, baseURL string, cfg Config, s *Session, t Turn) (*http.Request, error) {
	var body any
	path := "/v1/messages?beta=true"
	switch cfg.API {
	case APIAnthropic:
		body = anthropicBody(cfg, s, t)
	case APIOpenAI:
		body = openAIBody(cfg, t)
		path = "/v1/chat/completions"
	default:
		return nil, fmt.Errorf("unknown api %q", cfg.API)
	}
	payload, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(baseURL, "/")+path, bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if cfg.API == APIAnthropic {
		req.Header.Set("anthropic-version", anthropicVersion)
		req.Header.Set("x-app", "cli")
	}
	if cfg.APIKey != "" {
		// As each API's clients send their key.
		if cfg.API == APIAnthropic {
			req.Header.Set("x-api-key", cfg.APIKey)
		} else {
			req.Header.Set("Authorization", "Bearer "+cfg.APIKey)
		}
	}
	if cfg.NoSessionID {
		return req, nil
	}
	if cfg.SessionHeader != "" {
		req.Header.Set(cfg.SessionHeader, s.ID)
	}
	if s.AgentID != "" {
		req.Header.Set(AgentHeader, s.AgentID)
	}
	if cfg.CompactionHints {
		if t.Side {
			req.Header.Set(RequestClassHeader, "auxiliary")
		}
		switch t.Kind {
		case TurnCompacting:
			req.Header.Set(CompactionHeader, "auto")
		case TurnCompacted:
			req.Header.Set(CompactedHeader, "1")
		}
	}
	return req, nil
}

// readStream reads a streamed response body of the given protocol.
func readStream(api API, body io.Reader) (streamOutcome, error) {
	events := newSSEReader(body)
	if api == APIOpenAI {
		return readOpenAIStream(events)
	}
	return readAnthropicStream(events)
}

type anthropicBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type anthropicMessage struct {
	Role    string           `json:"role"`
	Content []anthropicBlock `json:"content"`
}

type anthropicTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type anthropicToolChoice struct {
	Type string `json:"type"`
}

type anthropicRequest struct {
	Model      string              `json:"model"`
	MaxTokens  int                 `json:"max_tokens"`
	System     []anthropicBlock    `json:"system"`
	Messages   []anthropicMessage  `json:"messages"`
	Tools      []anthropicTool     `json:"tools"`
	ToolChoice anthropicToolChoice `json:"tool_choice"`
	Metadata   *anthropicMetadata  `json:"metadata,omitempty"`
	Stream     bool                `json:"stream"`
}

type anthropicMetadata struct {
	UserID string `json:"user_id"`
}

// anthropicBody shapes a turn as Claude Code does: system and content as
// lists of text blocks, tools on every request, identity in
// metadata.user_id (none without an ID). tool_choice stands in for the
// model's decision (see endsTask).
func anthropicBody(cfg Config, s *Session, t Turn) anthropicRequest {
	messages := make([]anthropicMessage, len(t.Messages))
	for i, m := range t.Messages {
		messages[i] = anthropicMessage{Role: m.Role, Content: []anthropicBlock{{Type: "text", Text: m.Content}}}
	}
	req := anthropicRequest{
		Model:     t.model(cfg),
		MaxTokens: t.MaxTokens,
		System:    []anthropicBlock{{Type: "text", Text: t.System}},
		Messages:  messages,
		Tools:     []anthropicTool{{Name: "Bash", Description: bashDescription, InputSchema: bashSchema}},
		Stream:    true,
	}
	req.ToolChoice.Type = "any"
	if endsTask(t) {
		req.ToolChoice.Type = "none"
	}
	if !cfg.NoSessionID {
		req.Metadata = &anthropicMetadata{UserID: s.UserID}
	}
	return req
}

// anthropicUsage fields are pointers because servers send subsets: the
// input side in message_start, the output side in message_delta.
type anthropicUsage struct {
	InputTokens              *int `json:"input_tokens"`
	OutputTokens             *int `json:"output_tokens"`
	CacheReadInputTokens     *int `json:"cache_read_input_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens"`
}

type anthropicEvent struct {
	Type    string `json:"type"`
	Message *struct {
		Usage *anthropicUsage `json:"usage"`
	} `json:"message"`
	Delta *struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		PartialJSON string `json:"partial_json"`
		StopReason  string `json:"stop_reason"`
	} `json:"delta"`
	Usage *anthropicUsage `json:"usage"`
	Error *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// readAnthropicStream follows message_start, content_block_delta (text_delta
// or a tool call's input_json_delta), message_delta (stop reason, usage) and
// message_stop.
func readAnthropicStream(events *sseReader) (streamOutcome, error) {
	var text textStream
	// Latest value of each field: message_start carries the input side,
	// message_delta the final output count (message_start's is a placeholder).
	var input, cacheRead, cacheCreation, output *int
	var stop string
	merge := func(u *anthropicUsage, withOutput bool) {
		if u == nil {
			return
		}
		input = cmp.Or(u.InputTokens, input)
		cacheRead = cmp.Or(u.CacheReadInputTokens, cacheRead)
		cacheCreation = cmp.Or(u.CacheCreationInputTokens, cacheCreation)
		if withOutput {
			output = cmp.Or(u.OutputTokens, output)
		}
	}
	outcome := func() streamOutcome {
		out := streamOutcome{text: text.reply(), firstToken: text.firstToken, outputTokens: text.deltas, stop: stop}
		if output != nil {
			out.outputTokens = *output
		}
		// Anthropic counts cached and freshly cached tokens apart from input_tokens.
		for _, n := range []*int{input, cacheRead, cacheCreation} {
			if n != nil {
				out.promptTokens += *n
			}
		}
		if cacheRead != nil {
			out.cachedTokens, out.cacheReported = *cacheRead, true
		}
		return out
	}
	stopped := false
	for !stopped {
		ev, err := events.next()
		if err == io.EOF {
			return outcome(), errStreamTruncated
		}
		if err != nil {
			return outcome(), err
		}
		var msg anthropicEvent
		if err := json.Unmarshal([]byte(ev.data), &msg); err != nil {
			return outcome(), fmt.Errorf("bad %s event: %w", ev.name, err)
		}
		switch msg.Type {
		case "message_start":
			if msg.Message != nil {
				merge(msg.Message.Usage, false)
			}
		case "content_block_delta":
			if msg.Delta == nil {
				break
			}
			switch msg.Delta.Type {
			case "text_delta":
				text.add(msg.Delta.Text)
			case "input_json_delta":
				text.addArgs(msg.Delta.PartialJSON)
			}
		case "message_delta":
			merge(msg.Usage, true)
			if msg.Delta != nil {
				stop = cmp.Or(msg.Delta.StopReason, stop)
			}
		case "message_stop":
			stopped = true
		case "error":
			if msg.Error == nil {
				return outcome(), errors.New("error event without details")
			}
			return outcome(), fmt.Errorf("server error %s: %s", msg.Error.Type, msg.Error.Message)
		}
	}
	return outcome(), nil
}

type openAIMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type openAIFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

type openAITool struct {
	Type     string         `json:"type"`
	Function openAIFunction `json:"function"`
}

type openAIRequest struct {
	Model         string          `json:"model"`
	Messages      []openAIMessage `json:"messages"`
	Tools         []openAITool    `json:"tools"`
	ToolChoice    string          `json:"tool_choice"`
	MaxTokens     int             `json:"max_tokens"`
	Stream        bool            `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// openAIBody puts the system prompt first in the messages, offers the tools
// with tool_choice "required" ("none" when the reply ends the task, see
// endsTask) and asks for the usage chunk, the only place a stream reports
// cached tokens.
func openAIBody(cfg Config, t Turn) openAIRequest {
	messages := make([]openAIMessage, 0, len(t.Messages)+1)
	messages = append(messages, openAIMessage{Role: "system", Content: t.System})
	for _, m := range t.Messages {
		messages = append(messages, openAIMessage(m))
	}
	req := openAIRequest{
		Model: t.model(cfg), Messages: messages, MaxTokens: t.MaxTokens, Stream: true,
		Tools:      []openAITool{{Type: "function", Function: openAIFunction{Name: "Bash", Description: bashDescription, Parameters: bashSchema}}},
		ToolChoice: "required",
	}
	if endsTask(t) {
		req.ToolChoice = "none"
	}
	req.StreamOptions.IncludeUsage = true
	return req
}

type openAIChunk struct {
	Object  string `json:"object"`
	Message string `json:"message"`
	Choices []struct {
		Delta struct {
			Content   string `json:"content"`
			ToolCalls []struct {
				Function struct {
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// readOpenAIStream follows chat.completion.chunk deltas (content, or a tool
// call's arguments), the finish reason, the final usage
// chunk and [DONE]. vLLM omits prompt_tokens_details when nothing was cached
// (and when the server runs without --enable-prompt-tokens-details), so an
// absent field leaves cacheReported false.
func readOpenAIStream(events *sseReader) (streamOutcome, error) {
	var text textStream
	out := streamOutcome{}
	usageSeen := false
	finish := func() streamOutcome {
		out.text, out.firstToken = text.reply(), text.firstToken
		if !usageSeen {
			out.outputTokens = text.deltas
		}
		return out
	}
	for {
		ev, err := events.next()
		if err == io.EOF {
			return finish(), errStreamTruncated
		}
		if err != nil {
			return finish(), err
		}
		if ev.data == "[DONE]" {
			return finish(), nil
		}
		var chunk openAIChunk
		if err := json.Unmarshal([]byte(ev.data), &chunk); err != nil {
			return finish(), fmt.Errorf("bad chunk: %w", err)
		}
		if chunk.Error != nil {
			return finish(), fmt.Errorf("server error: %s", chunk.Error.Message)
		}
		if chunk.Object == "error" {
			return finish(), fmt.Errorf("server error: %s", chunk.Message)
		}
		for _, c := range chunk.Choices {
			text.add(c.Delta.Content)
			for _, call := range c.Delta.ToolCalls {
				text.addArgs(call.Function.Arguments)
			}
			out.stop = cmp.Or(c.FinishReason, out.stop)
		}
		if u := chunk.Usage; u != nil {
			usageSeen = true
			out.outputTokens, out.promptTokens = u.CompletionTokens, u.PromptTokens
			if u.PromptTokensDetails != nil {
				out.cachedTokens, out.cacheReported = u.PromptTokensDetails.CachedTokens, true
			}
		}
	}
}
