package supervise

import (
	"bufio"
	"bytes"
	"io"
)

// Stream names the pipe a line of output came from.
type Stream string

// The two output streams of a process.
const (
	Stdout Stream = "stdout"
	Stderr Stream = "stderr"
)

// readLines hands each line of r to emit until r ends or fails. Lines end at
// '\n' or '\r' (progress bars redraw themselves with '\r'), empty lines are
// dropped, and a line longer than maxLen is cut into pieces of maxLen bytes
// so one runaway line cannot grow memory without bound.
func readLines(r io.Reader, maxLen int, emit func(line string)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, min(maxLen, 4096)), maxLen)
	sc.Split(splitLines(maxLen))
	for sc.Scan() {
		if len(sc.Bytes()) > 0 {
			emit(sc.Text())
		}
	}
}

// splitLines is a bufio.SplitFunc for readLines.
func splitLines(maxLen int) bufio.SplitFunc {
	return func(data []byte, atEOF bool) (advance int, token []byte, err error) {
		window := data[:min(len(data), maxLen)]
		if i := bytes.IndexAny(window, "\r\n"); i >= 0 {
			return i + 1, data[:i], nil
		}
		if len(data) >= maxLen || (atEOF && len(data) > 0) {
			return len(window), window, nil
		}
		return 0, nil, nil
	}
}
