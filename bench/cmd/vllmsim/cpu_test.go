package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/internal/testnet"
)

// serveArgsEnv, when set, makes the test binary run vllmsim with these arguments instead of
// the tests, so a test can measure the server as a process of its own.
const serveArgsEnv = "VLLMSIM_TEST_SERVE_ARGS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(serveArgsEnv); ok {
		if err := run(strings.Fields(args)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// clockTicksPerSecond is Linux's USER_HZ, the unit of /proc/PID/stat CPU times.
const clockTicksPerSecond = 100

// cpuTime reads the user plus system CPU time of a process from /proc.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	utime, _ := strconv.Atoi(fields[11]) // field 14 of the whole line
	stime, _ := strconv.Atoi(fields[12]) // field 15
	return time.Duration(utime+stime) * time.Second / clockTicksPerSecond
}

// TestServerCPUUnderClaudeCodeLoad measures the CPU the simulator uses while 4 engines at
// --time-scale 10 serve 32 closed-loop Claude-Code-like sessions, and requires less than one
// core. It takes VLLMSIM_CPU_SECONDS (default 30) of wall time, so it runs only when asked:
//
//	cd bench && VLLMSIM_CPU_TEST=1 go test -run TestServerCPUUnderClaudeCodeLoad -v ./cmd/vllmsim
func TestServerCPUUnderClaudeCodeLoad(t *testing.T) {
	if os.Getenv("VLLMSIM_CPU_TEST") == "" {
		t.Skip("set VLLMSIM_CPU_TEST=1 to measure the simulator's CPU use (takes 30 s)")
	}
	seconds := 30
	if s := os.Getenv("VLLMSIM_CPU_SECONDS"); s != "" {
		seconds, _ = strconv.Atoi(s)
	}
	port := testnet.Port(t)
	server := exec.Command(os.Args[0], "-test.run=^$")
	server.Env = append(os.Environ(), fmt.Sprintf("%s=--port %d --data-parallel-size 4 --time-scale 10 --output-len uniform:32:max", serveArgsEnv, port))
	server.Stderr = os.Stderr
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		server.Process.Signal(syscall.SIGTERM)
		server.Wait()
	}()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	testnet.WaitListening(t, addr, 10*time.Second)

	gen, err := agentload.NewGenerator(agentload.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	runner := &agentload.Runner{Generator: gen, BaseURL: "http://" + addr, Sessions: 32, Duration: time.Duration(seconds) * time.Second}
	cpuBefore, wallBefore := cpuTime(t, server.Process.Pid), time.Now()
	report, err := runner.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cores := float64(cpuTime(t, server.Process.Pid)-cpuBefore) / float64(time.Since(wallBefore))
	sum := report.Summary
	t.Logf("server CPU: %.3f cores over %v wall (%v simulated); %d requests (%d ok), %.0f output tok/min wall, TTFB p50 %v p95 %v wall, cached %.1f%%",
		cores, sum.Window.Round(time.Millisecond), 10*sum.Window.Round(time.Millisecond), sum.Requests, sum.Succeeded,
		sum.OutputTokensPerMin, sum.TTFBP50, sum.TTFBP95, sum.CachedPercent)
	if sum.Succeeded == 0 {
		t.Fatal("no request succeeded: the load did not reach the simulator")
	}
	if cores >= 1 {
		t.Fatalf("the simulator used %.2f cores, want less than one", cores)
	}
}
