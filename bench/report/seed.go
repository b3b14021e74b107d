package report

import "math"

// notMeasured marks a column the seed's table leaves empty.
var notMeasured = math.NaN()

// SeedRows is the seed's table (DESIGN §1: 4 x RTX A4000, Qwen3-4B, vLLM 0.26,
// 3 minutes per level), one row per level for affinity off (policy "off",
// vLLM's own balancer behind it) and one for affinity on (policy "warden").
// The seed reported "stayed on replica" for affinity on only (NaN for off);
// the columns it lacks (hit bound, preemptions, errors) show as "-".
var SeedRows = []Row{
	seedRow("off", 4, 180, 5886, 2.05, 3.5, 2.71, 56.2, notMeasured),
	seedRow("warden", 4, 240, 6744, 0.38, 2.84, 2.83, 86.4, 100),
	seedRow("off", 8, 300, 8364, 2.33, 6.32, 3.74, 44.3, notMeasured),
	seedRow("warden", 8, 380, 10752, 0.48, 5.03, 3.74, 86.1, 100),
	seedRow("off", 16, 300, 9558, 3.25, 26.24, 3.91, 33.2, notMeasured),
	seedRow("warden", 16, 360, 12204, 0.85, 24.88, 3.69, 48.6, 100),
	seedRow("off", 24, 300, 9048, 5.06, 58.82, 3.91, 32.8, notMeasured),
	seedRow("warden", 24, 420, 11178, 13.14, 38.34, 4, 37.9, 89.1),
	seedRow("off", 32, 520, 14760, 12.32, 82.84, 4, 31.6, notMeasured),
	seedRow("warden", 32, 620, 16638, 27.66, 38.92, 4, 31.6, 67.3),
}

func seedRow(policy string, sessions int, perHour, tokPerMin, p50, p95, busy, hits, stayed float64) Row {
	return Row{
		Mode: ModeSeed, Policy: policy, Sessions: sessions, DurationS: 180, Replicas: 4, Topology: "ranks",
		SessionsPerHour: perHour, OutputTokensPerMin: tokPerMin, TTFBP50S: p50, TTFBP95S: p95,
		ReplicasBusy: busy, PrefixHitPercent: hits, StayedPercent: stayed,
	}
}

// SeedFor returns the seed's rows at the levels present in rows, so a table of
// a partial run shows only the comparable seed numbers.
func SeedFor(rows []Row) []Row {
	levels := map[int]bool{}
	for _, r := range rows {
		levels[r.Sessions] = true
	}
	var out []Row
	for _, s := range SeedRows {
		if levels[s.Sessions] {
			out = append(out, s)
		}
	}
	return out
}
