// Package redisproc runs private redis-server processes (Debian's, which
// .ci/run installs) for tests and benchmark runs: on a loopback port, in a
// temporary directory of their own, without persistence, so that a restart
// starts empty. StartTest gives a test one, and a client to talk to it.
package redisproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/lmwarden/caddy-warden/internal/caddyproc"
)

// ErrNotInstalled is returned by Start when redis-server is not on PATH.
var ErrNotInstalled = errors.New("redis-server not installed (Debian package redis-server)")

// Options of a server.
type Options struct {
	// Addr is the loopback host:port to listen on; empty picks a free one.
	Addr string
	// Log receives the server's own output; nil discards it.
	Log io.Writer
	// Args are extra redis-server arguments, e.g. "--requirepass", "secret".
	Args []string
}

// Server is one redis-server process.
type Server struct {
	// Addr is its loopback host:port.
	Addr string
	bin  string
	dir  string
	args []string
	log  io.Writer
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs a redis-server and waits until it accepts connections.
func Start(ctx context.Context, o Options) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotInstalled, err)
	}
	if o.Addr == "" {
		if o.Addr, err = caddyproc.FreeAddr(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "warden-redis-")
	if err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	_, port, _ := net.SplitHostPort(o.Addr)
	s := &Server{Addr: o.Addr, bin: bin, dir: dir, log: o.Log, args: append([]string{
		"--bind", "127.0.0.1", "--port", port,
		"--dir", dir, "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--logfile", filepath.Join(dir, "redis.log"),
	}, o.Args...)}
	if err := s.start(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func (s *Server) start(ctx context.Context) error {
	cmd := exec.Command(s.bin, s.args...)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("redis-server on %s exited at start (log: %s)", s.Addr, filepath.Join(s.dir, "redis.log"))
		case <-ctx.Done():
			s.Kill()
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if c, err := net.DialTimeout("tcp", s.Addr, time.Second); err == nil {
			c.Close()
			return nil
		}
	}
	s.Kill()
	return fmt.Errorf("redis-server on %s not listening within 10s", s.Addr)
}

// Kill ends the server with SIGKILL, as a crash would, and waits for it;
// killing a stopped server does nothing.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
}

// Restart starts a killed server again on the same port, empty.
func (s *Server) Restart(ctx context.Context) error {
	s.Kill()
	return s.start(ctx)
}

// Stop kills the server and removes its directory.
func (s *Server) Stop() {
	if s == nil {
		return
	}
	s.Kill()
	os.RemoveAll(s.dir)
}
