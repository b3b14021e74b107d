// Package testrun holds the small helpers that tests driving a real Caddy
// share: wait for a condition, fire requests at once, name sessions,
// collect a process's output.
package testrun

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"
)

// Eventually polls cond every 20 ms and fails the test if it does not hold
// within the given time.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Concurrently runs n calls of fn released at the same instant and waits
// for them all.
func Concurrently(n int, fn func(i int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			fn(i)
		})
	}
	close(start)
	wg.Wait()
}

// Sessions names n sessions prefix-00, prefix-01, ...
func Sessions(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%02d", prefix, i)
	}
	return out
}

// CaddyHome points the home and XDG directories at a temporary directory
// for the test, so that a Caddy loaded in the test's process keeps its
// storage and autosaved config there.
func CaddyHome(t testing.TB) {
	home := t.TempDir()
	for _, env := range []string{"HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME"} {
		t.Setenv(env, home)
	}
}

// Buffer collects what several goroutines write (a process's stdout and
// stderr, several processes' logs) for a test to read while they write.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
