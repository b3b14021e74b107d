// Package replyend reads, from a model server's reply as it streams, whether
// the reply ended the agent's task, and the prompt's size and cached part
// the server reported. A coding agent calls tools turn after turn, and its
// last reply of a task is text, after which its next request waits for a
// person: load control frees such a conversation's room at once instead of
// keeping it for the agent's next tool turn. The token counts are the
// server's own tokenizer's: load control sizes conversations by them
// rather than by a guess from the request's bytes.
//
// The three APIs agents use say it differently: Anthropic's Messages with
// stop_reason "end_turn" (not "tool_use"), OpenAI's chat completions with
// finish_reason "stop" (not "tool_calls") and no tool_calls listed, OpenAI's
// Responses (Codex) with a response whose status is "completed" and whose
// output holds no item of a type ending in "_call" (function_call,
// custom_tool_call, ...).
//
// Usage says the same three ways too: Anthropic's input_tokens count only
// the uncached part when cache_read_input_tokens (and
// cache_creation_input_tokens) are given, OpenAI's prompt_tokens and the
// Responses API's input_tokens the whole prompt, with the cached part in
// prompt_tokens_details.cached_tokens or input_tokens_details.cached_tokens.
// vLLM reports the cached part only when started with
// --enable-prompt-tokens-details, and leaves it out when it is 0. The
// reply's size is output_tokens (Anthropic, Responses) or
// completion_tokens (OpenAI); a stream repeats it, its last count is the
// whole.
//
// The scanner matches these fields in the raw bytes, streamed (SSE) or not,
// without decoding the JSON: replies are large and streamed in small
// pieces, and the fields are the only thing read. A field's name inside a
// string (a model writing about these APIs) is escaped (\"stop_reason\")
// and never matches. A tool call's input in a whole (not streamed)
// Anthropic reply is an object whose keys are read like the reply's own,
// but the reply's stop_reason and usage come after its content and have
// the last word.
package replyend

import (
	"bytes"
	"slices"
	"strconv"
)

// field is what a matched key gives: a reason, a type, a status or a count.
type field uint8

const (
	reasonField    field = iota // stop_reason, finish_reason
	typeField                   // a Responses output item's type, among others
	statusField                 // a Responses reply's status, or its items'
	toolCallsField              // a chat completions message's (or delta's) tool calls
	// Token counts.
	promptField        // prompt_tokens: the whole prompt (OpenAI)
	inputField         // input_tokens: the whole prompt, or its uncached part (Anthropic)
	cachedField        // cached_tokens: the cached part (OpenAI, Responses)
	cacheReadField     // cache_read_input_tokens: the cached part (Anthropic)
	cacheCreationField // cache_creation_input_tokens: part of the prompt (Anthropic)
	outputField        // output_tokens, completion_tokens: the reply's size
	fields
)

var keys = [...]struct {
	name []byte
	field
}{
	{[]byte(`"stop_reason"`), reasonField},
	{[]byte(`"finish_reason"`), reasonField},
	{[]byte(`"type"`), typeField},
	{[]byte(`"status"`), statusField},
	{[]byte(`"tool_calls"`), toolCallsField},
	{[]byte(`"prompt_tokens"`), promptField},
	{[]byte(`"input_tokens"`), inputField},
	{[]byte(`"cached_tokens"`), cachedField},
	{[]byte(`"cache_read_input_tokens"`), cacheReadField},
	{[]byte(`"cache_creation_input_tokens"`), cacheCreationField},
	{[]byte(`"output_tokens"`), outputField},
	{[]byte(`"completion_tokens"`), outputField},
}

// maxValue bounds a value's length and maxSpace the blanks around its
// colon: a field past them is ignored, so that what the scanner keeps
// between writes stays small whatever the reply holds.
const (
	maxValue = 32
	maxSpace = 16
)

// maxCount caps a token count, so that the sums of counts cannot overflow
// whatever a reply claims.
const maxCount = 1 << 40

