package supervise

import (
	"fmt"
	"os"
	"syscall"
	"testing"
)

func TestParseStat(t *testing.T) {
	state, pgrp, ok := parseStat([]byte("4242 (python3 -m (vllm)) S 1 4240 4240 0 -1 4194560 0"))
	if !ok || state != 'S' || pgrp != 4240 {
		t.Errorf("got %c %d %v", state, pgrp, ok)
	}
	if _, _, ok := parseStat([]byte("garbage")); ok {
		t.Error("garbage parsed")
	}
	// Our own entry: running, in our own process group.
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	state, pgrp, ok = parseStat(stat)
	if !ok || state == 'Z' || pgrp != syscall.Getpgrp() {
		t.Errorf("own stat: %c %d %v, want pgrp %d", state, pgrp, ok, syscall.Getpgrp())
	}
	if !groupAlive(syscall.Getpgrp()) {
		t.Error("our own group is not alive")
	}
}
