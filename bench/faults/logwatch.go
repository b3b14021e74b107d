package faults

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"time"
)

// healthLine is one of warden's "replica healthy" / "replica (still) unhealthy" log
// lines, as Caddy printed it.
type healthLine struct {
	at      time.Time // when the line arrived
	healthy bool
	server  string // the replica's address
	reason  string // why it is unhealthy
}

// logWatch reads Caddy's JSON log as it is written, keeps warden's health
// lines and passes everything on to out.
type logWatch struct {
	out     io.Writer
	partial []byte // an unfinished line; only Write touches it

	mu    sync.Mutex
	lines []healthLine
}

func newLogWatch(out io.Writer) *logWatch {
	if out == nil {
		out = io.Discard
	}
	return &logWatch{out: out}
}

// Write takes Caddy's output. Calls are serialized by os/exec, which gives
// the same writer to stdout and stderr.
func (l *logWatch) Write(b []byte) (int, error) {
	now := time.Now()
	l.partial = append(l.partial, b...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.parse(now, l.partial[:i])
		l.partial = l.partial[i+1:]
	}
	return l.out.Write(b)
}

func (l *logWatch) parse(at time.Time, line []byte) {
	var entry struct {
		Msg    string `json:"msg"`
		Logger string `json:"logger"`
		Server string `json:"server"`
		Reason string `json:"reason"`
	}
	if json.Unmarshal(line, &entry) != nil || entry.Server == "" {
		return
	}
	switch entry.Msg {
	case "replica healthy", "replica unhealthy", "replica still unhealthy": // the last: a new reason
	default:
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, healthLine{at: at, healthy: entry.Msg == "replica healthy", server: entry.Server, reason: entry.Reason})
}

// healthLines returns the lines about server that arrived in w.
func (l *logWatch) healthLines(server string, w window) []healthLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []healthLine
	for _, h := range l.lines {
		if h.server == server && w.contains(h.at) {
			out = append(out, h)
		}
	}
	return out
}

// repeatedStates counts lines that repeat the state (healthy, reason) of the
// line before them: each should mark a change.
func repeatedStates(lines []healthLine) int {
	n := 0
	for i := 1; i < len(lines); i++ {
		if lines[i].healthy == lines[i-1].healthy && reasonKind(lines[i].reason) == reasonKind(lines[i-1].reason) {
			n++
		}
	}
	return n
}

// reasonKind is the stable part of a reason, "metrics error" of
// "metrics error: context deadline exceeded".
func reasonKind(reason string) string {
	kind, _, _ := strings.Cut(reason, ":")
	return kind
}
