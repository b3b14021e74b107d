package pinsnapshot

import (
	"fmt"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/fleet"
	"github.com/lmwarden/caddy-warden/selection"
)

// Every model name is one segment under warden/, and distinct names have
// distinct keys.
func TestPinSnapshotKeyStaysUnderWarden(t *testing.T) {
	seen := map[string]string{}
	for _, name := range []string{"qwen3", "Qwen3", ".", "..", "../../etc", "a/b", "a%2Fb", "%2E", "with space"} {
		key := key(name)
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

// A periodic write at 100,000 conversations, as the sweeper makes it: copy,
// encode and store in the file system (write a temporary file, rename).
func BenchmarkWritePins100k(b *testing.B) {
	f := fleet.New("pins-bench", time.Second, time.Now(), nil)
	var replicas []selection.Replica
	for _, addr := range []string{"127.0.0.1:9", "127.0.0.1:10", "127.0.0.1:11"} {
		replicas = append(replicas, selection.Replica{ID: addr, Address: addr})
	}
	plan := f.Prepare(fleet.Spec{Routing: selection.Config{Affinity: true, MaxSessions: 200_000}, Replicas: replicas}) // no shard full
	f.Apply(plan)
	now := time.Now()
	for i := range 100_000 { // used over the last 30 minutes
		at := now.Add(-30 * time.Minute).Add(time.Duration(i) * 18 * time.Millisecond)
		plan.View().Pick(selection.Request{Key: fmt.Sprint("conv-", i), Now: at}).Release()
	}
	s := New("pins-bench")
	storage := &certmagic.FileStorage{Path: b.TempDir()}
	for b.Loop() {
		s.written = 0 // as if a request came since the last write
		s.Write(storage, plan.View(), f.Pins, now, zap.NewNop())
	}
	st := s.Status()
	if st.LastWritePins != 100_000 || st.WriteError != "" {
		b.Fatalf("%+v", st)
	}
	b.ReportMetric(float64(st.LastWriteBytes), "bytes")
}
