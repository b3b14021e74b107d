// Package supervise launches a long-lived child process (a vLLM server), waits
// until its /health answers 200, restarts it with exponential backoff when it
// dies, and stops its whole process group with SIGTERM then SIGKILL. It knows
// nothing of Caddy: the warden app keeps one Supervisor per process spec in a
// caddy.UsagePool (Supervisor is a caddy.Destructor), so a reload that keeps a
// spec keeps its process.
//
// Supervision needs Linux (process groups, a parent-death signal, /proc); on
// other systems New returns an error.
package supervise

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Phase is where a supervised process is in its life.
type Phase string

// The phases of a supervised process.
const (
	Waiting    Phase = "waiting"    // another process listens on the health URL's address; launch waits
	Starting   Phase = "starting"   // launched; /health has not answered 200 yet
	Ready      Phase = "ready"      // /health answered 200
	Exited     Phase = "exited"     // ended or failed to launch; its group is being cleaned up
	Restarting Phase = "restarting" // waiting until NextRestart to launch again
	Stopping   Phase = "stopping"   // Stop was called; the group is being terminated
	Stopped    Phase = "stopped"    // not running and not going to: before Start and after Stop
)

// State is a snapshot of a supervised process, shaped for the admin JSON.
type State struct {
	State Phase `json:"state"`
	// PID of the running process (also its process group ID); 0 when none runs.
	PID int `json:"pid"`
	// Restarts counts launches after the first one.
	Restarts int `json:"restarts"`
	// ExitCode is how the last run ended: its exit status, or 128+signal
	// when a signal ended it (137 for SIGKILL). Nil until a run has ended.
	ExitCode *int `json:"exit_code,omitempty"`
	// Error says why the last run ended or failed to launch.
	Error string `json:"error,omitempty"`
	// NextRestart is when the next launch is due, while Restarting.
	NextRestart time.Time `json:"next_restart,omitzero"`
	// Since is when the process entered this phase.
	Since time.Time `json:"since"`
}

// Options tune a Supervisor. Zero values take the defaults named on each field.
type Options struct {
	// OnOutput receives each line the process writes, without the line end.
	// The two streams are read on two goroutines, so calls may overlap.
	OnOutput func(stream Stream, line string)
	// OnState receives each new state, in order, from the supervising
	// goroutine. It must not block for long nor call Stop.
	OnState func(State)
	// HTTPClient probes the health URL. Default: a client with a 5 s timeout
	// that keeps no idle connections.
	HTTPClient *http.Client
	// HealthInterval is the time between health probes while starting. Default 1 s.
	HealthInterval time.Duration
	// BackoffMin is the delay before the first restart, doubled on each
	// further failure up to BackoffMax. Defaults 1 s and 1 min.
	BackoffMin, BackoffMax time.Duration
	// BackoffReset: a run that stayed ready this long is not a failure, and
	// the next restart waits BackoffMin again. Default 5 min.
	BackoffReset time.Duration
	// OutputDrain is how long to wait, once the group is gone, for the output
	// pipes to reach their end before closing them: a process that left the
	// group (setsid) can hold them open forever. Default 2 s.
	OutputDrain time.Duration
	// MaxLineBytes cuts longer output lines into pieces. Default 16 KiB.
	MaxLineBytes int
	// Now reads the clock that states' times and BackoffReset are measured
	// on. Default time.Now; the waits themselves are real time.
	Now func() time.Time
}

var defaultHealthClient = &http.Client{
	Timeout:   5 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}

