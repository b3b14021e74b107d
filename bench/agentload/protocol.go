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

// Claude Code's sub-agent and compaction hint headers. A sub-agent that
// another sub-agent spawned would also send X-Claude-Code-Parent-Agent-Id;
// the load generator's sub-agents are all spawned by the session's main
// agent, so they send none.
const (
	AgentHeader      = "X-Claude-Code-Agent-Id"
	CompactionHeader = "X-Claude-Code-Compaction"
	CompactedHeader  = "X-Claude-Code-Context-Compacted"
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
}

// textStream gathers the deltas common to both protocols.
type textStream struct {
	text       strings.Builder
	firstToken time.Time
	deltas     int
}

func (t *textStream) add(delta string) {
	if delta == "" {
		return
	}
	if t.firstToken.IsZero() {
		t.firstToken = time.Now()
	}
	t.text.WriteString(delta)
	t.deltas++
}

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

type anthropicRequest struct {
	Model     string             `json:"model"`
	MaxTokens int                `json:"max_tokens"`
	System    []anthropicBlock   `json:"system"`
	Messages  []anthropicMessage `json:"messages"`
	Metadata  *anthropicMetadata `json:"metadata,omitempty"`
	Stream    bool               `json:"stream"`
}

type anthropicMetadata struct {
	UserID string `json:"user_id"`
}

// anthropicBody shapes a turn as Claude Code does: system and content as
// lists of text blocks, identity in metadata.user_id (none without an ID).
func anthropicBody(cfg Config, s *Session, t Turn) anthropicRequest {
	messages := make([]anthropicMessage, len(t.Messages))
	for i, m := range t.Messages {
		messages[i] = anthropicMessage{Role: m.Role, Content: []anthropicBlock{{Type: "text", Text: m.Content}}}
	}
	req := anthropicRequest{
		Model:     cfg.Model,
		MaxTokens: t.MaxTokens,
		System:    []anthropicBlock{{Type: "text", Text: t.System}},
		Messages:  messages,
		Stream:    true,
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
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"delta"`
	Usage *anthropicUsage `json:"usage"`
	Error *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// readAnthropicStream follows message_start, content_block_delta (text_delta),
// message_delta (usage) and message_stop.
func readAnthropicStream(events *sseReader) (streamOutcome, error) {
	var text textStream
	// Latest value of each field: message_start carries the input side,
	// message_delta the final output count (message_start's is a placeholder).
	var input, cacheRead, cacheCreation, output *int
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
		out := streamOutcome{text: text.text.String(), firstToken: text.firstToken, outputTokens: text.deltas}
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
			if msg.Delta != nil && msg.Delta.Type == "text_delta" {
				text.add(msg.Delta.Text)
			}
		case "message_delta":
			merge(msg.Usage, true)
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

type openAIRequest struct {
	Model         string          `json:"model"`
	Messages      []openAIMessage `json:"messages"`
	MaxTokens     int             `json:"max_tokens"`
	Stream        bool            `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// openAIBody puts the system prompt first in the messages and asks for the
// usage chunk, the only place a stream reports cached tokens.
func openAIBody(cfg Config, t Turn) openAIRequest {
	messages := make([]openAIMessage, 0, len(t.Messages)+1)
	messages = append(messages, openAIMessage{Role: "system", Content: t.System})
	for _, m := range t.Messages {
		messages = append(messages, openAIMessage(m))
	}
	req := openAIRequest{Model: cfg.Model, Messages: messages, MaxTokens: t.MaxTokens, Stream: true}
	req.StreamOptions.IncludeUsage = true
	return req
}

type openAIChunk struct {
	Object  string `json:"object"`
	Message string `json:"message"`
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
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

// readOpenAIStream follows chat.completion.chunk deltas, the final usage
// chunk and [DONE]. vLLM omits prompt_tokens_details when nothing was cached
// (and when the server runs without --enable-prompt-tokens-details), so an
// absent field leaves cacheReported false.
func readOpenAIStream(events *sseReader) (streamOutcome, error) {
	var text textStream
	out := streamOutcome{}
	usageSeen := false
	finish := func() streamOutcome {
		out.text, out.firstToken = text.text.String(), text.firstToken
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
