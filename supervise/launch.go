package supervise

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"sync/atomic"
	"time"
)

// awaitAddressFree holds the launch while something listens on the health
// URL's address: a process left over from a previous config or from a Caddy
// that crashed would answer the new process's health probes, and the new
// process could not bind the port anyway. It returns false if Stop was called.
func (s *Supervisor) awaitAddressFree() bool {
	tick := time.NewTicker(s.opts.HealthInterval)
	defer tick.Stop()
	for reported := false; s.addressTaken(); reported = true {
		if !reported {
			s.enter(Waiting, nil)
		}
		select {
		case <-tick.C:
		case <-s.stopCtx.Done():
		}
	}
	return s.stopCtx.Err() == nil
}

func (s *Supervisor) addressTaken() bool {
	dialer := net.Dialer{Timeout: time.Second}
	conn, err := dialer.DialContext(s.stopCtx, "tcp", s.healthAddr)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// hostPort is the address a valid health URL points at.
func hostPort(healthURL string) string {
	u, _ := url.Parse(healthURL)
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "https" {
		return net.JoinHostPort(u.Hostname(), "443")
	}
	return net.JoinHostPort(u.Hostname(), "80")
}

// process is one launch of the command.
type process struct {
	pid        int
	exited     chan struct{} // closed once Wait has returned and end is set
	end        exitInfo
	readEnds   []*os.File    // the parent's ends of the stdout and stderr pipes
	readers    atomic.Int32  // output readers still running
	outputDone chan struct{} // closed when both readers have returned
}

type exitInfo struct {
	code int
	desc string
}

type launchResult struct {
	pid int
	err error
}

func (p *process) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// launch starts the command with its output on pipes read line by line.
func (s *Supervisor) launch() (*process, error) {
	s.launches++
	cmd := exec.Command(s.spec.Command[0], s.spec.Command[1:]...)
	cmd.Env = append(os.Environ(), s.spec.environ()...)
	cmd.Dir = s.spec.Dir
	cmd.SysProcAttr = sysProcAttr()
	p := &process{exited: make(chan struct{}), outputDone: make(chan struct{})}
	streams := []Stream{Stdout, Stderr}
	var writeEnds []*os.File
	for range streams {
		r, w, err := os.Pipe()
		if err != nil {
			closeFiles(p.readEnds)
			closeFiles(writeEnds)
			return nil, err
		}
		p.readEnds = append(p.readEnds, r)
		writeEnds = append(writeEnds, w)
	}
	// *os.File outputs go to the child as they are, so Wait does not wait for
	// them: the leader's exit is seen even while its workers hold the pipes.
	cmd.Stdout, cmd.Stderr = writeEnds[0], writeEnds[1]

	started := make(chan launchResult)
	go p.own(cmd, started)
	res := <-started
	closeFiles(writeEnds) // the child has its own copies
	if res.err != nil {
		closeFiles(p.readEnds)
		return nil, res.err
	}
	p.pid = res.pid

	p.readers.Store(int32(len(streams)))
	for i, stream := range streams {
		go func() {
			defer p.readerDone()
			readLines(p.readEnds[i], s.opts.MaxLineBytes, func(line string) {
				if emit := s.callbacks.Load().output; emit != nil {
					emit(stream, line)
				}
			})
		}()
	}
	return p, nil
}

// own starts cmd and is the one goroutine that waits for it. It keeps its OS
// thread for the child's whole life because the parent-death signal fires
// when the thread that forked the child ends, not the Go process.
func (p *process) own(cmd *exec.Cmd, started chan<- launchResult) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		started <- launchResult{err: err}
		return
	}
	started <- launchResult{pid: cmd.Process.Pid}
	err := cmd.Wait()
	if cmd.ProcessState != nil {
		p.end.code, p.end.desc = exitOf(cmd.ProcessState)
	} else {
		p.end = exitInfo{code: -1, desc: err.Error()}
	}
	close(p.exited)
}

func (p *process) readerDone() {
	if p.readers.Add(-1) == 0 {
		close(p.outputDone)
	}
}

// drain waits up to OutputDrain for the output readers to reach the end of
// the pipes, then closes the pipes under them.
func (s *Supervisor) drain(p *process) {
	t := time.NewTimer(s.opts.OutputDrain)
	defer t.Stop()
	select {
	case <-p.outputDone:
	case <-t.C:
	}
	closeFiles(p.readEnds) // unblocks readers still waiting on the pipes
	<-p.outputDone
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// awaitReady probes the health URL until it answers 200 while p runs. It
// returns ready false when p exits, Stop is called, or the startup timeout
// passes; only the last sets failure.
func (s *Supervisor) awaitReady(p *process) (ready bool, failure string) {
	timeout := s.spec.startupTimeout()
	ctx, cancel := context.WithTimeout(s.stopCtx, timeout)
	defer cancel()
	tick := time.NewTicker(s.opts.HealthInterval)
	defer tick.Stop()
	var lastErr error
	for {
		err := s.probe(ctx)
		if err == nil && !p.hasExited() {
			return true, ""
		}
		if ctx.Err() == nil {
			lastErr = err // keep the cause of the last probe that ran its course
		}
		select {
		case <-p.exited:
			return false, ""
		case <-ctx.Done():
			if s.stopCtx.Err() != nil {
				return false, ""
			}
			return false, fmt.Sprintf("not ready after %v (last health probe: %v)", timeout, lastErr)
		case <-tick.C:
		}
	}
}

func (s *Supervisor) probe(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.spec.HealthURL, nil)
	if err != nil {
		return err
	}
	resp, err := s.opts.HTTPClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}
