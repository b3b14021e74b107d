package testrun

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestConcurrentlyRunsEveryCall(t *testing.T) {
	var n atomic.Int64
	Concurrently(50, func(i int) { n.Add(int64(i) + 1) })
	if got := n.Load(); got != 50*51/2 {
		t.Fatalf("sum of call indexes %d, want %d", got, 50*51/2)
	}
}

func TestEventuallyWaitsForTheCondition(t *testing.T) {
	start := time.Now()
	Eventually(t, time.Second, "50 ms to pass", func() bool { return time.Since(start) > 50*time.Millisecond })
}

func TestSessions(t *testing.T) {
	if got := Sessions("s", 11); len(got) != 11 || got[0] != "s-00" || got[10] != "s-10" {
		t.Fatalf("Sessions: %v", got)
	}
}

func TestBufferTakesConcurrentWrites(t *testing.T) {
	var b Buffer
	Concurrently(20, func(int) { _, _ = b.Write([]byte("line\n")) })
	if got := strings.Count(b.String(), "line\n"); got != 20 {
		t.Fatalf("%d lines, want 20", got)
	}
}
