package sessionkey

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// Body ID fields, best first. The first four name a conversation; the last
// two name a user, who may hold many conversations.
const (
	idUserIDSession  = iota // metadata.user_id: Claude Code's JSON session_id, or ..._session_<id>
	idSessionID             // session_id (vLLM's own field, OpenRouter's convention)
	idPromptCacheKey        // prompt_cache_key (Codex: the thread ID; OpenCode with setCacheKey)
	idClientMetadata        // client_metadata.session_id (Responses API, Codex)
	idUserIDPlain           // metadata.user_id that is neither of the above
	idUser                  // user (OpenAI)
	numIDs
	firstWeakID = idUserIDPlain
)

// bodyIDs are the ID fields of one body; beforeHead marks those read before
// the conversation (messages or input) started.
type bodyIDs struct {
	value      [numIDs]string
	beforeHead [numIDs]bool
}

func (b *bodyIDs) set(field int, v string, beforeHead bool) {
	if v != "" && b.value[field] == "" {
		b.value[field], b.beforeHead[field] = v, beforeHead
	}
}

// best is the best ID among fields [from, to) read before the head when
// onlyBeforeHead, else anywhere.
func (b *bodyIDs) best(from, to int, onlyBeforeHead bool) string {
	for f := from; f < to; f++ {
		if b.value[f] != "" && (!onlyBeforeHead || b.beforeHead[f]) {
			return b.value[f]
		}
	}
	return ""
}

// FromBody returns the conversation ID in (a prefix of) a JSON request body,
// best first: Anthropic's metadata.user_id (Claude Code puts a JSON object
// with session_id there; older versions a string ending in _session_<id>),
// a top-level session_id, prompt_cache_key, client_metadata.session_id,
// any other metadata.user_id, OpenAI's user. A body cut short is read as far
// as it goes; an invalid one yields "".
func FromBody(prefix []byte) string {
	var ids bodyIDs
	scanBody(prefix, false, &ids)
	return ids.best(0, numIDs, false)
}

// ReadBody reads the conversation from (a prefix of) a JSON request body:
// with ids, from the ID fields FromBody reads; with fingerprint, from the
// conversation's head.
//
// A body ID that comes before the conversation itself (messages, input)
// names it. Otherwise, with fingerprint, the conversation's own head does
// (see Fingerprint): agents write their IDs after the messages, where a
// bounded scan reaches them only while the conversation is short, whereas
// the head is at the start and read on every turn, so the key does not
// change as the conversation grows. Without a fingerprint, a conversation
// ID found anywhere, then a user ID.
func ReadBody(prefix []byte, ids, fingerprint bool) Identity {
	var found bodyIDs
	fp := scanBody(prefix, fingerprint, &found)
	if !ids {
		return fp
	}
	return choose(&found, fp)
}

func choose(ids *bodyIDs, fp Identity) Identity {
	if v := ids.best(0, firstWeakID, true); v != "" {
		return Identity{Key: Hash(v), Source: Body}
	}
	if fp.Key != 0 {
		return fp
	}
	if v := ids.best(0, numIDs, false); v != "" {
		return Identity{Key: Hash(v), Source: Body}
	}
	return Identity{}
}

