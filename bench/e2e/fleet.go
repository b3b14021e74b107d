package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/lmwarden/caddy-warden/bench/caddyproc"
)

// sim is one running vllmsim process.
type sim struct {
	addr string
	cmd  *exec.Cmd
	done chan struct{}
}

// startSims runs the simulated vLLM fleet: one server per replica, or one
// server with internal data parallelism.
func startSims(ctx context.Context, bin string, o Options) ([]*sim, error) {
	servers, ranks := o.Replicas, 1
	if o.Topology == TopologyRanks {
		servers, ranks = 1, o.Replicas
	}
	var sims []*sim
	for i := range servers {
		addr, err := caddyproc.FreeAddr()
		if err != nil {
			return nil, err
		}
		_, port, _ := net.SplitHostPort(addr)
		args := append([]string{
			"--port", port,
			"--id", "r" + strconv.Itoa(i),
			"--data-parallel-size", strconv.Itoa(ranks),
			"--time-scale", strconv.FormatFloat(o.TimeScale, 'f', -1, 64),
			"--seed", strconv.FormatUint(o.Seed, 10),
			"--max-num-seqs", strconv.Itoa(o.MaxNumSeqs),
		}, o.SimArgs...)
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = o.logWriter(), o.logWriter()
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			stopSims(sims)
			return nil, err
		}
		s := &sim{addr: addr, cmd: cmd, done: make(chan struct{})}
		go func() { _ = cmd.Wait(); close(s.done) }()
		sims = append(sims, s)
	}
	for _, s := range sims {
		if err := waitHealthy(ctx, s); err != nil {
			stopSims(sims)
			return nil, err
		}
	}
	return sims, nil
}

func waitHealthy(ctx context.Context, s *sim) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("vllmsim on %s exited at start", s.addr)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := http.Get("http://" + s.addr + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return fmt.Errorf("vllmsim on %s not healthy within 30s", s.addr)
}

func stopSims(sims []*sim) {
	for _, s := range sims {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, s := range sims {
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.done
		}
	}
}

// buildBinaries compiles Caddy and vllmsim into dir.
func buildBinaries(ctx context.Context, dir string) (caddyBin, simBin string, err error) {
	caddyBin, simBin = filepath.Join(dir, "caddy"), filepath.Join(dir, "vllmsim")
	if err := caddyproc.Build(ctx, "./cmd/caddy", caddyBin); err != nil {
		return "", "", err
	}
	return caddyBin, simBin, caddyproc.Build(ctx, "./cmd/vllmsim", simBin)
}

func (o Options) logWriter() io.Writer {
	if o.Log == nil {
		return io.Discard
	}
	return o.Log
}

// mkWorkDir returns o.WorkDir, created, or a new temporary directory.
func (o Options) mkWorkDir() (string, error) {
	if o.WorkDir == "" {
		return os.MkdirTemp("", "wardenbench-")
	}
	return o.WorkDir, os.MkdirAll(o.WorkDir, 0o755)
}
