package caddymodule_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/caddyproc"
	"github.com/lmwarden/caddy-warden/internal/testnet"
	"github.com/lmwarden/caddy-warden/internal/testrun"
	"github.com/lmwarden/caddy-warden/panel"
)

var (
	simOnce sync.Once
	simBin  string
	simErr  error
)

// vllmsimBinary builds bench/cmd/vllmsim (in the nested bench module, so
// these tests need the repository checkout) once, for tests whose replicas
// are processes launched by Caddy.
func vllmsimBinary(t *testing.T) string {
	t.Helper()
	simOnce.Do(func() {
		simBin = filepath.Join(filepath.Dir(caddyBin), "vllmsim")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		simErr = caddyproc.Build(ctx, "./bench/cmd/vllmsim", simBin)
	})
	if simErr != nil {
		t.Fatal(simErr)
	}
	return simBin
}

// supervisedCaddyfile runs two simulated replicas as Caddy's own processes.
// {spill} and {third} are filled in per load.
const supervisedCaddyfile = `{
	admin %[1]s
	default_bind 127.0.0.1
	warden {
		model m {
			replica {
				process %[2]s --port %[3]s --id a --time-scale 20 --max-num-seqs 16 --model m
			}
			replica {
				process %[2]s --port %[4]s --id b --time-scale 20 --max-num-seqs 16 --model m
			}
			{third}
			spill_threshold {spill}
		}
	}
}
http://%[5]s {
	reverse_proxy 127.0.0.1:%[3]s 127.0.0.1:%[4]s {third_upstream} {
		lb_policy warden m
		flush_interval -1
	}
}
`

type supervisedFleet struct {
	*fleet
	template string
}

func (f *supervisedFleet) config(spill string, third string) string {
	upstream := ""
	if third != "" {
		upstream = "127.0.0.1:" + third
		third = fmt.Sprintf("replica 127.0.0.1:%s {\n\t\t\t\tprocess /bin/sh -c \"exit 3\"\n\t\t\t}", third)
	}
	return strings.NewReplacer("{spill}", spill, "{third}", third, "{third_upstream}", upstream).Replace(f.template)
}

func startSupervised(t *testing.T) *supervisedFleet {
	sim := vllmsimBinary(t)
	ports := testnet.Addrs(t, 2)
	admin, site := ports[0], ports[1]
	f := &supervisedFleet{template: fmt.Sprintf(supervisedCaddyfile, admin, sim, strconv.Itoa(testnet.Port(t)), strconv.Itoa(testnet.Port(t)), site)}
	p, err := caddyproc.Start(caddyBin, f.config("8", ""), admin, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })
	f.fleet = &fleet{caddy: p, site: site}
	f.waitReady(t, 2)
	return f
}

// waitReady waits until n processes are ready and their replicas healthy.
func (f *supervisedFleet) waitReady(t *testing.T, n int) panel.ModelStatus {
	t.Helper()
	var st panel.ModelStatus
	testrun.Eventually(t, 30*time.Second, fmt.Sprintf("%d processes ready", n), func() bool {
		st = f.status(t)
		ready := 0
		for _, r := range st.Replicas {
			if r.Process != nil && r.Process.State == "ready" && r.Healthy {
				ready++
			}
		}
		return ready == n
	})
	return st
}

func pids(st panel.ModelStatus) map[string]int {
	out := map[string]int{}
	for _, r := range st.Replicas {
		if r.Process != nil {
			out[r.ID] = r.Process.PID
		}
	}
	return out
}

// alive reports whether pid runs (a zombie waiting to be reaped does not).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

// commandsWith lists the processes whose command line holds s.
func commandsWith(s string) []int {
	var pids []int
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(cmdline), s) && alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// servedBy sends new conversations until one is served by engine id.
func (f *supervisedFleet) servedBy(t *testing.T, id string, prefix string) bool {
	for i := range 12 {
		resp, err := f.send(context.Background(), fmt.Sprintf("%s-%d", prefix, i))
		if err != nil {
			continue
		}
		engine := resp.Header.Get("X-Vllmsim-Engine")
		resp.Body.Close()
		if strings.HasPrefix(engine, id+"/") {
			return true
		}
	}
	return false
}

