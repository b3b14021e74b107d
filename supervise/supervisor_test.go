//go:build linux

package supervise

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lmwarden/caddy-warden/internal/testnet"
	"github.com/lmwarden/caddy-warden/internal/testrun"
)

const waitLimit = 10 * time.Second

// recorder keeps what a Supervisor reports.
type recorder struct {
	mu     sync.Mutex
	states []State
	lines  []outputLine
}

type outputLine struct {
	stream Stream
	text   string
}

func (r *recorder) onState(st State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.states = append(r.states, st)
}

func (r *recorder) onOutput(stream Stream, line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, outputLine{stream, line})
}

func (r *recorder) statesIn(phase Phase) []State {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []State
	for _, st := range r.states {
		if st.State == phase {
			out = append(out, st)
		}
	}
	return out
}

func (r *recorder) hasLine(stream Stream, text string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.lines {
		if l.stream == stream && l.text == text {
			return true
		}
	}
	return false
}

var grandchildLine = regexp.MustCompile(`^grandchild pid=(\d+)$`)

// grandchildPIDs lists the grandchildren the children reported, in order.
func (r *recorder) grandchildPIDs() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var pids []int
	for _, l := range r.lines {
		if m := grandchildLine.FindStringSubmatch(l.text); m != nil {
			pid, _ := strconv.Atoi(m[1])
			pids = append(pids, pid)
		}
	}
	return pids
}

