package main

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmwarden/caddy-warden/bench/report"
)

func TestLabWritesTableJSONAndPlots(t *testing.T) {
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "lab.json")
	out, rows := runForRows(t, jsonPath, "lab",
		"--sessions", "2,4", "--duration", "15s", "--seeds", "1,2", "--policies", "warden,vllm",
		"--num-gpu-blocks", "3000", "--turns", "3", "--plots", dir)
	if len(rows) != 2*2*2 {
		t.Fatalf("%d rows, want 8", len(rows))
	}
	for _, r := range rows {
		if r.Mode != report.ModeLab || r.DurationS != 15 || !slices.Contains([]int{2, 4}, r.Sessions) {
			t.Fatalf("row %+v", r)
		}
	}
	for _, want := range []string{"seed on", "warden", "vllm", "±", report.TTFBPlot, jsonPath} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestLabWithPeopleGivesEachItsRows(t *testing.T) {
	dir := t.TempDir()
	for _, flows := range []string{"true", "false"} {
		out, rows := runForRows(t, filepath.Join(dir, "people-"+flows+".json"), "lab",
			"--people", "farm:3:0s,person:1:20s", "--flows="+flows, "--duration", "15s", "--seeds", "1",
			"--policies", "warden-admission", "--num-gpu-blocks", "3000", "--turns", "3")
		if len(rows) != 2 || rows[0].Person != "farm" || rows[0].Sessions != 3 || rows[1].Person != "person" || rows[1].Sessions != 1 {
			t.Fatalf("--flows=%s: rows %+v", flows, rows)
		}
		for _, want := range []string{"warden-admission farm", "warden-admission person"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
	}
	var stdout, stderr bytes.Buffer
	if code := mainWithArgs(context.Background(), []string{"lab", "--people", "farm:0:1s"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "--people") {
		t.Errorf("a person without sessions: exit %d, %s", code, stderr.String())
	}
}

func TestNoteUntimedConversations(t *testing.T) {
	var out bytes.Buffer
	rows := []report.Row{{ConversationsTimed: 7, ConversationsCut: 2}, {ConversationsTimed: 0, ConversationsCut: 1}}
	noteUntimedConversations(&out, rows)
	if !strings.Contains(out.String(), "leave out 3 of the 10 conversations") {
		t.Errorf("note reads %q", out.String())
	}
	out.Reset()
	noteUntimedConversations(&out, []report.Row{{ConversationsTimed: 7}})
	if out.Len() != 0 {
		t.Errorf("a note with every conversation timed: %q", out.String())
	}
}

// runForRows runs wardenbench with args and --json jsonPath, and returns
// its output and the rows it wrote.
func runForRows(t *testing.T, jsonPath string, args ...string) (string, []report.Row) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := mainWithArgs(context.Background(), append(args, "--json", jsonPath), &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	rows, err := report.ReadJSON(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	return stdout.String(), rows
}

func TestFlagsAndSubcommandErrors(t *testing.T) {
	var stdout, stderr bytes.Buffer
	run := func(args ...string) int {
		stdout.Reset()
		stderr.Reset()
		return mainWithArgs(context.Background(), args, &stdout, &stderr)
	}
	if code := run("lab", "--policies", "warden,nosuch", "--sessions", "1", "--duration", "1s"); code != 1 || !strings.Contains(stderr.String(), "nosuch") {
		t.Errorf("unknown policy: exit %d, %s", code, stderr.String())
	}
	if code := run("lab", "--sessions", "4,x"); code != 1 {
		t.Errorf("bad level list: exit %d", code)
	}
	if code := run("lab", "--profile", "nosuch"); code != 1 || !strings.Contains(stderr.String(), "unknown profile") {
		t.Errorf("unknown profile: exit %d, %s", code, stderr.String())
	}
	if code := run("frobnicate"); code != 2 {
		t.Errorf("unknown subcommand: exit %d", code)
	}
	if code := run("lab", "-h"); code != 0 || !strings.Contains(stderr.String(), "-max-num-seqs") {
		t.Errorf("help: exit %d, %s", code, stderr.String())
	}
	if code := run("run", "--topology", "mesh"); code != 1 || !strings.Contains(stderr.String(), "topology") {
		t.Errorf("bad topology: exit %d, %s", code, stderr.String())
	}
}

func TestProfileNameIsFoundBeforeParsing(t *testing.T) {
	for args, want := range map[string]string{
		"":                            "a4000-qwen3-4b",
		"--profile x --seed 2":        "x",
		"-seed 2 -profile=y":          "y",
		"--policies profile --seed 1": "a4000-qwen3-4b",
	} {
		if got := profileName(strings.Fields(args)); got != want {
			t.Errorf("profileName(%q) = %q, want %q", args, got, want)
		}
	}
	var l intList
	if err := l.Set("4, 8,16"); err != nil || !slices.Equal(l, intList{4, 8, 16}) {
		t.Errorf("intList: %v, %v", l, err)
	}
	if err := l.Set("0"); err == nil {
		t.Error("accepted level 0")
	}
	if err := new(stringList).Set(" , "); err == nil {
		t.Error("accepted an empty policy list")
	}
}

func TestRunSetups(t *testing.T) {
	for _, c := range []struct {
		opts runOptions
		want []setup
	}{
		{runOptions{}, []setup{{1, "none"}}},
		{runOptions{Instances: 3, PinStore: "redis", Compare: true}, []setup{{1, "none"}, {3, "none"}, {3, "redis"}}},
		{runOptions{Instances: 3, PinStore: "none", Compare: true}, []setup{{1, "none"}, {3, "none"}}},
		{runOptions{Instances: 3, PinStore: "redis"}, []setup{{3, "redis"}}},
		{runOptions{Instances: 1, PinStore: "redis", Compare: true}, []setup{{1, "redis"}}},
	} {
		if got := c.opts.setups(); !slices.Equal(got, c.want) {
			t.Errorf("%+v: %v, want %v", c.opts, got, c.want)
		}
	}
}
