package redisproc

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestServer is one redis-server process of a test.
type TestServer struct {
	*Server
	t testing.TB
	// password is --requirepass's, which Do authenticates with.
	password string
}

// Require skips the test on a machine without redis-server, with a
// message; under CI (CI set) it fails the test instead, as .ci/run
// installs it.
func Require(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%v (.ci/run installs it)", ErrNotInstalled)
		}
		t.Skipf("%v; skipping", ErrNotInstalled)
	}
}

// StartTest runs a redis-server for the test (see Require), with no
// persistence, stopped when the test ends. Extra arguments are passed
// through (for example "--requirepass", "secret").
func StartTest(t testing.TB, extra ...string) *TestServer {
	t.Helper()
	Require(t)
	proc, err := Start(context.Background(), Options{Args: extra})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proc.Stop)
	s := &TestServer{Server: proc, t: t}
	for i, a := range extra {
		if a == "--requirepass" && i+1 < len(extra) {
			s.password = extra[i+1]
		}
	}
	return s
}

// Stop kills the server, as a crash would; Restart brings it back, empty.
func (s *TestServer) Stop() { s.Kill() }

// Restart starts the server again on the same port, empty.
func (s *TestServer) Restart() {
	s.t.Helper()
	if err := s.Server.Restart(context.Background()); err != nil {
		s.t.Fatal(err)
	}
}

// Do sends one command over a fresh connection (authenticated first when
// the server requires a password) and returns the reply's first line (for
// "+OK", ":12", "$5\r\nvalue" it returns "OK", "12", "value"); errors come
// back as "ERR ..." text.
func (s *TestServer) Do(args ...string) string {
	s.t.Helper()
	c, err := net.DialTimeout("tcp", s.Addr, 5*time.Second)
	if err != nil {
		s.t.Fatalf("redis %s: %v", s.Addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	if s.password != "" {
		if got := s.send(c, r, "AUTH", s.password); got != "OK" {
			s.t.Fatalf("redis %s: AUTH: %s", s.Addr, got)
		}
	}
	return s.send(c, r, args...)
}

func (s *TestServer) send(c net.Conn, r *bufio.Reader, args ...string) string {
	s.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		s.t.Fatalf("redis %s: %v", s.Addr, err)
	}
	line, err := r.ReadString('\n')
	if err != nil {
		s.t.Fatalf("redis %s: %v", s.Addr, err)
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case line == "":
		return ""
	case line[0] == '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return ""
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			s.t.Fatalf("redis %s: %v", s.Addr, err)
		}
		return string(buf[:n])
	default:
		return line[1:]
	}
}
