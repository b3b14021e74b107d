package e2e

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

// ErrNoRedisServer is returned by StartRedis when redis-server is not on
// PATH (Debian package redis-server; .ci/run installs it).
var ErrNoRedisServer = errors.New("redis-server not installed (Debian package redis-server)")

// Redis is a private redis-server process for a run: on a free loopback
// port, in its own temporary directory, with no persistence, so that a
// restart starts empty. It is the non-test counterpart of internal/redistest.
type Redis struct {
	// Addr is its loopback host:port.
	Addr string
	bin  string
	dir  string
	args []string
	log  io.Writer
	cmd  *exec.Cmd
	done chan struct{}
}

// StartRedis runs a redis-server on addr (empty: a free loopback port) and
// waits until it accepts connections. Its output goes to log (nil discards
// it).
func StartRedis(ctx context.Context, addr string, log io.Writer) (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoRedisServer, err)
	}
	if addr == "" {
		if addr, err = caddyproc.FreeAddr(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "wardenbench-redis-")
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = io.Discard
	}
	_, port, _ := net.SplitHostPort(addr)
	r := &Redis{Addr: addr, bin: bin, dir: dir, log: log, args: []string{
		"--bind", "127.0.0.1", "--port", port,
		"--dir", dir, "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--logfile", filepath.Join(dir, "redis.log"),
	}}
	if err := r.start(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return r, nil
}

func (r *Redis) start(ctx context.Context) error {
	cmd := exec.Command(r.bin, r.args...)
	cmd.Stdout, cmd.Stderr = r.log, r.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	r.cmd, r.done = cmd, done
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("redis-server on %s exited at start (log: %s)", r.Addr, filepath.Join(r.dir, "redis.log"))
		case <-ctx.Done():
			r.Kill()
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if c, err := net.DialTimeout("tcp", r.Addr, time.Second); err == nil {
			c.Close()
			return nil
		}
	}
	r.Kill()
	return fmt.Errorf("redis-server on %s not listening within 10s", r.Addr)
}

// Kill ends the server with SIGKILL, as a crash would, and waits for it;
// killing a stopped server does nothing.
func (r *Redis) Kill() {
	if r.cmd == nil {
		return
	}
	select {
	case <-r.done:
		return
	default:
	}
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
	<-r.done
}

// Restart starts a killed server again on the same port, empty.
func (r *Redis) Restart(ctx context.Context) error {
	r.Kill()
	return r.start(ctx)
}

// Stop kills the server and removes its directory.
func (r *Redis) Stop() {
	if r == nil {
		return
	}
	r.Kill()
	os.RemoveAll(r.dir)
}
