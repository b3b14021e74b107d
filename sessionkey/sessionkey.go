// Package sessionkey finds the conversation a request belongs to: in a
// session header, or in the body of an Anthropic or OpenAI request.
package sessionkey

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
)

// FromHeaders returns the value of the first header of names that is present
// and not empty.
func FromHeaders(h http.Header, names []string) string {
	for _, name := range names {
		if v := h.Get(name); v != "" {
			return v
		}
	}
	return ""
}

// FromBody returns the conversation ID in (a prefix of) a JSON request body:
// Anthropic's metadata.user_id (Claude Code puts a JSON object with
// session_id there; older versions a string ending in _session_<id>),
// else a top-level session_id (vLLM's own field), else OpenAI's user. A body
// cut short is read as far as it goes; an invalid one yields "".
func FromBody(prefix []byte) string {
	dec := json.NewDecoder(bytes.NewReader(prefix))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	var sessionID, user string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		var value json.RawMessage
		if dec.Decode(&value) != nil {
			break // cut short: keep what was found
		}
		// Values of the wrong type are ignored like absent ones.
		switch tok {
		case "metadata":
			var meta struct {
				UserID string `json:"user_id"`
			}
			if json.Unmarshal(value, &meta) == nil && meta.UserID != "" {
				return fromUserID(meta.UserID)
			}
		case "session_id":
			_ = json.Unmarshal(value, &sessionID)
		case "user":
			_ = json.Unmarshal(value, &user)
		}
	}
	if sessionID != "" {
		return sessionID
	}
	return user
}

// fromUserID extracts the session from Claude Code's metadata.user_id.
func fromUserID(userID string) string {
	var ids struct {
		SessionID string `json:"session_id"`
	}
	if json.Unmarshal([]byte(userID), &ids) == nil && ids.SessionID != "" {
		return ids.SessionID
	}
	if _, after, ok := strings.Cut(userID, "_session_"); ok {
		return after
	}
	return userID
}
