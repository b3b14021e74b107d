package supervise

import (
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/prometheus/procfs"
)

func TestGroupAlive(t *testing.T) {
	if !groupAlive(syscall.Getpgrp()) {
		t.Error("our own group is not alive")
	}

	// A group of one live member.
	live := startInGroup(t, "grandchild")
	if !groupAlive(live.Process.Pid) {
		t.Error("a group with a running member is not alive")
	}
	live.Process.Kill()
	live.Wait()
	if groupAlive(live.Process.Pid) {
		t.Error("a reaped group is alive")
	}

	// A group whose only member is a zombie: kill(2) still finds it, the
	// /proc scan must not.
	zombie := startInGroup(t, "child", "--exit-code", "0")
	defer zombie.Wait()
	waitFor(t, "the child to become a zombie", func() bool {
		return procState(zombie.Process.Pid) == "Z"
	})
	if syscall.Kill(-zombie.Process.Pid, 0) != nil {
		t.Fatal("kill(2) does not see the zombie's group; the test proves nothing")
	}
	if groupAlive(zombie.Process.Pid) {
		t.Error("a group of only a zombie is alive")
	}
}

// startInGroup starts the test binary in role, as the leader of a process
// group of its own, and leaves reaping it to the caller.
func startInGroup(t *testing.T, role string, args ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), roleEnv+"="+role)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil { // the test failed before reaping it
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd
}

// procState is pid's state letter from /proc/PID/stat, or "" if it cannot be
// read (the process is gone).
func procState(pid int) string {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return ""
	}
	stat, err := p.Stat()
	if err != nil {
		return ""
	}
	return stat.State
}
