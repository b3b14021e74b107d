package e2e

import (
	"context"
	"errors"
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

	"github.com/lmwarden/caddy-warden/internal/caddyproc"
)

// kvEventsTopic is the simulators' KV cache events topic.
const kvEventsTopic = "kv-events"

// Sim is one running vllmsim process.
type Sim struct {
	Addr string // host:port of its API
	// KVEvents is where it publishes its KV cache events, tcp://host:port;
	// with data-parallel ranks, rank r on port + r.
	KVEvents string
	bin      string
	args     []string
	log      io.Writer
	cmd      *exec.Cmd
	done     chan struct{}
}

// StartSims runs the simulated vLLM fleet: one server per replica, or one
// server with internal data parallelism. Ports are found free and then
// given to the simulator, so another process on the machine can take one
// in between: a simulator that exits at start is started again on new
// ports, a few times, before its failure counts.
func StartSims(ctx context.Context, bin string, o Options) ([]*Sim, error) {
	var sims []*Sim
	for i := range o.servers() + o.SmallReplicas {
		s, err := newSim(bin, o, i)
		if err == nil {
			err = s.start()
		}
		if err != nil {
			StopSims(sims)
			return nil, err
		}
		sims = append(sims, s)
	}
	for i, s := range sims {
		err := s.WaitHealthy(ctx)
		for tries := 1; errors.Is(err, errExitedAtStart) && tries < 3; tries++ {
			if s, err = newSim(bin, o, i); err == nil {
				if err = s.start(); err == nil {
					sims[i] = s
					err = s.WaitHealthy(ctx)
				}
			}
		}
		if err != nil {
			StopSims(sims)
			return nil, err
		}
	}
	return sims, nil
}

// errExitedAtStart is WaitHealthy's error for a simulator that exited
// before it answered.
var errExitedAtStart = errors.New("exited at start")

// servers is how many simulators serve the model: one per replica, or one
// with ranks.
func (o Options) servers() int {
	if o.Topology == TopologyRanks {
		return 1
	}
	return o.Replicas
}

// newSim prepares server i's simulator on free ports, not started: the
// model's servers first ("r0", "r1"...), then the small model's ("s0"...),
// each serving only its model's name when there are two.
func newSim(bin string, o Options, i int) (*Sim, error) {
	ranks, id, served := 1, "r"+strconv.Itoa(i), o.Workload.Model
	if o.Topology == TopologyRanks {
		ranks = o.Replicas
	}
	if i >= o.servers() {
		ranks, id, served = 1, "s"+strconv.Itoa(i-o.servers()), o.Workload.SmallModel
	}
	addr, err := caddyproc.FreeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	s := &Sim{Addr: addr, bin: bin, log: o.logWriter(), args: append([]string{
		"--port", port,
		"--id", id,
		"--data-parallel-size", strconv.Itoa(ranks),
		"--time-scale", strconv.FormatFloat(o.TimeScale, 'f', -1, 64),
		"--seed", strconv.FormatUint(o.Seed, 10),
		"--max-num-seqs", strconv.Itoa(o.MaxNumSeqs),
	}, o.SimArgs...)}
	if o.SmallReplicas > 0 {
		s.args = append(s.args, "--served-model-name", served)
	}
	// As vLLM does, rank r publishes on the endpoint's port + r.
	events, err := freePortRun(ranks)
	if err != nil {
		return nil, err
	}
	s.KVEvents = "tcp://" + events
	s.args = append(s.args, "--kv-events-config",
		fmt.Sprintf(`{"enable_kv_cache_events": true, "endpoint": %q, "topic": %q}`, s.KVEvents, kvEventsTopic))
	return s, nil
}

// freePortRun returns a loopback address whose port and the n-1 after it
// were free a moment ago (all held open together, then closed).
func freePortRun(n int) (string, error) {
	for range 100 {
		first, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		lns := []net.Listener{first}
		port := first.Addr().(*net.TCPAddr).Port
		for i := 1; i < n && port+i <= 65535; i++ {
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+i)))
			if err != nil {
				break
			}
			lns = append(lns, ln)
		}
		for _, ln := range lns {
			ln.Close()
		}
		if len(lns) == n {
			return first.Addr().String(), nil
		}
	}
	return "", fmt.Errorf("no %d consecutive free loopback ports found", n)
}

func (s *Sim) start() error {
	cmd := exec.Command(s.bin, s.args...)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	return nil
}

// Kill ends the simulator with SIGKILL, as a crashed vLLM would end.
func (s *Sim) Kill() {
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
}

// Restart starts a killed simulator again on the same port, with an empty
// cache, and waits until it is healthy.
func (s *Sim) Restart(ctx context.Context) error {
	if err := s.start(); err != nil {
		return err
	}
	return s.WaitHealthy(ctx)
}

// WaitHealthy waits until /health answers 200, for at most 30 s.
func (s *Sim) WaitHealthy(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("vllmsim on %s: %w", s.Addr, errExitedAtStart)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := http.Get("http://" + s.Addr + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return fmt.Errorf("vllmsim on %s not healthy within 30s", s.Addr)
}

// StopSims ends the simulators: SIGTERM, then SIGKILL after 5 s.
func StopSims(sims []*Sim) {
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

// BuildBinaries compiles Caddy and vllmsim into dir.
func BuildBinaries(ctx context.Context, dir string) (caddyBin, simBin string, err error) {
	caddyBin, simBin = filepath.Join(dir, "caddy"), filepath.Join(dir, "vllmsim")
	if err := caddyproc.Build(ctx, "./cmd/caddy", caddyBin); err != nil {
		return "", "", err
	}
	return caddyBin, simBin, caddyproc.Build(ctx, "./bench/cmd/vllmsim", simBin)
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