func TestSupervisedReplicas(t *testing.T) {
	f := startSupervised(t)
	st := f.status(t)
	if st.MaxNumSeqs != 16 || st.SpillThreshold != 8 {
		t.Errorf("max_num_seqs %d (from --max-num-seqs), threshold %d", st.MaxNumSeqs, st.SpillThreshold)
	}
	before := pids(st)
	if !f.servedBy(t, "a", "first") || !f.servedBy(t, "b", "first") {
		t.Fatal("both launched replicas should serve")
	}

	t.Run("kill -9 restarts the child and it serves again", func(t *testing.T) {
		victim := st.Replicas[0]
		if err := syscall.Kill(victim.Process.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testrun.Eventually(t, 30*time.Second, "the killed child restarted", func() bool {
			for _, r := range f.status(t).Replicas {
				if r.ID == victim.ID && r.Process.Restarts == 1 {
					return true
				}
			}
			return false
		})
		after := f.waitReady(t, 2)
		for _, r := range after.Replicas {
			if r.ID == victim.ID && (r.Process.Restarts != 1 || r.Process.PID == victim.Process.PID) {
				t.Errorf("after kill -9: restarts %d, pid %d (was %d)", r.Process.Restarts, r.Process.PID, victim.Process.PID)
			}
		}
		if !f.servedBy(t, "a", "after-kill") {
			t.Error("the restarted replica takes no traffic")
		}
		before = pids(after)
	})

	t.Run("a reload changing the spill threshold keeps the processes", func(t *testing.T) {
		if err := f.caddy.Do(http.MethodPost, "/load", []byte(f.config("3", "")), nil, "Content-Type", "text/caddyfile"); err != nil {
			t.Fatal(err)
		}
		after := f.waitReady(t, 2)
		if after.SpillThreshold != 3 {
			t.Errorf("threshold %d after reload, want 3", after.SpillThreshold)
		}
		for id, pid := range pids(after) {
			if pid != before[id] {
				t.Errorf("%s: pid %d after reload, was %d", id, pid, before[id])
			}
		}
	})

	t.Run("a rejected reload starts, stops and restarts no process", func(t *testing.T) {
		marker := filepath.Join(t.TempDir(), "started")
		third := strconv.Itoa(testnet.Port(t))
		cfg := strings.NewReplacer(
			"--time-scale 20 --max-num-seqs 16 --model m\n", "--time-scale 21 --max-num-seqs 16 --model m\n", // a changed command: a new process if applied
			"{third}", fmt.Sprintf("replica 127.0.0.1:%s {\n\t\t\t\tprocess /bin/sh -c \"touch %s; sleep 30\"\n\t\t\t}", third, marker),
			"{spill}", "3", "{third_upstream}", "127.0.0.1:"+third,
		).Replace(f.template)
		// A handler Caddy refuses in Provision, after the warden app's.
		cfg += "http://" + testnet.Addr(t) + " {\n\turi path_regexp ([ x\n}\n"
		if err := f.caddy.Do(http.MethodPost, "/load", []byte(cfg), nil, "Content-Type", "text/caddyfile"); err == nil {
			t.Fatal("Caddy accepted a config with an invalid regexp")
		}
		after := f.waitReady(t, 2)
		if len(after.Replicas) != 2 {
			t.Errorf("%d replicas after a rejected load, want 2", len(after.Replicas))
		}
		for id, pid := range pids(after) {
			if pid != before[id] || !alive(pid) {
				t.Errorf("%s: pid %d (alive %v) after a rejected load, was %d", id, pid, alive(pid), before[id])
			}
		}
		if pids := commandsWith(marker); len(pids) > 0 {
			t.Errorf("the rejected config's new process runs: pids %v", pids)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Error("the rejected config's new process was started")
		}
	})

	t.Run("a child that exits at once backs off while the others serve", func(t *testing.T) {
		if err := f.caddy.Do(http.MethodPost, "/load", []byte(f.config("3", strconv.Itoa(testnet.Port(t)))), nil, "Content-Type", "text/caddyfile"); err != nil {
			t.Fatal(err)
		}
		var delays []time.Duration
		testrun.Eventually(t, 15*time.Second, "three growing restart delays", func() bool {
			for _, r := range f.status(t).Replicas {
				p := r.Process
				if p == nil || p.State != "restarting" || p.NextRestart.IsZero() {
					continue
				}
				d := p.NextRestart.Sub(p.Since).Round(100 * time.Millisecond)
				if len(delays) == 0 || delays[len(delays)-1] != d {
					delays = append(delays, d)
				}
			}
			return len(delays) >= 3
		})
		for i := 1; i < len(delays); i++ {
			if delays[i] <= delays[i-1] {
				t.Errorf("restart delays do not grow: %v", delays)
			}
		}
		if !f.servedBy(t, "a", "during-crashloop") || !f.servedBy(t, "b", "during-crashloop") {
			t.Error("healthy replicas stopped serving during another's crash loop")
		}
	})

	t.Run("stopping Caddy leaves no child behind", func(t *testing.T) {
		last := pids(f.status(t))
		f.caddy.Stop()
		for id, pid := range last {
			if pid != 0 && alive(pid) {
				t.Errorf("%s: process %d still runs after Caddy stopped", id, pid)
			}
		}
	})
}
