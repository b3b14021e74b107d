// Package replyend reads, from a model server's reply as it streams, whether
// the reply ended the agent's task: a coding agent calls tools turn after
// turn, and its last reply of a task is text, after which its next request
// waits for a person. Load control frees such a conversation's room at once
// instead of keeping it for the agent's next tool turn.
//
// The three APIs agents use say it differently: Anthropic's Messages with
// stop_reason "end_turn" (not "tool_use"), OpenAI's chat completions with
// finish_reason "stop" (not "tool_calls"), OpenAI's Responses (Codex) with a
// response whose status is "completed" and whose output holds no item of a
// type ending in "_call" (function_call, custom_tool_call, ...).
//
// The scanner matches these fields in the raw bytes, streamed (SSE) or not,
// without decoding the JSON: replies are large and streamed in small
// pieces, and the fields are the only thing read. A field's name inside a
// string (a model writing about these APIs) is escaped (\"stop_reason\")
// and never matches.
package replyend

import "bytes"

// field is what a matched key says of the task.
type field uint8

const (
	reasonField field = iota // stop_reason, finish_reason
	typeField                // a Responses output item's type, among others
	statusField              // a Responses reply's status, or its items'
)

var keys = [...]struct {
	name []byte
	field
}{
	{[]byte(`"stop_reason"`), reasonField},
	{[]byte(`"finish_reason"`), reasonField},
	{[]byte(`"type"`), typeField},
	{[]byte(`"status"`), statusField},
}

// maxValue bounds a reason's length and maxSpace the blanks around its
// colon: a field past them is ignored, so that what the scanner keeps
// between writes stays small whatever the reply holds.
const (
	maxValue = 32
	maxSpace = 16
)

// keepBytes is how much of a write the next one is scanned with when no
// field was cut: less than the longest key.
const keepBytes = len(`"finish_reason"`) - 1

// Scanner watches a reply's bytes. The zero value is ready to use; it is
// not safe for concurrent use.
type Scanner struct {
	tail, scratch []byte
	// ended: a reason that ends the task; other: one that does not (a
	// tool call, max_tokens); completed and toolItem: a Responses reply
	// completed, and an output item that calls a tool.
	ended, other, completed, toolItem bool
}

// Write feeds the scanner the reply's next bytes. It never fails.
func (s *Scanner) Write(p []byte) (int, error) {
	buf := p
	if len(s.tail) > 0 {
		s.scratch = append(append(s.scratch[:0], s.tail...), p...)
		buf = s.scratch
	}
	keep := s.scan(buf)
	if keep < 0 {
		keep = max(0, len(buf)-keepBytes)
	}
	s.tail = append(s.tail[:0], buf[keep:]...)
	return len(p), nil
}

// TaskEnded reports whether the reply, as far as it was fed, ended the
// task: it gave a reason and every reason it gave ended the task (a reply
// with several choices ends it only if none called a tool or was cut at
// max_tokens), or it is a completed Responses reply with no tool call.
func (s *Scanner) TaskEnded() bool {
	return (s.ended || s.completed) && !s.other && !s.toolItem
}

// scan records the reasons in buf and returns where a field cut by the end
// of buf starts, or -1.
func (s *Scanner) scan(buf []byte) int {
	// next[j] is where keys[j] next occurs at or after i (-1: nowhere), so
	// that each key's search goes through buf once.
	var next [len(keys)]int
	for j := range next {
		next[j] = -2
	}
	for i := 0; i < len(buf); {
		at, k := -1, 0
		for j, key := range keys {
			if next[j] != -1 && next[j] < i {
				if n := bytes.Index(buf[i:], key.name); n >= 0 {
					next[j] = i + n
				} else {
					next[j] = -1
				}
			}
			if next[j] >= 0 && (at < 0 || next[j] < at) {
				at, k = next[j], j
			}
		}
		if at < 0 {
			return -1
		}
		end := at + len(keys[k].name)
		value, n, cut := reason(buf[end:])
		if cut {
			return at
		}
		s.note(keys[k].field, value)
		i = end + n
	}
	return -1
}

// note records what a field's value says of the task.
func (s *Scanner) note(f field, value []byte) {
	switch {
	case len(value) == 0:
	case f == typeField:
		s.toolItem = s.toolItem || bytes.HasSuffix(value, []byte("_call"))
	case f == statusField:
		s.completed = s.completed || string(value) == "completed"
	case string(value) == "end_turn" || string(value) == "stop":
		s.ended = true
	default:
		s.other = true
	}
}

// reason reads `: "value"` or `: null` at the start of b: the value (nil
// for null or anything else), how many bytes it took, and whether b ends
// before the value does.
func reason(b []byte) (value []byte, n int, cut bool) {
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
	if !ok || b[i] != '"' {
		return nil, i, false // null, or not a reason
	}
	end := bytes.IndexByte(b[i+1:min(len(b), i+2+maxValue)], '"')
	switch {
	case end >= 0:
		return b[i+1 : i+1+end], i + 2 + end, false
	case len(b)-i-1 <= maxValue:
		return nil, 0, true
	}
	return nil, i + 1, false // too long to be a reason
}

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
