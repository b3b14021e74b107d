package redisproc

import (
	"strings"
	"testing"
)

func TestStartDoRestart(t *testing.T) {
	s := StartTest(t)
	if got := s.Do("SET", "k", "v"); got != "OK" {
		t.Fatalf("SET: %q", got)
	}
	if got := s.Do("GET", "k"); got != "v" {
		t.Fatalf("GET: %q", got)
	}
	if got := s.Do("GET", "missing"); got != "" {
		t.Fatalf("GET missing: %q", got)
	}
	if got := s.Do("INFO", "server"); !strings.Contains(got, "redis_version") {
		t.Fatalf("INFO: %q", got)
	}
	s.Restart()
	if got := s.Do("GET", "k"); got != "" {
		t.Fatalf("after restart without persistence, GET: %q", got)
	}
	if got := s.Do("DBSIZE"); got != "0" {
		t.Fatalf("DBSIZE: %q", got)
	}
}
