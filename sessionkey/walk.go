package sessionkey

import (
	"bytes"
	"encoding/json"
)

// walkEnd says where a walk of an object's members stopped.
type walkEnd uint8

const (
	walkedAll   walkEnd = iota // at the object's closing brace
	walkCut                    // where the prefix ends
	walkInvalid                // at a byte no JSON object has there
	walkStopped                // where the visitor asked
)

// walkObject calls visit with the name and raw value of each member of the
// JSON object that (a prefix of) body holds, in order, until visit returns
// false. Values are skipped, not decoded, so a walk allocates nothing but
// the names that hold escapes, decoded. The value of the member the prefix
// cuts is passed once, with cut set and the rest of the prefix as value.
//
// Only the members' syntax is checked: within a value, strings and
// brackets are followed, no more. A request is the server's to refuse; the
// walk reads what it names, and never takes a string's contents or a nested
// member for one of the object's own.
func walkObject(body []byte, visit func(name, value []byte, cut bool) bool) walkEnd {
	i := skipSpace(body, 0)
	if i == len(body) {
		return walkCut
	}
	if body[i] != '{' {
		return walkInvalid
	}
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return walkedAll
	}
	for {
		if i == len(body) {
			return walkCut
		}
		if body[i] != '"' {
			return walkInvalid
		}
		nameEnd, ok := stringEnd(body, i)
		if !ok {
			return walkCut
		}
		name := unquote(body[i:nameEnd])
		if i = skipSpace(body, nameEnd); i == len(body) {
			return walkCut
		}
		if body[i] != ':' {
			return walkInvalid
		}
		if i = skipSpace(body, i+1); i == len(body) {
			return walkCut
		}
		end, state := valueEnd(body, i)
		switch state {
		case walkInvalid:
			return walkInvalid
		case walkCut:
			visit(name, body[i:], true)
			return walkCut
		}
		if !visit(name, body[i:end], false) {
			return walkStopped
		}
		if i = skipSpace(body, end); i == len(body) {
			return walkCut
		}
		switch body[i] {
		case ',':
			i = skipSpace(body, i+1)
		case '}':
			return walkedAll
		default:
			return walkInvalid
		}
	}
}

// memberName is a member's name from its quoted JSON string: the bytes
// between the quotes, or, when it holds escapes, the string they encode
// (a client may write "model" as "mod\u0065l"; JSON parsers read both).
func unquote(quoted []byte) []byte {
	raw := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw
	}
	var s string
	if json.Unmarshal(quoted, &s) != nil {
		return raw
	}
	return []byte(s)
}

func delimiter(c byte) bool {
	switch c {
	case ',', '}', ']', ' ', '\n', '\r', '\t':
		return true
	}
	return false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// stringEnd returns the index just past the JSON string that opens at
// b[i], and false when b ends first.
func stringEnd(b []byte, i int) (int, bool) {
	for j := i + 1; ; {
		q := bytes.IndexByte(b[j:], '"')
		if q < 0 {
			return 0, false
		}
		j += q
		escapes := 0
		for k := j - 1; k > i && b[k] == '\\'; k-- {
			escapes++
		}
		j++
		if escapes%2 == 0 {
			return j, true
		}
	}
}

// valueEnd returns the index just past the JSON value that starts at b[i],
// with walkCut when b ends first and walkInvalid when no value starts
// there.
func valueEnd(b []byte, i int) (int, walkEnd) {
	switch b[i] {
	case '"':
		end, ok := stringEnd(b, i)
		if !ok {
			return 0, walkCut
		}
		return end, walkedAll
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end, ok := stringEnd(b, j)
				if !ok {
					return 0, walkCut
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1, walkedAll
				}
			}
		}
		return 0, walkCut
	case ',', ':', '}', ']':
		return 0, walkInvalid
	}
	// A number, true, false or null: it runs to a delimiter, and a prefix
	// that ends within it may cut it.
	j := i
	for j < len(b) && !delimiter(b[j]) {
		j++
	}
	if j == len(b) {
		return 0, walkCut
	}
	return j, walkedAll
}

// Model reads the model a JSON request body names: the top-level "model"
// string of an Anthropic Messages, Chat Completions or Responses request.
// The first "model" member counts (a body with two is the server's to
// refuse or read). It allocates nothing unless the name or a member's name
// holds escapes. more reports that (a prefix of) body ends before the model
// or the object's end: more of the body may name it.
func Model(prefix []byte) (model []byte, more bool) {
	end := walkObject(prefix, func(name, value []byte, cut bool) bool {
		if string(name) != "model" {
			return true
		}
		if !cut && len(value) >= 2 && value[0] == '"' {
			model = unquote(value)
		}
		return false
	})
	return model, end == walkCut && model == nil
}
