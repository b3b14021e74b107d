package livemodel

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/fleet"
	"github.com/lmwarden/caddy-warden/pinsnapshot"
	"github.com/lmwarden/caddy-warden/selection"
)

// pinsSpec is a model of three replicas whose pins are written to storage.
func pinsSpec(storage pinsnapshot.Storage) Spec {
	var replicas []selection.Replica
	for _, addr := range []string{"127.0.0.1:9", "127.0.0.1:10", "127.0.0.1:11"} {
		replicas = append(replicas, selection.Replica{ID: addr, Address: addr})
	}
	return Spec{
		Fleet:               fleet.Spec{Routing: selection.Config{Affinity: true}, Replicas: replicas},
		PinSnapshotInterval: 30 * time.Second,
		Storage:             storage,
		Logger:              zap.NewNop(),
	}
}

// startModel creates the model, as a new process does, and activates a
// config's version of it.
func startModel(t *testing.T, name string, storage pinsnapshot.Storage) *Load {
	t.Helper()
	m := New(name, time.Second, zap.NewNop())
	m.ReadPins(storage, zap.NewNop())
	l := m.Prepare(pinsSpec(storage))
	m.Activate(l, time.Now())
	return l
}

// stopModel deactivates the only config using the model, which writes its
// pins, and closes the model, as a process does at exit.
func stopModel(t *testing.T, l *Load) {
	t.Helper()
	if !l.Model().Deactivate(l, time.Now()) {
		t.Fatal("the only config's stop is not the model's last")
	}
	l.Model().Close()
}

// The model's state is rebuilt from scratch, as in a new process: what the
// last stop wrote comes back at the next start, and an idle stop rewrites
// nothing.
func TestPinsComeBackWithTheModel(t *testing.T) {
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	l := startModel(t, "pins-unit", storage)
	home := map[string]string{}
	for c := range 20 {
		key := fmt.Sprint("conv-", c)
		d := l.Plan().View().Pick(selection.Request{Key: key, Now: time.Now()})
		rep, _ := d.Replica()
		home[key] = rep.ID
		d.Release()
	}
	stopModel(t, l)
	if st := l.PinSnapshot(); st.LastWritePins != 20 || st.WriteError != "" || st.LastWritten.IsZero() {
		t.Fatalf("written at stop: %+v", st)
	}
	if !storage.Exists(context.Background(), "warden/pins-unit/pins") {
		t.Fatal("no snapshot in the storage")
	}

	// Restored as the config is prepared, before it starts: Caddy may
	// start serving it before the warden app starts.
	m := New("pins-unit", time.Second, zap.NewNop())
	m.ReadPins(storage, zap.NewNop())
	l = m.Prepare(pinsSpec(storage))
	if st := l.PinSnapshot(); st.Restored != 20 || st.Dropped != 0 || st.LoadError != "" {
		t.Fatalf("restored as the config is prepared: %+v", st)
	}
	for key, want := range home {
		d := l.Plan().View().Pick(selection.Request{Key: key, Now: time.Now()})
		if rep, _ := d.Replica(); rep.ID != want || d.Outcome != selection.Sticky {
			t.Errorf("%s before the config started: %v on %s, pinned to %s before", key, d.Outcome, rep.ID, want)
		}
		d.Release()
	}
	m.Activate(l, time.Now())
	for key, want := range home {
		d := l.Plan().View().Pick(selection.Request{Key: key, Now: time.Now()})
		if rep, _ := d.Replica(); rep.ID != want || d.Outcome != selection.Sticky {
			t.Errorf("%s: %v on %s, pinned to %s before", key, d.Outcome, rep.ID, want)
		}
		d.Release()
	}
	stopModel(t, l)

	l = startModel(t, "pins-unit", storage)
	stopModel(t, l) // nothing routed: no write
	if st := l.PinSnapshot(); !st.LastWritten.IsZero() || st.Restored != 20 {
		t.Errorf("an idle start and stop: %+v", st)
	}
}

// A damaged snapshot is reported and ignored: the model starts empty and
// routes.
func TestUnreadablePinSnapshotIsIgnored(t *testing.T) {
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	if err := storage.Store(context.Background(), "warden/pins-bad/pins", []byte("WPIN\x01 not really")); err != nil {
		t.Fatal(err)
	}
	l := startModel(t, "pins-bad", storage)
	defer stopModel(t, l)
	if st := l.PinSnapshot(); st.LoadError == "" || st.Restored != 0 {
		t.Errorf("status: %+v", st)
	}
	d := l.Plan().View().Pick(selection.Request{Key: "k", Now: time.Now()})
	if d.Outcome != selection.Placed {
		t.Errorf("first request after a damaged snapshot: %v", d.Outcome)
	}
	d.Release()
}
