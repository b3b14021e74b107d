// Package redistest starts private redis-server processes for tests: each
// on a free loopback port, with its own temporary directory, stopped when
// the test ends. Debian's redis-server is what CI installs (.ci/run).
package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/testnet"
)

// Server is one redis-server process.
type Server struct {
	// Addr is its loopback host:port.
	Addr string
	dir  string
	cmd  *exec.Cmd
	args []string
	t    testing.TB
	// password is --requirepass's, which Do authenticates with.
	password string
}

// Start runs a redis-server for the test, with no persistence. Outside CI a
// machine without redis-server skips the test with a message; under CI
// (CI set) it fails, as .ci/run installs it. Extra arguments are passed
// through (for example "--requirepass", "secret").
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redis-server is not installed (.ci/run installs Debian's redis-server): %v", err)
		}
		t.Skipf("redis-server not installed (Debian package redis-server); skipping: %v", err)
	}
	s := &Server{Addr: testnet.Addr(t), dir: t.TempDir(), t: t}
	for i, a := range extra {
		if a == "--requirepass" && i+1 < len(extra) {
			s.password = extra[i+1]
		}
	}
	_, port, _ := net.SplitHostPort(s.Addr)
	s.args = append([]string{
		"--bind", "127.0.0.1", "--port", port,
		"--dir", s.dir, "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--logfile", filepath.Join(s.dir, "redis.log"),
	}, extra...)
	s.cmd = exec.Command(bin, s.args...)
	s.start()
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start() {
	s.t.Helper()
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	testnet.WaitListening(s.t, s.Addr, 10*time.Second)
}

// Stop kills the server (as a crash would) and waits for it; stopping a
// stopped server does nothing.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil || s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

// Restart starts the server again on the same port, empty (no persistence).
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.cmd = exec.Command(s.cmd.Path, s.args...)
	s.start()
}

// Do sends one command over a fresh connection (authenticated first when
// the server requires a password) and returns the reply's first line (for
// "+OK", ":12", "$5\r\nvalue" it returns "OK", "12", "value"); errors come
// back as "ERR ..." text.
func (s *Server) Do(args ...string) string {
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

func (s *Server) send(c net.Conn, r *bufio.Reader, args ...string) string {
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
