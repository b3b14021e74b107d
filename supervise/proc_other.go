//go:build !linux

package supervise

import (
	"os"
	"syscall"
)

// platformSupported reports whether this OS can run supervised processes:
// process groups, parent-death signals and /proc are Linux's, so elsewhere New
// refuses and the functions below are never reached; they only let the
// package (and Caddy with it) build.
const platformSupported = false

func sysProcAttr() *syscall.SysProcAttr { return nil }

func signalGroup(int, syscall.Signal) {}

func groupAlive(int) bool { return false }

func exitOf(ps *os.ProcessState) (int, string) { return ps.ExitCode(), ps.String() }
