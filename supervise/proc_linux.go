package supervise

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
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
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return true // cannot tell: let the grace period and SIGKILL decide
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // the process ended while we looked
		}
		if state, group, ok := parseStat(stat); ok && group == pgid && state != 'Z' && state != 'X' {
			return true
		}
	}
	return false
}

// parseStat reads the state and process group from /proc/PID/stat, whose
// line is "pid (comm) state ppid pgrp ..."; comm may hold spaces and
// parentheses, so fields are counted from the last ')'.
func parseStat(stat []byte) (state byte, pgrp int, ok bool) {
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, 0, false
	}
	fields := bytes.Fields(stat[end+1:])
	if len(fields) < 3 || len(fields[0]) != 1 {
		return 0, 0, false
	}
	pgrp, err := strconv.Atoi(string(fields[2]))
	if err != nil {
		return 0, 0, false
	}
	return fields[0][0], pgrp, true
}

// exitOf describes how a process ended: its exit status, or 128+signal (the
// shell's convention, 137 for SIGKILL) when a signal ended it.
func exitOf(ps *os.ProcessState) (code int, desc string) {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), ps.String()
	}
	return ps.ExitCode(), ps.String()
}
