package caddymodule

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

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
