package main

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmwarden/caddy-warden/bench/lab"
)

// The lab with a small model gives each model its rows; the grid, which
// weighs one row per policy and cell, refuses it.
func TestLabWithASmallModelGivesEachModelItsRows(t *testing.T) {
	out, rows := runForRows(t, filepath.Join(t.TempDir(), "models.json"), "lab",
		"--small-model", "qwen3-0.6b", "--small-replicas", "2", "--replicas", "2", "--sessions", "3",
		"--duration", "15s", "--seeds", "1", "--policies", "warden", "--turns", "3")
	if len(rows) != 2 || rows[0].Model != "Qwen/Qwen3-4B-Instruct-2507" || rows[1].Model != "qwen3-0.6b" || rows[1].Replicas != 2 || rows[1].Requests == 0 {
		t.Fatalf("rows %+v", rows)
	}
	if !strings.Contains(out, "warden qwen3-0.6b") {
		t.Errorf("output lacks the small model's row:\n%s", out)
	}
	var stdout, stderr bytes.Buffer
	if code := mainWithArgs(context.Background(), []string{"grid", "--small-model", "x"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "--small-model") {
		t.Errorf("grid with a small model: exit %d, %s", code, stderr.String())
	}
}

// run takes the lab's --people, their sessions in all as its one level,
// and --small-replicas only with a small model.
func TestRunTakesPeopleAndASmallModel(t *testing.T) {
	opts, err := parseRunOptions([]string{"--people", "two", "--flows=false", "--small-replicas", "3"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	o := opts.e2eOptions(1, setup{instances: 1}, nil)
	if len(o.People) != 2 || o.People[0] != lab.TwoPeople[0] || !o.OneFlow || len(o.Sessions) != 1 || o.Sessions[0] != 22 || o.SmallReplicas != 0 {
		t.Errorf("options %+v", o)
	}
	opts, err = parseRunOptions([]string{"--small-model", "qwen3-0.6b", "--small-replicas", "3"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o := opts.e2eOptions(1, setup{instances: 1}, nil); o.SmallReplicas != 3 || o.Workload.SmallModel != "qwen3-0.6b" || o.People != nil {
		t.Errorf("options %+v", o)
	}
	if _, err := parseRunOptions([]string{"--people", "farm:x:1s"}, io.Discard); err == nil || !strings.Contains(err.Error(), "--people") {
		t.Errorf("bad people: %v", err)
	}
}