// Scanner watches a reply's bytes. The zero value is ready to use; it is
// not safe for concurrent use.
type Scanner struct {
	tail, scratch []byte
	// ended: a reason that ends the task; other: one that does not (a
	// tool call, max_tokens); completed: a Responses reply completed;
	// toolItem: a tool called (a Responses call item, an Anthropic
	// tool_use block, chat completions' tool_calls).
	ended, other, completed, toolItem bool
	// count holds the last value of each token count, seen tells which
	// were given: a stream may repeat them (message_start, message_delta).
	count [fields]int
	seen  [fields]bool
}

// Write feeds the scanner the reply's next bytes. It never fails.
func (s *Scanner) Write(p []byte) (int, error) {
	buf := p
	if len(s.tail) > 0 {
		s.scratch = append(append(s.scratch[:0], s.tail...), p...)
		buf = s.scratch
	}
	s.tail = s.tail[:0]
	if keep := s.scan(buf); keep >= 0 {
		s.tail = append(s.tail, buf[keep:]...)
	}
	return len(p), nil
}

// TaskEnded reports whether the reply, as far as it was fed, ended the
// task: it gave a reason and every reason it gave ended the task (a reply
// with several choices ends it only if none called a tool or was cut at
// max_tokens), or it is a completed Responses reply with no tool call.
func (s *Scanner) TaskEnded() bool {
	return (s.ended || s.completed) && !s.other && !s.toolItem
}

// Usage is the prompt's size and cached part the reply reported, in the
// server's tokens. Prompt is 0 when the reply gave no usage (an OpenAI
// stream without stream_options.include_usage, a reply cut short);
// CacheReported is false when it gave no cached part.
type Usage struct {
	PromptTokens, CachedTokens int
	CacheReported              bool
	// OutputTokens is the reply's size (0 when not given).
	OutputTokens int
}

// Usage reports the usage the reply gave, as far as it was fed.
func (s *Scanner) Usage() Usage {
	var u Usage
	switch {
	case s.seen[promptField]:
		u.PromptTokens = s.count[promptField]
	case s.seen[inputField]:
		u.PromptTokens = s.count[inputField] + s.count[cacheReadField] + s.count[cacheCreationField]
	}
	switch {
	case s.seen[cachedField]:
		u.CachedTokens, u.CacheReported = s.count[cachedField], true
	case s.seen[cacheReadField]:
		u.CachedTokens, u.CacheReported = s.count[cacheReadField], true
	}
	u.OutputTokens = s.count[outputField]
	return u
}

// scan records the fields in buf and returns where a field cut by the end
// of buf starts, or -1. It goes through buf once, looking at each quote for
// a key that starts there.
func (s *Scanner) scan(buf []byte) int {
	for i := 0; i < len(buf); {
		q := bytes.IndexByte(buf[i:], '"')
		if q < 0 {
			return -1
		}
		at := i + q
		k := keyAt(buf[at:])
		switch k {
		case cutKey:
			return at
		case noKey:
			i = at + 1
			continue
		}
		end := at + len(keys[k].name)
		value, n, cut := valueAt(buf[end:])
		if cut {
			return at
		}
		s.note(keys[k].field, value, n > 0 && buf[end+n-1] == '"')
		i = end + n
	}
	return -1
}

// What keyAt finds besides a key's index.
const (
	noKey  = -1 // b starts no key
	cutKey = -2 // b ends inside a key it may start
)

// keyAt is the index in keys of the key b starts with.
func keyAt(b []byte) int {
	if len(b) > 1 && !secondBytes[b[1]] {
		return noKey // most quotes: decided at one byte
	}
	k := noKey
	for j, key := range keys {
		switch {
		case len(b) >= len(key.name):
			if bytes.Equal(b[:len(key.name)], key.name) {
				return j
			}
		case bytes.HasPrefix(key.name, b):
			k = cutKey
		}
	}
	return k
}

// secondBytes marks the bytes that follow the quote of some key.
var secondBytes = func() (m [256]bool) {
	for _, key := range keys {
		m[key.name[1]] = true
	}
	return m
}()

