package supervise

import (
	"syscall"
	"time"
)

// How often a stop looks for members of a group that outlive its leader.
const groupPollInterval = 20 * time.Millisecond

// killSettle bounds the wait for a group's other members to vanish after
// SIGKILL; only a process stuck in the kernel takes longer.
const killSettle = 5 * time.Second

// stopGroup ends p's process group: SIGTERM, then SIGKILL when StopGrace
// passes or a Stop's context ends. It returns once the leader has exited and
// the other members are gone (or, after SIGKILL, killSettle has passed).
func (s *Supervisor) stopGroup(p *process) {
	if p.hasExited() && !groupAlive(p.pid) {
		return
	}
	signalGroup(p.pid, syscall.SIGTERM)
	grace := time.NewTimer(s.spec.stopGrace())
	defer grace.Stop()
	if awaitGroupEnd(p, grace.C, s.killNow) {
		return
	}
	signalGroup(p.pid, syscall.SIGKILL)
	<-p.exited
	settle := time.NewTimer(killSettle)
	defer settle.Stop()
	awaitGroupEnd(p, settle.C, nil)
}

// awaitGroupEnd waits for p to exit and the rest of its group to be gone, and
// reports whether that happened before timeout fired or hurry closed.
func awaitGroupEnd(p *process, timeout <-chan time.Time, hurry <-chan struct{}) bool {
	select {
	case <-p.exited:
	case <-timeout:
		return false
	case <-hurry:
		return false
	}
	poll := time.NewTicker(groupPollInterval)
	defer poll.Stop()
	for groupAlive(p.pid) {
		select {
		case <-poll.C:
		case <-timeout:
			return false
		case <-hurry:
			return false
		}
	}
	return true
}
