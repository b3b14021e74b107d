package supervise

import (
	"os"
	"syscall"

	"github.com/prometheus/procfs"
)

// platformSupported reports whether this OS can run supervised processes.
const platformSupported = true

// sysProcAttr puts the child in a process group of its own, so that its
// workers can be signalled with it, and has the kernel SIGKILL it if the
// thread that started it ends: the launching goroutine holds its OS thread
// until the child has exited, so in practice that means "if Caddy dies".
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// signalGroup sends sig to every process in the group pgid.
func signalGroup(pgid int, sig syscall.Signal) {
	// ESRCH (group already gone) is the only expected error and needs nothing.
	_ = syscall.Kill(-pgid, sig)
}

// groupAlive reports whether the group pgid has a member that is not a zombie.
// kill(2) alone also counts zombies, and orphaned workers stay zombies forever
// where PID 1 does not reap (Caddy itself as PID 1 in a container), which
// would hold every stop for the whole grace period.
func groupAlive(pgid int) bool {
	if syscall.Kill(-pgid, 0) == syscall.ESRCH {
		return false
	}
	procs, err := procfs.AllProcs()
	if err != nil {
		return true // cannot tell: let the grace period and SIGKILL decide
	}
	for _, p := range procs {
		stat, err := p.Stat()
		if err != nil {
			continue // the process ended while we looked
		}
		if stat.PGRP == pgid && stat.State != "Z" && stat.State != "X" {
			return true
		}
	}
	return false
}

// exitOf describes how a process ended: its exit status, or 128+signal (the
// shell's convention, 137 for SIGKILL) when a signal ended it.
func exitOf(ps *os.ProcessState) (code int, desc string) {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), ps.String()
	}
	return ps.ExitCode(), ps.String()
}