// scanBody walks the top-level fields of a JSON object, collecting ID
// fields and, with fingerprint, the conversation's fingerprint. It stops
// where the prefix ends, at the first invalid byte, or once the fingerprint
// is known (nothing after it can change the result).
func scanBody(prefix []byte, fingerprint bool, ids *bodyIDs) (fp Identity) {
	var system []byte // Anthropic's system, Responses' instructions, when before the head
	headStarted := false
	walkObject(prefix, func(name, value []byte, cut bool) bool {
		head := string(name) == "messages" || string(name) == "input"
		if fingerprint && head && !headStarted {
			headStarted = true
			var resume bool
			fp, resume = fingerprintOf(json.NewDecoder(bytes.NewReader(value)), system)
			return fp.Key == 0 && resume // unknown yet, and the decoder read the whole value
		}
		if cut {
			return false // keep what was found
		}
		// Values of the wrong type are ignored like absent ones.
		switch string(name) {
		case "system", "instructions":
			if !headStarted {
				system = value
			}
		case "messages", "input":
			headStarted = true
		case "metadata":
			var meta struct {
				UserID    string `json:"user_id"`
				SessionID string `json:"sessionId"` // Qwen Code on DashScope-style servers
			}
			if json.Unmarshal(value, &meta) == nil {
				if s, structured := fromUserID(meta.UserID); structured {
					ids.set(idUserIDSession, s, !headStarted)
				} else {
					ids.set(idUserIDPlain, s, !headStarted)
				}
				ids.set(idSessionID, meta.SessionID, !headStarted)
			}
		case "session_id":
			ids.set(idSessionID, stringValue(value), !headStarted)
		case "prompt_cache_key":
			ids.set(idPromptCacheKey, stringValue(value), !headStarted)
		case "client_metadata":
			var cm struct {
				SessionID string `json:"session_id"`
			}
			if json.Unmarshal(value, &cm) == nil {
				ids.set(idClientMetadata, cm.SessionID, !headStarted)
			}
		case "user":
			ids.set(idUser, stringValue(value), !headStarted)
		}
		return true
	})
	return fp
}

func stringValue(raw json.RawMessage) string {
	var s string
	_ = json.Unmarshal(raw, &s)
	return s
}

// fromUserID extracts the session from Claude Code's metadata.user_id;
// structured is false when it is neither of Claude Code's forms.
func fromUserID(userID string) (id string, structured bool) {
	var ids struct {
		SessionID string `json:"session_id"`
	}
	if json.Unmarshal([]byte(userID), &ids) == nil && ids.SessionID != "" {
		return ids.SessionID, true
	}
	if _, after, ok := strings.Cut(userID, "_session_"); ok && after != "" {
		return after, true
	}
	return userID, false
}

// Fingerprints.
//
// A client that sends no ID still resends, unchanged on every turn, the
// start of its conversation: the system prompt and the first user message
// (in the Responses API, the instructions and the first input items). The
// head is the system prompt when it comes before the messages in the body
// (where it comes after, a bounded scan would reach it only while the
// conversation is short), and the leading run of system, developer and user
// messages: everything before the first reply. On the first turn that is
// the whole request.
//
// Two conversations may share their head exactly (one template, the same
// opening message). They differ from their first reply on (sampling, tool
// call IDs, tool results), or from the message after it when that reply is
// canned, so once a conversation has a reply its key is the head, that reply
// and the prompt after it, and its parent is the head alone, the key of its
// first turn: it is placed beside its first turn (where the head is cached)
// as a continuation, and conversations that shared a head each get their own
// pin from their second turn.
//
// What clients rewrite in old messages is left out of the hash, so that the
// key does not move as they do: Anthropic cache_control markers (moved to
// the latest message each turn), thinking blocks and reasoning items and
// fields (which some clients drop from older turns).

// fingerprintDomain keeps fingerprint keys apart from hashed IDs.
const fingerprintDomain = "warden-fingerprint\x00"

