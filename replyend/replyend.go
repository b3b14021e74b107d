// Package replyend reads, from a model server's reply as it streams, whether
// the reply ended the agent's task: a coding agent calls tools turn after
// turn, and its last reply of a task is text (Anthropic's stop_reason
// "end_turn", OpenAI's finish_reason "stop"), after which its next request
// waits for a person. Load control frees such a conversation's room at once
// instead of keeping it for the agent's next tool turn.
//
// The scanner matches the two fields in the raw bytes, streamed (SSE) or
// not, without decoding the JSON: replies are large and streamed in small
// pieces, and the fields are the only thing read. A field's name inside a
// string (a model writing about these APIs) is escaped (\"stop_reason\")
// and never matches.
package replyend

import "bytes"

var keys = [...][]byte{[]byte(`"stop_reason"`), []byte(`"finish_reason"`)}

// maxValue bounds a reason's length and maxSpace the blanks around its
// colon: a field past them is ignored, so that what the scanner keeps
// between writes stays small whatever the reply holds.
const (
	maxValue = 32
	maxSpace = 16
)

// keepBytes is how much of a write the next one is scanned with when no
// field was cut: enough for the longest key.
const keepBytes = len(`"finish_reason"`) - 1

// Scanner watches a reply's bytes. The zero value is ready to use; it is
// not safe for concurrent use.
type Scanner struct {
	tail, scratch []byte
	ended, other  bool
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

// TaskEnded reports whether the reply, as far as it was fed, gave a reason
// and every reason it gave ended the task (a reply with several choices
// ends it only if none called a tool or was cut at max_tokens).
func (s *Scanner) TaskEnded() bool { return s.ended && !s.other }

// scan records the reasons in buf and returns where a field cut by the end
// of buf starts, or -1.
func (s *Scanner) scan(buf []byte) int {
	for i := 0; i < len(buf); {
		at, key := -1, []byte(nil)
		for _, k := range keys {
			if j := bytes.Index(buf[i:], k); j >= 0 && (at < 0 || i+j < at) {
				at, key = i+j, k
			}
		}
		if at < 0 {
			return -1
		}
		value, next, cut := reason(buf[at+len(key):])
		if cut {
			return at
		}
		switch string(value) {
		case "":
		case "end_turn", "stop":
			s.ended = true
		default:
			s.other = true
		}
		i = at + len(key) + next
	}
	return -1
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
