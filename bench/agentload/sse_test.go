package agentload

import (
	"io"
	"strings"
	"testing"
)

func TestSSEReader(t *testing.T) {
	stream := ": keep-alive comment\r\n" +
		"event: message_start\r\n" +
		"data: {\"a\":1}\r\n" +
		"\r\n" +
		"data:first\n" +
		"data: second\n" +
		"id: 7\n" +
		"\n" +
		"event: ping\n" +
		"\n" + // no data: not dispatched, and its name must not leak into the next event
		"data: last\n" +
		"\n" +
		"data: unterminated\n"
	r := newSSEReader(strings.NewReader(stream))
	want := []sseEvent{
		{name: "message_start", data: `{"a":1}`},
		{name: "message", data: "first\nsecond"},
		{name: "message", data: "last"},
	}
	for i, w := range want {
		got, err := r.next()
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if got != w {
			t.Fatalf("event %d = %+v, want %+v", i, got, w)
		}
	}
	if ev, err := r.next(); err != io.EOF {
		t.Fatalf("after the last event: %+v, %v; want io.EOF", ev, err)
	}
}

func TestSSEReaderLongLine(t *testing.T) {
	long := strings.Repeat("x", 200<<10)
	r := newSSEReader(strings.NewReader("data: " + long + "\n\n"))
	ev, err := r.next()
	if err != nil || ev.data != long {
		t.Fatalf("long line: %d bytes, %v", len(ev.data), err)
	}
}
