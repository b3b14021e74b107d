package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/bench/lab"
)

func TestGridWritesTablesJSONAndHeatmaps(t *testing.T) {
	dir := t.TempDir()
	jsonPath, plots := filepath.Join(dir, "grid.json"), filepath.Join(dir, "grid")
	out, rows := runForRows(t, jsonPath, "grid",
		"--think", "3s", "--sessions", "4", "--replicas", "2", "--variants", "first-2k",
		"--warmup", "5s", "--duration", "15s", "--seeds", "1,2", "--plots", plots)
	// The grid's cell, then the variant and the base workload at the variants' cell.
	type cell struct {
		workload string
		replicas int
		sessions int
	}
	policies := map[cell][]string{}
	for _, r := range rows {
		if r.ThinkTimeS != 3 || r.DurationS != 15 {
			t.Errorf("row %+v", r)
		}
		c := cell{r.Workload, r.Replicas, r.Sessions}
		if r.Seed == 1 {
			policies[c] = append(policies[c], r.Policy)
		}
	}
	vc := lab.VariantCell
	for _, c := range []cell{{lab.DefaultWorkload, 2, 4}, {lab.DefaultWorkload, vc.Replicas, vc.Sessions}, {"first-2k", vc.Replicas, vc.Sessions}} {
		if got := policies[c]; !slices.Equal(got, lab.DefaultPolicies) {
			t.Errorf("%+v ran %v, want every default policy", c, got)
		}
	}
	if len(rows) != 3*len(lab.DefaultPolicies)*2 {
		t.Errorf("%d rows", len(rows))
	}
	for _, want := range []string{"| default  | 3s    | 2        | 4        | **warden**", "best baseline", "warden ÷ best",
		"Workload variants at 3s think time, 16 sessions, 4 replicas", "| first-2k", "±"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, name := range []string{"output_tokens.png", "ttfb_p95.png"} {
		if info, err := os.Stat(filepath.Join(plots, name)); err != nil || info.Size() == 0 {
			t.Errorf("heat map %s: %v", name, err)
		}
	}
}

func TestGridFlagsReplaceTheSingleThinkTimeAndReplicas(t *testing.T) {
	var stdout, stderr bytes.Buffer
	for _, args := range [][]string{
		{"--think-time", "3s"}, {"--seed", "2"}, {"--think", "0s"}, {"--replicas", "4,x"}, {"--variants", "nosuch"},
	} {
		stderr.Reset()
		if code := mainWithArgs(context.Background(), append([]string{"grid"}, args...), &stdout, &stderr); code == 0 {
			t.Errorf("%v accepted", args)
		}
	}
	var l durationList
	if err := l.Set("3s, 1m"); err != nil || !slices.Equal(l, durationList{3 * time.Second, time.Minute}) || l.String() != "3s,1m0s" {
		t.Errorf("durationList: %v, %v", l, err)
	}
}
