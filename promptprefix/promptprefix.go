// Package promptprefix reads from a chat request's JSON body the part a chat
// template renders before the conversation's own messages: the system prompt
// and the tool definitions. Every conversation of one agent shares that part
// and a prefix cache (vLLM's) holds it once, so load control counts its size
// once per replica when the server does not report cached tokens.
package promptprefix

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Part is one part of what a chat template renders first (a system
// prompt block, a tool): Hash covers the parts up to and including this
// one, Bytes is the request body bytes they take.
type Part struct {
	Hash  uint64
	Bytes int
}

// Prefix is a request's prefix parts in the order the template renders them
// (Read).
type Prefix []Part

// SharedBytes is how many body bytes of p's parts q's share, comparing the
// chained hashes from the first part on.
func (p Prefix) SharedBytes(q Prefix) int {
	shared := 0
	for i := range min(len(p), len(q)) {
		if p[i].Hash != q[i].Hash {
			break
		}
		shared = p[i].Bytes
	}
	return shared
}

// Where prefix parts come from, in the order the template renders them. A
// body is in practice only one API's shape; should it hold several of these
// fields, they are taken in this order.
const (
	fromSystem       = iota // Anthropic Messages: system (a string, or one part per block)
	fromInstructions        // Responses: instructions
	fromInput               // Responses: leading system and developer input items
	fromMessages            // Chat Completions: leading system and developer messages
	fromTools               // any of them: one part per tool
	numSources
)

// span is a value's bytes in the body, [start, end); rendered, when set, is
// what of it the template renders, which alone names the part.
type span struct {
	start, end int
	rendered   []byte
}

// Read returns body's prefix parts: Anthropic's system (a string is one part,
// an array one part per block), Responses' instructions, the leading run of
// system and developer items of Responses' input or Chat Completions'
// messages (one part each), then one part per tool. A part is named by its
// raw JSON as the body has it, but a message by its role and content only:
// Codex gives each input item an id of its own, which the template does not
// render and two conversations never share. Top-level keys may come in any
// order; of a repeated key the last counts, as in the JSON parsers servers
// use.
//
// Read returns nil when body has no prefix parts, and whenever it is not
// exactly one complete, valid JSON object (garbage, a truncated body,
// trailing data) or one of those fields has another type than above (null
// counts as absent): such a request is refused by the server, and parts read
// before the problem would not be a prefix of what the template renders when
// the fields come in another order. A system block or a tool must be an
// object, and a source may hold at most maxParts of them; a run of leading
// system messages ends at maxParts.
func Read(body []byte) Prefix {
	var parts [numSources][]span
	if !scan(body, &parts) {
		return nil
	}
	return chain(body, &parts)
}

// scan walks the top-level fields of body, recording the spans of the prefix
// parts; it reports false when body is not a valid object as Read requires.
func scan(body []byte, parts *[numSources][]span) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		var ok bool
		switch tok {
		case "system":
			parts[fromSystem], ok = readParts(dec, body, true, true)
		case "instructions":
			parts[fromInstructions], ok = readParts(dec, body, true, false)
		case "input":
			parts[fromInput], ok = readLeading(dec, body, true)
		case "messages":
			parts[fromMessages], ok = readLeading(dec, body, false)
		case "tools":
			parts[fromTools], ok = readParts(dec, body, false, true)
		default:
			ok = skip(dec)
		}
		if !ok {
			return false
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return false
	}
	_, err := dec.Token()
	return err == io.EOF
}

// maxParts bounds the parts of one source: a hostile body of a million
// tools costs its parse, but neither the memory of a million parts nor,
// in load control's comparisons, the time. Agents declare tens of tools;
// with many MCP servers, a few hundred.
const maxParts = 512

// readParts reads the value dec is at: a string as one part when
// stringOK, an array of objects (blocks, tools) as one part per item when
// arrayOK, null as none.
func readParts(dec *json.Decoder, body []byte, stringOK, arrayOK bool) ([]span, bool) {
	start, first := peek(dec, body)
	switch {
	case first == 'n':
		return nil, skip(dec)
	case first == '"' && stringOK:
		if !skip(dec) {
			return nil, false
		}
		return []span{{start: start, end: offset(dec)}}, true
	case first == '[' && arrayOK:
		if _, err := dec.Token(); err != nil {
			return nil, false
		}
		var spans []span
		for dec.More() {
			start, first := peek(dec, body)
			if first != '{' || len(spans) == maxParts || !skip(dec) {
				return nil, false
			}
			if end := offset(dec); !attributionBlock(body[start:end]) {
				spans = append(spans, span{start: start, end: end})
			}
		}
		return spans, closeArray(dec)
	}
	return nil, false
}

