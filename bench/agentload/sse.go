package agentload

import (
	"bufio"
	"io"
	"strings"
)

// maxSSELine bounds one line of a stream; a vLLM data line holds one JSON chunk.
const maxSSELine = 4 << 20

// sseEvent is one dispatched server-sent event.
type sseEvent struct {
	// name is the event field, "message" when the server sent none.
	name string
	// data is the event's data lines joined by "\n".
	data string
}

// sseReader splits a text/event-stream body into events, following the
// WHATWG parsing rules for the fields a model server sends (event, data,
// comments; id and retry are ignored since the runner never reconnects).
type sseReader struct {
	lines *bufio.Scanner
}

func newSSEReader(r io.Reader) *sseReader {
	lines := bufio.NewScanner(r)
	lines.Buffer(make([]byte, 0, 64<<10), maxSSELine)
	return &sseReader{lines: lines}
}

// next returns the next event, or io.EOF when the stream ends. An event
// without its closing blank line at the end of the stream is dropped, as
// the standard says.
func (r *sseReader) next() (sseEvent, error) {
	var name string
	var data strings.Builder
	hasData := false
	for r.lines.Scan() {
		line := r.lines.Text()
		if line == "" {
			if !hasData {
				name = ""
				continue
			}
			if name == "" {
				name = "message"
			}
			return sseEvent{name: name, data: data.String()}, nil
		}
		if strings.HasPrefix(line, ":") {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "event":
			name = value
		case "data":
			if hasData {
				data.WriteByte('\n')
			}
			data.WriteString(value)
			hasData = true
		}
	}
	if err := r.lines.Err(); err != nil {
		return sseEvent{}, err
	}
	return sseEvent{}, io.EOF
}