// note records what a field's value (quoted: a string) says of the task,
// or the count it gives.
func (s *Scanner) note(f field, value []byte, quoted bool) {
	switch {
	case len(value) == 0:
	case f == toolCallsField:
		// A chat completions reply lists its calls whatever its
		// finish_reason, which is "stop" when the request forced the tool;
		// vLLM lists none as [].
		s.toolItem = s.toolItem || value[0] != ']'
	case f >= promptField:
		if n, err := strconv.Atoi(string(value)); err == nil && !quoted {
			s.count[f], s.seen[f] = min(n, maxCount), true
		}
	case !quoted: // a reason, type or status is a string
	case f == typeField:
		// A Responses call item, or an Anthropic tool_use block (which
		// vLLM may close with end_turn when the request forced that tool).
		s.toolItem = s.toolItem || bytes.HasSuffix(value, []byte("_call")) || string(value) == "tool_use"
	case f == statusField:
		switch string(value) {
		case "completed":
			s.completed = true
		case "incomplete", "failed", "cancelled": // the reply's own, after its items'
			s.other = true
		}
	case string(value) == "end_turn" || string(value) == "stop":
		s.ended = true
	case slices.Contains(continuingReasons, string(value)):
		s.other = true
	}
}

// continuingReasons are the reasons a reply stops without ending the
// agent's task: a tool call, a cut, a refusal. Any other string in a
// reason field is ignored: vLLM's chat completions also give, as
// stop_reason, the stop string a client's request matched.
var continuingReasons = []string{
	"tool_use", "max_tokens", "stop_sequence", "pause_turn", "refusal", // Anthropic
	"tool_calls", "function_call", "length", "content_filter", "abort", "error", // OpenAI, vLLM
}

// valueAt reads `: "value"`, `: 123`, `: [` or `: null` at the start of b:
// the string's or the number's bytes, an array's first byte inside it (nil
// for null or anything else), how many bytes it took, and whether b ends
// before the value does.
func valueAt(b []byte) (value []byte, n int, cut bool) {
	i, ok := skipSpace(b, 0)
	if ok && i == len(b) {
		return nil, 0, true
	}
	if !ok || b[i] != ':' {
		return nil, i, false
	}
	i, ok = skipSpace(b, i+1)
	if ok && i == len(b) {
		return nil, 0, true
	}
	if ok && isDigit(b[i]) {
		return number(b, i)
	}
	if ok && b[i] == '[' {
		// An array: its first element's first byte, or ']', left unread
		// for the keys inside it to be scanned.
		j, ok := skipSpace(b, i+1)
		if ok && j == len(b) {
			return nil, 0, true
		}
		if !ok {
			return nil, j, false
		}
		return b[j : j+1], j, false
	}
	if !ok || b[i] != '"' {
		return nil, i, false // null, or not a value read
	}
	end := bytes.IndexByte(b[i+1:min(len(b), i+2+maxValue)], '"')
	switch {
	case end >= 0:
		return b[i+1 : i+1+end], i + 2 + end, false
	case len(b)-i-1 <= maxValue:
		return nil, 0, true
	}
	return nil, i + 1, false // too long to be a value read
}

// number reads the digits from b[i]: a count ends with the first
// non-digit, so digits up to the end of b may go on in the next write.
func number(b []byte, i int) (value []byte, n int, cut bool) {
	end := i
	for end < len(b) && end-i <= maxValue && isDigit(b[end]) {
		end++
	}
	switch {
	case end-i > maxValue:
		return nil, end, false // too long to be a count
	case end == len(b):
		return nil, 0, true
	}
	return b[i:end], end, false
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// skipSpace skips up to maxSpace blanks from i; ok is false past that.
func skipSpace(b []byte, i int) (int, bool) {
	for n := 0; i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r'); n++ {
		if n == maxSpace {
			return i, false
		}
		i++
	}
	return i, true
}