// billingHeader starts the system block in which Claude Code sends a hash
// of its own per request (unless CLAUDE_CODE_ATTRIBUTION_HEADER is 0).
// vLLM's Anthropic endpoint drops the block before the chat template, so it
// is no part of the prefix; named by its bytes, it would make every part
// after it differ from every other conversation's.
const billingHeader = "x-anthropic-billing-header"

// attributionBlock reports whether a system block is Claude Code's billing
// header block.
func attributionBlock(raw []byte) bool {
	if !bytes.Contains(raw, []byte(billingHeader)) {
		return false
	}
	var block struct{ Type, Text string }
	return json.Unmarshal(raw, &block) == nil && block.Type == "text" && strings.HasPrefix(block.Text, billingHeader)
}

// readLeading reads a conversation (messages, or input when stringOK, where
// a string is a lone user prompt): its leading system and developer items
// are parts, null is none.
func readLeading(dec *json.Decoder, body []byte, stringOK bool) ([]span, bool) {
	_, first := peek(dec, body)
	switch {
	case first == 'n' || first == '"' && stringOK:
		return nil, skip(dec)
	case first != '[':
		return nil, false
	}
	if _, err := dec.Token(); err != nil {
		return nil, false
	}
	var spans []span
	leading := true
	for dec.More() {
		if !leading {
			// The rest of the conversation, which can be most of the
			// body, is only skipped.
			if !skip(dec) {
				return nil, false
			}
			continue
		}
		start, _ := peek(dec, body)
		// encoding/json matches "role" case-insensitively too; no client
		// sends another case.
		var item struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		err := dec.Decode(&item)
		var wrongType *json.UnmarshalTypeError
		switch {
		case err == nil && (item.Role == "system" || item.Role == "developer") && len(spans) < maxParts:
			rendered := append([]byte(item.Role+"\x00"), item.Content...)
			spans = append(spans, span{start, offset(dec), rendered})
		case err == nil || errors.As(err, &wrongType):
			// A reply, a user prompt, an item that is no message, or one
			// past maxParts: the conversation's own part starts here.
			// Decode is past the item even when its type was wrong.
			leading = false
		default:
			return nil, false
		}
	}
	return spans, closeArray(dec)
}

// skipped takes any JSON value and keeps nothing, so that skipping a value
// does not copy it.
type skipped struct{}

func (*skipped) UnmarshalJSON([]byte) error { return nil }

// skip moves dec past the next value, reporting whether it was valid.
func skip(dec *json.Decoder) bool {
	var v skipped
	return dec.Decode(&v) == nil
}

func closeArray(dec *json.Decoder) bool {
	tok, err := dec.Token()
	return err == nil && tok == json.Delim(']')
}

func offset(dec *json.Decoder) int { return int(dec.InputOffset()) }

// peek returns where the next value starts in body and its first byte (0 at
// the end). Only whitespace and a ':' or ',' the decoder has not consumed
// yet lie between its offset and the value; should anything else, the
// decoder reports it when reading the value.
func peek(dec *json.Decoder, body []byte) (int, byte) {
	i := offset(dec)
	for i < len(body) {
		switch body[i] {
		case ' ', '\t', '\r', '\n', ':', ',':
			i++
		default:
			return i, body[i]
		}
	}
	return i, 0
}

// chain hashes the parts in the template's order, each hash chained from
// the one before, so that two bodies share a part's hash exactly when they
// share every part up to it.
func chain(body []byte, parts *[numSources][]span) Prefix {
	n := 0
	for _, spans := range parts {
		n += len(spans)
	}
	if n == 0 {
		return nil
	}
	prefix := make(Prefix, 0, n)
	var (
		d        xxhash.Digest
		previous [8]byte
		hash     uint64
		size     int
	)
	for _, spans := range parts {
		for _, s := range spans {
			name := s.rendered
			if name == nil {
				name = body[s.start:s.end]
			}
			binary.LittleEndian.PutUint64(previous[:], hash)
			d.Reset()
			_, _ = d.Write(previous[:])
			_, _ = d.Write(name)
			hash = d.Sum64()
			size += s.end - s.start
			prefix = append(prefix, Part{Hash: hash, Bytes: size})
		}
	}
	return prefix
}
