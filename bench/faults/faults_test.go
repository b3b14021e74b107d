package faults

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/bench/e2e"
	"github.com/lmwarden/caddy-warden/internal/testrun"
)

// full runs every /metrics fault, each held longer: the table of
// docs/reliability.md (cd bench && go test -run TestRun -full -v ./faults).
var full = flag.Bool("full", false, "run the whole fault run instead of the short one")

// The fault run: simulators, Caddy, load, every phase. Every expectation
// of the table must hold.
func TestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Caddy and the simulator")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var log testrun.Buffer
	table, err := Run(ctx, Options{Short: !*full, WorkDir: t.TempDir(), Log: &log, Progress: func(p string) { t.Log(p) }})
	var out strings.Builder
	_ = table.Print(&out)
	t.Logf("\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if want := 2 + len(table.Options.metricsFaults()) + 2; len(table.Rows) != want {
		t.Errorf("%d rows, want %d", len(table.Rows), want)
	}
	for _, v := range table.Violations() {
		t.Error(v)
	}
	for _, r := range table.Rows {
		if r.Sent == 0 || r.PinsChecked == 0 {
			t.Errorf("%s: %d requests, %d conversations followed: the load did not run", r.Fault, r.Sent, r.PinsChecked)
		}
	}
	if t.Failed() {
		t.Logf("caddy and simulators:\n%s", log.String())
	}
}

// cluster runs the Caddy-side faults of three instances sharing Redis
// (cd bench && go test -run TestClusterRun -cluster -v ./faults); it is
// not part of make test.
var cluster = flag.Bool("cluster", false, "run the three-instance Redis fault run")

// Three instances behind a random front sharing Redis: Redis killed, then
// an instance killed. Every expectation of the table must hold.
func TestClusterRun(t *testing.T) {
	if !*cluster {
		t.Skip("the cluster fault run takes a minute; -cluster runs it")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	table, err := Run(ctx, Options{Instances: 3, PinStore: e2e.PinStoreRedis, WorkDir: t.TempDir(), Progress: func(p string) { t.Log(p) }})
	var out strings.Builder
	_ = table.Print(&out)
	t.Logf("\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(table.Rows) != 2 {
		t.Errorf("%d rows, want 2", len(table.Rows))
	}
	for _, v := range table.Violations() {
		t.Error(v)
	}
}

// The recommended retry settings the run uses are the ones the example ships.
func TestRetrySettingsMatchExample(t *testing.T) {
	example, err := os.ReadFile("../../examples/Caddyfile.retries")
	if err != nil {
		t.Fatal(err)
	}
	run := caddyConfig{admin: "127.0.0.1:1", site: "127.0.0.1:2", replicas: []string{"127.0.0.1:3"}, scale: 1}.caddyfile("auto")
	for _, option := range []string{"lb_retries", "lb_try_duration", "lb_try_interval", "fail_duration", "method", "request_buffers"} {
		want := optionLine(run, option)
		if want == "" {
			t.Fatalf("the run's Caddyfile has no %s", option)
		}
		if got := optionLine(string(example), option); got != want {
			t.Errorf("examples/Caddyfile.retries says %q, the fault run uses %q", got, want)
		}
	}
}

// optionLine is the first non-comment line of a Caddyfile that sets option.
func optionLine(caddyfile, option string) string {
	for line := range strings.Lines(caddyfile) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, option+" ") {
			return line
		}
	}
	return ""
}