func (o *Options) fillDefaults() error {
	if o.HealthInterval < 0 || o.BackoffMin < 0 || o.BackoffMax < 0 || o.BackoffReset < 0 ||
		o.OutputDrain < 0 || o.MaxLineBytes < 0 {
		return errors.New("supervise: options must not be negative")
	}
	if o.HTTPClient == nil {
		o.HTTPClient = defaultHealthClient
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	setDefault(&o.HealthInterval, time.Second)
	setDefault(&o.BackoffMin, time.Second)
	setDefault(&o.BackoffMax, time.Minute)
	setDefault(&o.BackoffReset, 5*time.Minute)
	setDefault(&o.OutputDrain, 2*time.Second)
	setDefault(&o.MaxLineBytes, 16<<10)
	if o.BackoffMax < o.BackoffMin {
		return errors.New("supervise: BackoffMax is below BackoffMin")
	}
	return nil
}

func setDefault[T comparable](field *T, value T) {
	var zero T
	if *field == zero {
		*field = value
	}
}

// backoff is the delay before the restart that follows the given number of
// consecutive failures (1 or more).
func (o *Options) backoff(failures int) time.Duration {
	d := o.BackoffMin
	for i := 1; i < failures && d < o.BackoffMax; i++ {
		d *= 2
	}
	return min(d, o.BackoffMax)
}

// Supervisor runs one process from a Spec. Its methods are safe for
// concurrent use.
type Supervisor struct {
	spec       Spec
	healthAddr string // host:port of the health URL
	opts       Options
	callbacks  atomic.Pointer[callbacks]

	stopCtx     context.Context // done once Stop has been called
	requestStop context.CancelFunc
	killNow     chan struct{} // closed when a Stop's context ended: SIGKILL at once
	killOnce    sync.Once
	done        chan struct{} // closed when supervision is over

	mu      sync.Mutex
	state   State
	started bool
	stopped bool

	launches int // owned by the supervising goroutine
}

type callbacks struct {
	output func(Stream, string)
	state  func(State)
}

// New checks spec and opts and returns a Supervisor that has not started.
func New(spec Spec, opts Options) (*Supervisor, error) {
	if !platformSupported {
		return nil, fmt.Errorf("supervise: running processes is not supported on %s", runtime.GOOS)
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if err := opts.fillDefaults(); err != nil {
		return nil, err
	}
	// Own copies: the caller's config may change under us.
	spec.Command = slices.Clone(spec.Command)
	spec.Env = maps.Clone(spec.Env)
	s := &Supervisor{
		spec:       spec,
		healthAddr: hostPort(spec.HealthURL),
		opts:       opts,
		killNow:    make(chan struct{}),
		done:       make(chan struct{}),
		state:      State{State: Stopped, Since: opts.Now()},
	}
	s.stopCtx, s.requestStop = context.WithCancel(context.Background())
	s.SetCallbacks(opts.OnOutput, opts.OnState)
	return s, nil
}

// SetCallbacks replaces Options.OnOutput and OnState, e.g. with the logger of
// a new config that kept this process. Nil drops that kind of event.
func (s *Supervisor) SetCallbacks(onOutput func(Stream, string), onState func(State)) {
	s.callbacks.Store(&callbacks{output: onOutput, state: onState})
}

// State returns the current state.
func (s *Supervisor) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Start launches the process and supervises it in the background. Calling it
// again, or after Stop, does nothing.
func (s *Supervisor) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.stopped {
		return
	}
	s.started = true
	go s.run()
}

// Stop ends supervision for good: SIGTERM to the process group, SIGKILL when
// the group outlives Spec.StopGrace, and it returns once the process and the
// rest of its group are gone. If ctx ends first, Stop sends SIGKILL at once
// and returns ctx's error without waiting further. Stop may be called any
// number of times, from any goroutine, before or without Start.
func (s *Supervisor) Stop(ctx context.Context) error {
	s.mu.Lock()
	first := !s.stopped
	s.stopped = true
	neverStarted := first && !s.started
	s.mu.Unlock()
	s.requestStop()
	if neverStarted {
		close(s.done)
	}
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		s.killOnce.Do(func() { close(s.killNow) })
		return fmt.Errorf("supervise: %s still stopping: %w", s.spec.Command[0], ctx.Err())
	}
}

// Destruct stops the process, allowing for the grace period and SIGKILL;
// it makes a Supervisor a caddy.Destructor for caddy.UsagePool.
func (s *Supervisor) Destruct() error {
	ctx, cancel := context.WithTimeout(context.Background(),
		s.spec.stopGrace()+killSettle+s.opts.OutputDrain)
	defer cancel()
	return s.Stop(ctx)
}

// run is the supervising goroutine: the only writer of the state.
func (s *Supervisor) run() {
	defer close(s.done)
	failures := 0
	for s.stopCtx.Err() == nil {
		stayedReady := s.runOnce()
		if s.stopCtx.Err() != nil {
			break
		}
		if stayedReady {
			failures = 0
		}
		failures++
		delay := s.opts.backoff(failures)
		s.enter(Restarting, func(st *State) { st.NextRestart = st.Since.Add(delay) })
		if !s.sleep(delay) {
			break
		}
	}
	s.enter(Stopped, nil)
}

// runOnce launches the process and follows it until it and the rest of its
// group are gone. It reports whether the process stayed ready for
// BackoffReset, in which case its end does not count as a failure.
func (s *Supervisor) runOnce() (stayedReady bool) {
	if !s.awaitAddressFree() {
		return false
	}
	p, err := s.launch()
	if err != nil {
		s.enter(Exited, func(st *State) {
			st.Restarts = s.launches - 1
			st.ExitCode = nil
			st.Error = "launch: " + err.Error()
		})
		return false
	}
	defer s.drain(p)
	s.enter(Starting, func(st *State) {
		st.PID = p.pid
		st.Restarts = s.launches - 1
	})

	ready, failure := s.awaitReady(p)
	var readyAt time.Time
	if ready {
		readyAt = s.opts.Now()
		s.enter(Ready, nil)
		select {
		case <-p.exited:
		case <-s.stopCtx.Done():
		}
	}
	if p.hasExited() {
		// It ended by itself; its workers may not have.
		s.enterExited(p, "")
		s.stopGroup(p)
	} else {
		if s.stopCtx.Err() != nil {
			s.enter(Stopping, nil)
		}
		s.stopGroup(p)
		s.enterExited(p, failure)
	}
	return ready && s.opts.Now().Sub(readyAt) >= s.opts.BackoffReset
}

// enter moves to phase, applies edit to the new state and reports it.
func (s *Supervisor) enter(phase Phase, edit func(*State)) {
	s.mu.Lock()
	s.state.State = phase
	s.state.Since = s.opts.Now()
	s.state.NextRestart = time.Time{}
	if edit != nil {
		edit(&s.state)
	}
	st := s.state
	s.mu.Unlock()
	if report := s.callbacks.Load().state; report != nil {
		report(st)
	}
}

// enterExited records how p ended; cause, if any, says why it was ended.
func (s *Supervisor) enterExited(p *process, cause string) {
	s.enter(Exited, func(st *State) {
		st.PID = 0
		st.ExitCode = new(p.end.code)
		st.Error = p.end.desc
		if cause != "" {
			st.Error = cause + "; " + p.end.desc
		}
	})
}

func (s *Supervisor) sleep(d time.Duration) (completed bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.stopCtx.Done():
		return false
	}
}
