package caddymodule_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/testrun"
	"github.com/lmwarden/caddy-warden/panel"
	"github.com/lmwarden/caddy-warden/pinsnapshot"
)

const restartBlock = "replicas {replicas}\n\t\t\tmax_num_seqs 128"

func placed(st panel.ModelStatus) (n uint64) {
	for _, r := range st.Replicas {
		n += r.Placed
	}
	return n
}

// pinSnapshot is the model's snapshot state; the test fails without one.
func pinSnapshot(t *testing.T, f *fleet) pinsnapshot.Status {
	t.Helper()
	st := f.status(t).PinSnapshot
	if st == nil {
		t.Fatal("no pin_snapshot in the admin JSON")
	}
	return *st
}

// Without a shared pin store, a Caddy restarted on the same data directory
// sends every conversation to the replica it had: the pins are written at
// exit (and periodically, which a crash leaves) and restored at start.
func TestPinsSurviveARestart(t *testing.T) {
	backends := []*fakeVLLM{startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1), startFakeVLLM(t, "c", 1)}
	data := t.TempDir()
	first := startFleetIn(t, data, restartBlock, backends...)
	convs := testrun.Sessions("restart", 20)
	home := pinAll(t, first, convs)
	used := map[string]bool{}
	for _, b := range home {
		used[b] = true
	}
	if len(used) != len(backends) {
		t.Fatalf("20 conversations placed on %v: the check needs every replica", used)
	}
	if err := first.caddy.Stop(); err != nil { // SIGINT: Caddy exits cleanly
		t.Fatal(err)
	}

	second := startFleetWith(t, caddySetup{modelBlock: restartBlock, dataDir: data, fields: map[string]any{"pin_snapshot_interval": "1s"}}, backends...)
	if st := pinSnapshot(t, second); st.Restored != 20 || st.Dropped != 0 || st.LoadError != "" {
		t.Fatalf("restored at start: %+v", st)
	}
	for _, c := range convs {
		if served := second.turn(t, c); served != home[c] {
			t.Errorf("after the restart %s served by %s, pinned to %s", c, served, home[c])
		}
	}
	if st := second.status(t); placed(st) != 0 || st.StickyPercent != 100 {
		t.Errorf("after the restart: %d conversations placed anew, sticky %.1f%%", placed(st), st.StickyPercent)
	}

	// A crash: what the last periodic write saw comes back.
	late := testrun.Sessions("late", 5)
	for c, b := range pinAll(t, second, late) {
		home[c] = b
	}
	testrun.Eventually(t, 10*time.Second, "a periodic write of all 25 conversations", func() bool {
		return pinSnapshot(t, second).LastWritePins == 25
	})
	if err := syscall.Kill(second.caddy.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = second.caddy.Stop() // waits for the killed process

	third := startFleetIn(t, data, restartBlock, backends...)
	if st := pinSnapshot(t, third); st.Restored != 25 || st.Dropped != 0 {
		t.Fatalf("restored after a crash: %+v", st)
	}
	for _, c := range append(convs, late...) {
		if served := third.turn(t, c); served != home[c] {
			t.Errorf("after the crash %s served by %s, pinned to %s", c, served, home[c])
		}
	}
}

// Pins on a replica the new config no longer lists are dropped, and their
// conversations placed anew: on the new replica, as the restored ones count
// as load on theirs.
func TestRestartDropsPinsOfARemovedReplica(t *testing.T) {
	a, b, c, d := startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1), startFakeVLLM(t, "c", 1), startFakeVLLM(t, "d", 1)
	data := t.TempDir()
	first := startFleetIn(t, data, restartBlock, a, b, c)
	convs := testrun.Sessions("moved", 21)
	home := pinAll(t, first, convs)
	onC := 0
	for _, served := range home {
		if served == "c/0" {
			onC++
		}
	}
	if onC == 0 {
		t.Fatalf("no conversation placed on c: %v", home)
	}
	if err := first.caddy.Stop(); err != nil {
		t.Fatal(err)
	}

	// c replaced by d; d is placed on by load, so its scrapes get time.
	second := startFleetWith(t, caddySetup{modelBlock: restartBlock, dataDir: data, fields: slowScrapes}, a, b, d)
	if st := pinSnapshot(t, second); st.Restored != 21-onC || st.DroppedUnknownReplica != onC || st.Dropped != onC {
		t.Fatalf("restored without c (%d pinned there): %+v", onC, st)
	}
	for _, conv := range convs {
		want := home[conv]
		if want == "c/0" {
			want = "d/0"
		}
		if served := second.turn(t, conv); served != want {
			t.Errorf("%s, pinned to %s before, served by %s; want %s", conv, home[conv], served, want)
		}
	}
	if n := placed(second.status(t)); n != uint64(onC) {
		t.Errorf("%d conversations placed anew, want the %d of c", n, onC)
	}
}

// Pins idle longer than the new config's session_ttl are dropped.
func TestRestartDropsExpiredPins(t *testing.T) {
	backends := []*fakeVLLM{startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1)}
	data := t.TempDir()
	first := startFleetIn(t, data, restartBlock, backends...)
	pinAll(t, first, testrun.Sessions("expired", 10))
	if err := first.caddy.Stop(); err != nil {
		t.Fatal(err)
	}

	// Every pin was last used before the first Caddy stopped, longer ago
	// than a millisecond by the time the second starts.
	second := startFleetWith(t, caddySetup{modelBlock: restartBlock, dataDir: data, fields: map[string]any{"session_ttl": "1ms"}}, backends...)
	if st := pinSnapshot(t, second); st.Restored != 0 || st.DroppedExpired != 10 || st.Dropped != 10 {
		t.Fatalf("restored with session_ttl 1ms: %+v", st)
	}
	if st := second.status(t); st.Sessions != 0 {
		t.Errorf("%d sessions after dropping every pin", st.Sessions)
	}
}
