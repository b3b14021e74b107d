package report

import (
	"bytes"
	"strings"
	"testing"
)

func TestSetupsTableLabelsAndChecks(t *testing.T) {
	row := func(instances int, store string, hits, turns float64, spread int) Row {
		return Row{Mode: ModeRun, Policy: "warden", Sessions: 8, Seed: 1, Instances: instances, PinStore: store,
			PrefixHitPercent: hits, TurnsOnReplicaPercent: turns, NewSpread: spread, OutputTokensPerMin: 9000}
	}
	rows := []Row{
		{Mode: ModeRun, Policy: "warden", Sessions: 8, Seed: 1, PrefixHitPercent: 86, TurnsOnReplicaPercent: 100, NewSpread: 1},
		row(3, "none", 77, 47, 2),
		row(3, "redis", 85.5, 99.5, 3),
	}
	if !HasSetups(rows) || HasSetups(rows[:1]) {
		t.Error("HasSetups")
	}
	if rows[0].Setup() != "" || rows[1].Setup() != "×3 none" || (Row{Instances: 1, PinStore: "redis"}).Setup() != "×1 redis" {
		t.Errorf("setups %q %q", rows[0].Setup(), rows[1].Setup())
	}
	var out bytes.Buffer
	if err := PrintSetups(&out, rows); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{"Conv p50 (s)", "Conv p95 (s)", "1 instance", "×3 none", "×3 redis",
		"hits 85.5% vs 86.0% (-0.5 points): ok",
		"turns on their conversation's replica 99.50%: ok",
		"spread 3.0 vs 1.0: MISSED",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in\n%s", want, text)
		}
	}
	if strings.Contains(text, "warden ×3 none: hits") {
		t.Errorf("a setup without a store was checked:\n%s", text)
	}
	// The main table keeps one line per setup.
	out.Reset()
	if err := PrintTable(&out, rows); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "warden ×3 redis") {
		t.Errorf("main table:\n%s", out.String())
	}
}