func (r *recorder) options() Options {
	return Options{
		OnOutput:       r.onOutput,
		OnState:        r.onState,
		HealthInterval: 10 * time.Millisecond,
		BackoffMin:     40 * time.Millisecond,
		BackoffMax:     160 * time.Millisecond,
		OutputDrain:    time.Second,
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testrun.Eventually(t, waitLimit, what, cond)
}

func waitForState(t *testing.T, sup *Supervisor, what string, cond func(State) bool) State {
	t.Helper()
	var st State
	waitFor(t, what, func() bool {
		st = sup.State()
		return cond(st)
	})
	return st
}

func isReady(st State) bool { return st.State == Ready }

// running reports whether pid is a live process. kill(pid, 0) alone also
// succeeds on zombies, which orphans stay where PID 1 does not reap them.
func running(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	state := procState(pid)
	return state != "" && state != "Z" && state != "X"
}

// waitGone fails the test if one of pids outlives waitLimit, and kills it
// then so that a failed test leaves nothing behind.
func waitGone(t *testing.T, pids ...int) {
	t.Helper()
	for _, pid := range pids {
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // if it outlives the wait
		waitFor(t, fmt.Sprintf("process %d gone", pid), func() bool { return !running(pid) })
	}
}

// childSpec runs the test binary as a child serving on a free port.
func childSpec(t *testing.T, args ...string) Spec {
	t.Helper()
	return childSpecOn(t, strconv.Itoa(testnet.Port(t)), args...)
}

func childSpecOn(t *testing.T, port string, args ...string) Spec {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Spec{
		Command:   append([]string{self, "--port", port}, args...),
		Env:       map[string]string{roleEnv: "child"},
		HealthURL: "http://127.0.0.1:" + port + "/health",
		StopGrace: 5 * time.Second,
	}
}

func startSupervisor(t *testing.T, spec Spec, opts Options) *Supervisor {
	t.Helper()
	sup, err := New(spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	sup.Start()
	t.Cleanup(func() {
		if err := sup.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return sup
}

func stop(t *testing.T, sup *Supervisor) time.Duration {
	t.Helper()
	began := time.Now()
	if err := sup.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := sup.State(); st.State != Stopped || st.PID != 0 {
		t.Fatalf("after Stop: %+v", st)
	}
	return time.Since(began)
}

func TestReadyOnlyAfterHealthAnswers200(t *testing.T) {
	const readyAfter = 300 * time.Millisecond
	rec := &recorder{}
	spec := childSpec(t, "--ready-after", readyAfter.String(), "--long-line", "400")
	spec.Env["SUPERVISE_TEST_VALUE"] = "from-spec"
	spec.Dir = t.TempDir()
	opts := rec.options()
	opts.MaxLineBytes = 150
	sup := startSupervisor(t, spec, opts)

	ready := waitForState(t, sup, "ready", isReady)
	starting := rec.statesIn(Starting)
	if len(starting) != 1 || starting[0].PID != ready.PID || ready.PID == 0 {
		t.Fatalf("starting states %+v, ready %+v", starting, ready)
	}
	if waited := ready.Since.Sub(starting[0].Since); waited < readyAfter {
		t.Errorf("ready %v after launch, before /health could answer 200 (%v)", waited, readyAfter)
	}

	dir, err := filepath.EvalSymlinks(spec.Dir)
	if err != nil {
		t.Fatal(err)
	}
	wantFirst := fmt.Sprintf("child pid=%d value=from-spec dir=%s", ready.PID, dir)
	waitFor(t, fmt.Sprintf("the child's output %q", wantFirst), func() bool {
		return rec.hasLine(Stdout, wantFirst) && rec.hasLine(Stderr, "child stderr line")
	})
	// The 400-byte line arrives in pieces of at most MaxLineBytes.
	for _, piece := range []string{strings.Repeat("x", 150), strings.Repeat("x", 100)} {
		if !rec.hasLine(Stdout, piece) {
			t.Errorf("no output line of %d x", len(piece))
		}
	}
	stop(t, sup)
	waitGone(t, ready.PID)
}

func TestKilledChildIsRestartedAndServesAgain(t *testing.T) {
	first, second := &recorder{}, &recorder{}
	spec := childSpec(t, "--grandchild")
	sup := startSupervisor(t, spec, first.options())
	before := waitForState(t, sup, "ready", isReady)
	waitFor(t, "the grandchild's PID", func() bool { return len(first.grandchildPIDs()) == 1 })
	grandchild := first.grandchildPIDs()[0]

	// From here on events go to the second recorder, as after a reload.
	sup.SetCallbacks(second.onOutput, second.onState)
	if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	after := waitForState(t, sup, "ready again", func(st State) bool {
		return st.State == Ready && st.PID != before.PID
	})
	if after.Restarts != 1 {
		t.Errorf("restarts = %d, want 1", after.Restarts)
	}
	exited := second.statesIn(Exited)
	if len(exited) != 1 || exited[0].ExitCode == nil || *exited[0].ExitCode != 128+int(syscall.SIGKILL) {
		t.Fatalf("exited states %+v, want one with code 137", exited)
	}
	restarting := second.statesIn(Restarting)
	if len(restarting) != 1 || restarting[0].NextRestart.Sub(restarting[0].Since) != 40*time.Millisecond {
		t.Errorf("restarting states %+v, want one with a 40ms delay", restarting)
	}
	// The dead child's worker got SIGTERM and is gone.
	if !second.hasLine(Stdout, "grandchild got SIGTERM") {
		t.Error("the orphaned grandchild was not sent SIGTERM")
	}
	waitGone(t, before.PID, grandchild)
	if len(first.statesIn(Exited)) != 0 {
		t.Error("events still reached the replaced callbacks")
	}

	// Traffic reaches the new process.
	resp, err := defaultHealthClient.Get(strings.TrimSuffix(spec.HealthURL, "health"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != strconv.Itoa(after.PID) {
		t.Errorf("served by %q, want the new process %d", body, after.PID)
	}
	stop(t, sup)
	waitGone(t, append(second.grandchildPIDs(), after.PID)...)
}

func TestChildThatExitsAtOnceBacksOff(t *testing.T) {
	rec := &recorder{}
	sup := startSupervisor(t, childSpec(t, "--exit-code", "3"), rec.options())
	waitFor(t, "five restarts", func() bool { return len(rec.statesIn(Restarting)) >= 5 })
	stop(t, sup)

	restarting := rec.statesIn(Restarting)
	wantDelays := []time.Duration{40, 80, 160, 160, 160}
	for i, want := range wantDelays {
		st := restarting[i]
		if got := st.NextRestart.Sub(st.Since); got != want*time.Millisecond {
			t.Errorf("delay before restart %d = %v, want %v", i+1, got, want*time.Millisecond)
		}
		if st.Restarts != i || st.ExitCode == nil || *st.ExitCode != 3 || st.Error != "exit status 3" {
			t.Errorf("restarting state %d: %+v", i, st)
		}
	}
	// Launches really are spaced by at least those delays.
	starting := rec.statesIn(Starting)
	for i := 1; i < len(starting) && i <= len(wantDelays); i++ {
		if gap := starting[i].Since.Sub(starting[i-1].Since); gap < wantDelays[i-1]*time.Millisecond {
			t.Errorf("launch %d came %v after the previous one", i+1, gap)
		}
	}
}

// manualClock is a clock that moves only when the test says.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestBackoffResetsAfterAStableRun(t *testing.T) {
	rec := &recorder{}
	opts := rec.options()
	opts.BackoffReset = 300 * time.Millisecond
	clock := &manualClock{now: time.Now()}
	opts.Now = clock.Now
	sup := startSupervisor(t, childSpec(t), opts)

	kills := 0
	killWhenReady := func(stayReady time.Duration) {
		st := waitForState(t, sup, "ready", isReady)
		clock.advance(stayReady)
		if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		kills++
		waitFor(t, "the restart to be scheduled", func() bool { return len(rec.statesIn(Restarting)) == kills })
	}
	killWhenReady(0)
	killWhenReady(0)
	killWhenReady(400 * time.Millisecond)
	stop(t, sup)

	var delays []time.Duration
	for _, st := range rec.statesIn(Restarting) {
		delays = append(delays, st.NextRestart.Sub(st.Since))
	}
	want := []time.Duration{40 * time.Millisecond, 80 * time.Millisecond, 40 * time.Millisecond}
	if fmt.Sprint(delays) != fmt.Sprint(want) {
		t.Errorf("delays %v, want %v", delays, want)
	}
}

func TestStartupTimeoutStopsAndRestarts(t *testing.T) {
	rec := &recorder{}
	spec := childSpec(t, "--ready-after", "1h")
	// Long enough for a child built with -race on a busy machine to serve 503s.
	spec.StartupTimeout = 1500 * time.Millisecond
	sup := startSupervisor(t, spec, rec.options())

	st := waitForState(t, sup, "a second launch", func(st State) bool { return st.State == Starting && st.Restarts == 1 })
	exited := rec.statesIn(Exited)
	if len(exited) != 1 {
		t.Fatalf("exited states %+v", exited)
	}
	if e := exited[0].Error; !strings.Contains(e, "not ready after 1.5s") || !strings.Contains(e, "503") {
		t.Errorf("error %q, want the timeout and the last probe's status", e)
	}
	first := rec.statesIn(Starting)[0]
	if took := exited[0].Since.Sub(first.Since); took < spec.StartupTimeout {
		t.Errorf("stopped %v after launch, before the startup timeout", took)
	}
	if !rec.hasLine(Stdout, "child got SIGTERM") {
		t.Error("the child was not sent SIGTERM")
	}
	stop(t, sup)
	waitGone(t, first.PID, st.PID)
}

func TestStopSendsTermThenKillToTheGroup(t *testing.T) {
	const grace = 400 * time.Millisecond
	rec := &recorder{}
	spec := childSpec(t, "--ignore-term", "--grandchild", "--grandchild-ignore-term")
	spec.StopGrace = grace
	sup := startSupervisor(t, spec, rec.options())
	ready := waitForState(t, sup, "ready", isReady)
	waitFor(t, "the grandchild's PID", func() bool { return len(rec.grandchildPIDs()) == 1 })

	if took := stop(t, sup); took < grace {
		t.Errorf("Stop took %v with a %v grace period: SIGKILL came early", took, grace)
	}
	for _, who := range []string{"child", "grandchild"} {
		if !rec.hasLine(Stdout, who+" ignores SIGTERM") {
			t.Errorf("the %s was not sent SIGTERM", who)
		}
	}
	exited := rec.statesIn(Exited)
	if len(exited) != 1 || *exited[0].ExitCode != 137 {
		t.Errorf("exited states %+v, want SIGKILL", exited)
	}
	if stopping := rec.statesIn(Stopping); len(stopping) != 1 || stopping[0].PID != ready.PID {
		t.Errorf("stopping states %+v", stopping)
	}
	waitGone(t, ready.PID, rec.grandchildPIDs()[0])
}

// A group that exits on SIGTERM ends Stop: the grace period (an hour, far
// beyond the test's time) is not waited out, and no SIGKILL is sent.
func TestStopWaitsNoLongerThanTheGroupNeeds(t *testing.T) {
	rec := &recorder{}
	spec := childSpec(t, "--grandchild")
	spec.StopGrace = time.Hour
	sup := startSupervisor(t, spec, rec.options())
	ready := waitForState(t, sup, "ready", isReady)
	waitFor(t, "the grandchild's PID", func() bool { return len(rec.grandchildPIDs()) == 1 })

	stop(t, sup)
	if exited := rec.statesIn(Exited); len(exited) != 1 || *exited[0].ExitCode == 137 {
		t.Errorf("exited states %+v, want one ended by SIGTERM", exited)
	}
	for _, who := range []string{"child", "grandchild"} {
		if !rec.hasLine(Stdout, who+" got SIGTERM") {
			t.Errorf("the %s was not sent SIGTERM", who)
		}
	}
	waitGone(t, ready.PID, rec.grandchildPIDs()[0])
}

func TestStopContextEndingSendsKillAtOnce(t *testing.T) {
	rec := &recorder{}
	spec := childSpec(t, "--ignore-term")
	spec.StopGrace = time.Hour
	sup := startSupervisor(t, spec, rec.options())
	ready := waitForState(t, sup, "ready", isReady)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := sup.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop = %v, want the context's deadline", err)
	}
	stop(t, sup) // returns although the grace period is an hour: SIGKILL was sent
	if exited := rec.statesIn(Exited); len(exited) != 1 || *exited[0].ExitCode != 137 {
		t.Errorf("exited states %+v, want SIGKILL", exited)
	}
	waitGone(t, ready.PID)
}

func TestEscapedProcessDoesNotHoldStop(t *testing.T) {
	before := goleak.IgnoreCurrent()
	rec := &recorder{}
	spec := childSpec(t, "--grandchild", "--escape")
	opts := rec.options()
	opts.OutputDrain = 300 * time.Millisecond
	sup := startSupervisor(t, spec, opts)
	ready := waitForState(t, sup, "ready", isReady)
	waitFor(t, "the grandchild's PID", func() bool { return len(rec.grandchildPIDs()) == 1 })
	escaped := rec.grandchildPIDs()[0]
	t.Cleanup(func() { syscall.Kill(escaped, syscall.SIGKILL) })

	// The escaped process keeps the output pipes open: Stop gives up on them
	// after OutputDrain instead of waiting as long as it lives.
	if took := stop(t, sup); took < opts.OutputDrain {
		t.Errorf("Stop took %v with OutputDrain %v", took, opts.OutputDrain)
	}
	// The output readers are gone though the escaped process still holds the
	// pipes (TestMain's check would come after the cleanup kills it).
	goleak.VerifyNone(t, before)
	waitGone(t, ready.PID)
	if !running(escaped) {
		t.Error("the escaped process is gone, so this test did not need OutputDrain")
	}
}

func TestLaunchWaitsWhileTheAddressIsTaken(t *testing.T) {
	squatter, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer squatter.Close()
	var dials atomic.Int64 // the supervisor's checks of the address
	go func() {
		for {
			c, err := squatter.Accept()
			if err != nil {
				return
			}
			dials.Add(1)
			c.Close()
		}
	}()
	rec := &recorder{}
	port := strconv.Itoa(squatter.Addr().(*net.TCPAddr).Port)
	sup := startSupervisor(t, childSpecOn(t, port), rec.options())

	waitForState(t, sup, "waiting", func(st State) bool { return st.State == Waiting })
	waitFor(t, "three more checks of the address", func() bool { return dials.Load() >= 4 })
	if st := sup.State(); st.State != Waiting || st.PID != 0 || len(rec.statesIn(Starting)) != 0 {
		t.Fatalf("launched while the address was taken: %+v", st)
	}
	squatter.Close()
	ready := waitForState(t, sup, "ready", isReady)
	if ready.Restarts != 0 {
		t.Errorf("restarts = %d, want 0: waiting is not a failure", ready.Restarts)
	}
	stop(t, sup)
	waitGone(t, ready.PID)
}

func TestLaunchFailureIsRetried(t *testing.T) {
	rec := &recorder{}
	spec := Spec{
		Command:   []string{filepath.Join(t.TempDir(), "no-such-program")},
		HealthURL: "http://127.0.0.1:1/health",
	}
	sup := startSupervisor(t, spec, rec.options())
	st := waitForState(t, sup, "two retries", func(st State) bool { return st.Restarts >= 2 })
	if !strings.HasPrefix(st.Error, "launch: ") || st.PID != 0 || st.ExitCode != nil {
		t.Errorf("state %+v", st)
	}
	if len(rec.statesIn(Starting)) != 0 {
		t.Error("a launch that failed was reported as starting")
	}
	stop(t, sup)
}

func TestStopBeforeStart(t *testing.T) {
	sup, err := New(childSpec(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sup.Destruct(); err != nil {
		t.Fatal(err)
	}
	sup.Start() // too late: does nothing (a supervising goroutine would close done twice)
	if st := sup.State(); st.State != Stopped || st.PID != 0 || st.Restarts != 0 {
		t.Errorf("state %+v", st)
	}
	if err := sup.Stop(context.Background()); err != nil {
		t.Error(err)
	}
}

func TestChildDiesWithItsSupervisor(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	helper := exec.Command(self, strconv.Itoa(testnet.Port(t)))
	helper.Env = append(os.Environ(), roleEnv+"=supervisor")
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	defer helper.Wait()
	defer helper.Process.Kill()

	child := make(chan int, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if pid, ok := strings.CutPrefix(sc.Text(), "supervised pid="); ok {
				n, _ := strconv.Atoi(pid)
				child <- n
				break
			}
		}
		io.Copy(io.Discard, out)
	}()
	var pid int
	select {
	case pid = <-child:
	case <-time.After(waitLimit):
		t.Fatal("the helper did not report its child")
	}
	if !running(pid) {
		t.Fatalf("child %d is not running", pid)
	}
	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
}
