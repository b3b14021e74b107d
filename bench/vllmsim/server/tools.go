package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// toolChoice is what a request's tool_choice makes the model do. The simulator has no
// model to decide between text and a tool call, so only a request that decides for it gets
// one: forced, the reply is a tool call; forbidden, it is text the model ended. With
// --output-len max the reply's length (max_tokens) stands in for the model's own choice of
// where to stop, so such a reply finishes with stop, not length.
type toolChoice uint8

const (
	choiceAuto toolChoice = iota // absent or "auto": text, ending as --output-len says
	choiceTool                   // a tool call is forced
	choiceNone                   // no tool may be called
)

// toolCall is the call a forced reply makes: the tool's name and the argument that holds
// the reply's text.
type toolCall struct {
	name, arg string
}

// toolDef is a tool definition in either API: OpenAI nests it under "function" with
// "parameters", Anthropic has "name" and "input_schema" at the top.
type toolDef struct {
	Name        string          `json:"name"`
	InputSchema json.RawMessage `json:"input_schema"`
	Parameters  json.RawMessage `json:"parameters"`
	Function    *struct {
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// toolChoiceWire is tool_choice in either API: a string ("auto", "none", "required") or an
// object (OpenAI {"type":"function","function":{"name":...}}; Anthropic {"type":"auto"|"any"|
// "none"|"tool","name":...}).
type toolChoiceWire struct {
	Type     string `json:"type"`
	Name     string `json:"name"`
	Function *struct {
		Name string `json:"name"`
	} `json:"function"`
}

// parseToolChoice reads tool_choice against the request's tools and returns what the reply
// must be and, when forced, the call it makes (the named tool, else the first).
func parseToolChoice(raw, tools json.RawMessage) (toolChoice, toolCall, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return choiceAuto, toolCall{}, nil
	}
	var kind, name string
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &kind); err != nil {
			return 0, toolCall{}, fmt.Errorf("tool_choice: %w", err)
		}
	} else {
		var c toolChoiceWire
		if err := json.Unmarshal(raw, &c); err != nil {
			return 0, toolCall{}, fmt.Errorf("tool_choice: %w", err)
		}
		kind, name = c.Type, c.Name
		if c.Function != nil {
			name = c.Function.Name
		}
	}
	switch kind {
	case "auto":
		return choiceAuto, toolCall{}, nil
	case "none":
		return choiceNone, toolCall{}, nil
	case "required", "any", "function", "tool":
	default:
		return 0, toolCall{}, fmt.Errorf("tool_choice: unknown value %q", kind)
	}
	var defs []toolDef
	if len(bytes.TrimSpace(tools)) > 0 && json.Unmarshal(tools, &defs) != nil {
		return 0, toolCall{}, errors.New("tools must be a list of tool definitions")
	}
	if len(defs) == 0 {
		return 0, toolCall{}, errors.New("When using `tool_choice`, `tools` must be set.")
	}
	for _, d := range defs {
		n, schema := d.Name, cmpOrRaw(d.InputSchema, d.Parameters)
		if d.Function != nil {
			n, schema = d.Function.Name, d.Function.Parameters
		}
		if name == "" || n == name {
			return choiceTool, toolCall{name: n, arg: firstRequired(schema)}, nil
		}
	}
	return 0, toolCall{}, fmt.Errorf("tool_choice: tool %q is not among the tools", name)
}

func cmpOrRaw(a, b json.RawMessage) json.RawMessage {
	if len(a) > 0 {
		return a
	}
	return b
}

// firstRequired names the argument a forced call fills: the schema's first required
// property, else "input".
func firstRequired(schema json.RawMessage) string {
	var s struct {
		Required []string `json:"required"`
	}
	if json.Unmarshal(schema, &s) == nil && len(s.Required) > 0 {
		return s.Required[0]
	}
	return "input"
}

// toolArgs writes a forced call's arguments, {"<arg>":"<reply text>"}, one token's text at
// a time, so that a streamed call has a delta per token as a text reply has and its
// deltas join into valid JSON.
type toolArgs struct {
	arg  string
	open bool
}

func (a *toolArgs) piece(text string, last bool) string {
	var b strings.Builder
	if !a.open {
		b.WriteString("{")
		b.Write(quote(a.arg))
		b.WriteString(`:"`)
		a.open = true
	}
	q := quote(text)
	b.Write(q[1 : len(q)-1])
	if last {
		b.WriteString(`"}`)
	}
	return b.String()
}

// whole returns the arguments of a call whose text is complete.
func (a toolArgs) whole(text string) string {
	a.open = false
	return a.piece(text, true)
}
