package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/tokenizer"
)

// chatRequest is a request of either API reduced to what the simulator needs.
type chatRequest struct {
	model        string
	system       string
	messages     []tokenizer.Message
	maxTokens    *int
	stream       bool
	includeUsage bool
	choice       toolChoice
	call         toolCall // the call a forced reply makes
}

// contentBlock is one part of a message's content in either API (text, tool_use,
// tool_result, image...). Fields that move between turns, such as cache_control, are ignored
// so that a resent history renders the same.
type contentBlock struct {
	Type    string          `json:"type"`
	Text    string          `json:"text"`
	Name    string          `json:"name"`
	Input   json.RawMessage `json:"input"`
	Content json.RawMessage `json:"content"`
}

// billingHeaderPrefix marks the system block in which Claude Code sends a per-request hash;
// vLLM drops it because it would defeat prefix caching.
const billingHeaderPrefix = "x-anthropic-billing-header"

// contentText flattens message content (a string, null, or a list of blocks) into the text the
// chat template renders, blocks joined by newlines as vLLM does.
func contentText(raw json.RawMessage, dropBillingHeader bool) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var blocks []contentBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", errors.New("content must be a string or a list of content blocks")
	}
	parts := make([]string, 0, len(blocks))
	for _, b := range blocks {
		switch b.Type {
		case "text", "input_text", "output_text": // the last two: Responses API parts
			if dropBillingHeader && strings.HasPrefix(b.Text, billingHeaderPrefix) {
				continue
			}
			parts = append(parts, b.Text)
		case "tool_use":
			parts = append(parts, b.Name+" "+compactJSON(b.Input))
		case "tool_result":
			text, err := contentText(b.Content, false)
			if err != nil {
				return "", err
			}
			parts = append(parts, text)
		case "thinking", "redacted_thinking":
			// Earlier reasoning is not rendered back into the prompt.
		default:
			parts = append(parts, "["+b.Type+"]")
		}
	}
	return tokenizer.JoinParts(parts), nil
}

func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}

// withTools appends tool definitions to the system prompt, where chat templates render them.
func withTools(system string, tools json.RawMessage) string {
	t := compactJSON(tools)
	if t == "" || t == "null" || t == "[]" {
		return system
	}
	return system + "\n\n# Tools\n" + t
}

type anthropicRequest struct {
	Model    string          `json:"model"`
	System   json.RawMessage `json:"system"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	MaxTokens  *int            `json:"max_tokens"`
	Stream     bool            `json:"stream"`
	Tools      json.RawMessage `json:"tools"`
	ToolChoice json.RawMessage `json:"tool_choice"`
}

// parseAnthropic reads a POST /v1/messages body: system as a string or text blocks, message
// content as a string or blocks. metadata and other fields are accepted and ignored.
func parseAnthropic(body []byte) (chatRequest, error) {
	return parseAnthropicRequest(body, true)
}

// parseAnthropicCount reads a POST /v1/messages/count_tokens body: a messages request
// without max_tokens.
func parseAnthropicCount(body []byte) (chatRequest, error) {
	return parseAnthropicRequest(body, false)
}

func parseAnthropicRequest(body []byte, generates bool) (chatRequest, error) {
	var in anthropicRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return chatRequest{}, fmt.Errorf("invalid JSON body: %w", err)
	}
	if generates && in.MaxTokens == nil {
		return chatRequest{}, errors.New("max_tokens: field required")
	}
	if len(in.Messages) == 0 {
		return chatRequest{}, errors.New("messages: at least one message is required")
	}
	system, err := contentText(in.System, true)
	if err != nil {
		return chatRequest{}, fmt.Errorf("system: %w", err)
	}
	out := chatRequest{model: in.Model, system: withTools(system, in.Tools), maxTokens: in.MaxTokens, stream: in.Stream}
	if out.choice, out.call, err = parseToolChoice(in.ToolChoice, in.Tools); err != nil {
		return chatRequest{}, err
	}
	for i, m := range in.Messages {
		text, err := contentText(m.Content, false)
		if err != nil {
			return chatRequest{}, fmt.Errorf("messages[%d]: %w", i, err)
		}
		out.messages = append(out.messages, tokenizer.Message{Role: m.Role, Content: text})
	}
	return out, nil
}

type openAIRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role      string          `json:"role"`
		Content   json.RawMessage `json:"content"`
		ToolCalls []struct {
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"messages"`
	MaxTokens           *int `json:"max_tokens"`
	MaxCompletionTokens *int `json:"max_completion_tokens"`
	Stream              bool `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Tools      json.RawMessage `json:"tools"`
	ToolChoice json.RawMessage `json:"tool_choice"`
}

// parseOpenAI reads a POST /v1/chat/completions body. A system (or developer) message renders
// as the system turn; tool definitions join it as in parseAnthropic.
func parseOpenAI(body []byte) (chatRequest, error) {
	var in openAIRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return chatRequest{}, fmt.Errorf("invalid JSON body: %w", err)
	}
	if len(in.Messages) == 0 {
		return chatRequest{}, errors.New("messages: at least one message is required")
	}
	out := chatRequest{model: in.Model, maxTokens: in.MaxCompletionTokens, stream: in.Stream}
	var err error
	if out.choice, out.call, err = parseToolChoice(in.ToolChoice, in.Tools); err != nil {
		return chatRequest{}, err
	}
	if out.maxTokens == nil {
		out.maxTokens = in.MaxTokens
	}
	out.includeUsage = in.StreamOptions != nil && in.StreamOptions.IncludeUsage
	for i, m := range in.Messages {
		text, err := contentText(m.Content, false)
		if err != nil {
			return chatRequest{}, fmt.Errorf("messages[%d]: %w", i, err)
		}
		for _, call := range m.ToolCalls {
			text = tokenizer.JoinParts([]string{text, call.Function.Name + " " + call.Function.Arguments})
		}
		role := m.Role
		if role == "developer" {
			role = "system"
		}
		out.messages = append(out.messages, tokenizer.Message{Role: role, Content: text})
	}
	if tools := withTools("", in.Tools); tools != "" {
		if out.messages[0].Role == "system" {
			out.messages[0].Content = withTools(out.messages[0].Content, in.Tools)
		} else {
			out.messages = append([]tokenizer.Message{{Role: "system", Content: tools}}, out.messages...)
		}
	}
	return out, nil
}

// PromptTokens returns the prompt token ids the simulator computes for a
// request body sent to path (/v1/messages, /v1/chat/completions or /v1/responses), for
// clients that need the exact token stream, such as the benchmark's hit bound.
func PromptTokens(path string, body []byte) ([]uint32, error) {
	parse := parseOpenAI
	switch {
	case strings.HasSuffix(path, "/messages"):
		parse = parseAnthropic
	case strings.HasSuffix(path, "/responses"):
		parse = parseResponses
	}
	req, err := parse(body)
	if err != nil {
		return nil, err
	}
	return tokenizer.ChatTokens(req.system, req.messages), nil
}