// fingerprintOf reads the conversation (messages or input) from dec, just
// after its field name, and returns its fingerprint key; Key is 0 when the
// head was cut short or is empty. resume reports that dec is past the whole
// value, so the object's next field can be read. Each item is decoded once.
func fingerprintOf(dec *json.Decoder, system json.RawMessage) (fp Identity, resume bool) {
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(fingerprintDomain)
	if system != nil && !hashCanonical(&d, system) {
		return Identity{}, false
	}
	tok, err := dec.Token()
	if err != nil {
		return Identity{}, false
	}
	if tok != json.Delim('[') {
		// A single string (a one-shot Responses or embeddings input) is no
		// conversation: left unkeyed, it leaves the session table alone.
		_, scalar := tok.(string)
		return Identity{}, scalar
	}
	dec.UseNumber()
	heads := 0
	for dec.More() {
		var item any
		if dec.Decode(&item) != nil {
			return Identity{}, false // cut short before the head (and its reply) ended
		}
		m, _ := item.(map[string]any)
		role, _ := m["role"].(string)
		typ, _ := m["type"].(string)
		if isPrompt(role, typ) {
			writeCanonical(&d, item)
			heads++
			continue
		}
		if typ == "reasoning" {
			continue // clients may drop it from older turns
		}
		if heads == 0 {
			return Identity{}, false
		}
		head := nonZero(d.Sum64())
		var r xxhash.Digest
		r.Reset()
		writeCanonical(&r, item)
		// The prompt right after the first reply, when there is one: some
		// clients open every conversation with the same exchange (Qwen Code
		// sends its context, then a canned "Got it" reply), which only the
		// next message tells apart. A tool call's output is not a prompt.
		// A message the scan cuts (a file of hundreds of KiB read by the
		// first tool call) is left out: it is cut on every turn, the reply
		// before it read whole, so the key holds. Only one that ends within
		// the bytes clients rewrite in older messages (a moved cache_control
		// marker, a dropped thinking block) of the scan's end may be cut on
		// one turn and not the next.
		if !dec.More() {
			// The list's end, or a scan cut right after the reply.
			if tok, err := dec.Token(); err == nil && tok != json.Delim(']') {
				return Identity{}, false
			}
		} else {
			var next any
			if dec.Decode(&next) == nil {
				m, _ := next.(map[string]any)
				role, _ := m["role"].(string)
				typ, _ := m["type"].(string)
				if isPrompt(role, typ) {
					writeCanonical(&r, next)
				}
			}
		}
		return Identity{Key: Combine(head, nonZero(r.Sum64())), Parent: head, Continues: true, Renamed: true, Source: Fingerprint}, false
	}
	if _, err := dec.Token(); err != nil { // the closing bracket
		return Identity{}, false
	}
	if heads == 0 {
		return Identity{}, true
	}
	return Identity{Key: nonZero(d.Sum64()), Source: Fingerprint}, true
}

// isPrompt reports whether a message or input item is part of the prompt a
// conversation starts with, rather than a reply.
func isPrompt(role, typ string) bool {
	switch role {
	case "system", "developer", "user":
		return typ == "" || typ == "message"
	}
	return false
}

func nonZero(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}

// skippedFields and skippedBlocks are what clients rewrite in messages they
// resend; they are left out of fingerprints.
var (
	skippedFields = []string{"cache_control", "reasoning", "reasoning_content"}
	skippedBlocks = []string{"thinking", "redacted_thinking", "reasoning"}
)

// hashCanonical writes a canonical form of a JSON value to d: object keys
// sorted, numbers as written, strings length-prefixed, skipped fields and
// blocks left out. It reports false for invalid JSON.
func hashCanonical(d *xxhash.Digest, raw json.RawMessage) bool {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return false
	}
	writeCanonical(d, v)
	return true
}

func writeCanonical(d *xxhash.Digest, v any) {
	switch x := v.(type) {
	case nil:
		_, _ = d.WriteString("n")
	case bool:
		if x {
			_, _ = d.WriteString("t")
		} else {
			_, _ = d.WriteString("f")
		}
	case json.Number:
		_, _ = d.WriteString("#")
		writeString(d, string(x))
	case string:
		_, _ = d.WriteString("s")
		writeString(d, x)
	case []any:
		_, _ = d.WriteString("[")
		for _, e := range x {
			if m, ok := e.(map[string]any); ok {
				if t, _ := m["type"].(string); slices.Contains(skippedBlocks, t) {
					continue
				}
			}
			writeCanonical(d, e)
		}
		_, _ = d.WriteString("]")
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			if !slices.Contains(skippedFields, k) {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		_, _ = d.WriteString("{")
		for _, k := range keys {
			writeString(d, k)
			writeCanonical(d, x[k])
		}
		_, _ = d.WriteString("}")
	}
}

func writeString(d *xxhash.Digest, s string) {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
	_, _ = d.Write(n[:])
	_, _ = d.WriteString(s)
}
