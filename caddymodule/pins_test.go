package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/selection"
)

func pinsConfig() *ModelConfig {
	return &ModelConfig{Replicas: []ReplicaConfig{{Address: "127.0.0.1:9"}, {Address: "127.0.0.1:10"}, {Address: "127.0.0.1:11"}}}
}

// startModel provisions and starts a config's version of the model, as
// App.Provision and App.Start do.
func startModel(t *testing.T, name string, storage certmagic.Storage) *modelLoad {
	t.Helper()
	l, err := loadModel(name, pinsConfig(), nil, storage, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	l.model.activate(l)
	return l
}

// stopModel stops and cleans up the only config using the model, as
// App.Stop and App.Cleanup do at exit.
func stopModel(t *testing.T, l *modelLoad) {
	t.Helper()
	if !l.model.deactivate(l) {
		t.Fatal("the only config's stop is not the model's last")
	}
	l.model.writePins(l, time.Now())
	if _, err := models.Delete(l.model.name); err != nil {
		t.Fatal(err)
	}
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
		d := l.plan.View().Pick(selection.Request{Key: key, Now: time.Now()})
		rep, _ := d.Replica()
		home[key] = rep.ID
		d.Release()
	}
	stopModel(t, l)
	if st := l.model.pinStatus(l); st.LastWritePins != 20 || st.WriteError != "" || st.LastWritten.IsZero() {
		t.Fatalf("written at stop: %+v", st)
	}
	if !storage.Exists(context.Background(), "warden/pins-unit/pins") {
		t.Fatal("no snapshot in the storage")
	}

	l = startModel(t, "pins-unit", storage)
	if st := l.model.pinStatus(l); st.Restored != 20 || st.Dropped != 0 || st.LoadError != "" {
		t.Fatalf("restored at start: %+v", st)
	}
	for key, want := range home {
		d := l.plan.View().Pick(selection.Request{Key: key, Now: time.Now()})
		if rep, _ := d.Replica(); rep.ID != want || d.Outcome != selection.Sticky {
			t.Errorf("%s: %v on %s, pinned to %s before", key, d.Outcome, rep.ID, want)
		}
		d.Release()
	}
	stopModel(t, l)

	l = startModel(t, "pins-unit", storage)
	stopModel(t, l) // nothing routed: no write
	if st := l.model.pinStatus(l); !st.LastWritten.IsZero() || st.Restored != 20 {
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
	if st := l.model.pinStatus(l); st.LoadError == "" || st.Restored != 0 {
		t.Errorf("status: %+v", st)
	}
	d := l.plan.View().Pick(selection.Request{Key: "k", Now: time.Now()})
	if d.Outcome != selection.Placed {
		t.Errorf("first request after a damaged snapshot: %v", d.Outcome)
	}
	d.Release()
}

// Every model name is one segment under warden/, and distinct names have
// distinct keys.
func TestPinSnapshotKeyStaysUnderWarden(t *testing.T) {
	seen := map[string]string{}
	for _, name := range []string{"qwen3", "Qwen3", ".", "..", "../../etc", "a/b", "a%2Fb", "%2E", "with space"} {
		key := pinSnapshotKey(name)
		parts := strings.Split(path.Clean(key), "/")
		if len(parts) != 3 || parts[0] != "warden" || parts[1] == ".." || parts[1] == "." || parts[2] != "pins" {
			t.Errorf("model %q: key %q", name, key)
		}
		if other, dup := seen[key]; dup {
			t.Errorf("models %q and %q share key %q", name, other, key)
		}
		seen[key] = name
	}
}

// pin_snapshot_interval takes a duration, or off or 0 (written as 0, which
// JSON configs use too); left out, snapshots are on every 30 s.
func TestPinSnapshotIntervalOption(t *testing.T) {
	for _, tc := range []struct {
		field string
		want  time.Duration
		err   string
	}{
		{"", defaultPinSnapshotInterval, ""},
		{`, "pin_snapshot_interval": "5s"`, 5 * time.Second, ""},
		{`, "pin_snapshot_interval": 0`, 0, ""},
		{`, "pin_snapshot_interval": "-1s"`, 0, "pin_snapshot_interval must not be negative (0 turns snapshots off)"},
	} {
		var m ModelConfig
		err := json.Unmarshal([]byte(`{"replicas": [{"address": "127.0.0.1:9"}]`+tc.field+`}`), &m)
		if err == nil {
			err = m.validate("m")
		}
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.field, err, tc.err)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.field, err)
		case m.pinSnapshotInterval() != tc.want:
			t.Errorf("%q: interval %v, want %v", tc.field, m.pinSnapshotInterval(), tc.want)
		}
	}
}

// A periodic write at 100,000 conversations, as the sweeper makes it: copy,
// encode and store in the file system (write a temporary file, rename).
func BenchmarkWritePins100k(b *testing.B) {
	cfg := pinsConfig()
	cfg.MaxSessions = 200_000 // no shard full
	l, err := loadModel("pins-bench", cfg, nil, &certmagic.FileStorage{Path: b.TempDir()}, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	defer models.Delete("pins-bench")
	l.model.activate(l)
	defer l.model.deactivate(l)
	now := time.Now()
	for i := range 100_000 { // used over the last 30 minutes
		at := now.Add(-30 * time.Minute).Add(time.Duration(i) * 18 * time.Millisecond)
		l.plan.View().Pick(selection.Request{Key: fmt.Sprint("conv-", i), Now: at}).Release()
	}
	for b.Loop() {
		l.model.pins.written = 0 // as if a request came since the last write
		l.model.writePins(l, now)
	}
	st := l.model.pinStatus(l)
	if st.LastWritePins != 100_000 || st.WriteError != "" {
		b.Fatalf("%+v", st)
	}
	b.ReportMetric(float64(st.LastWriteBytes), "bytes")
}
