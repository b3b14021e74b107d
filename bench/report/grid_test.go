package report

import (
	"bytes"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cellRows are versusRows in one cell of a grid.
func cellRows(workload string, think float64, replicas, sessions int) []Row {
	rows := versusRows()
	for i := range rows {
		rows[i].Workload, rows[i].ThinkTimeS, rows[i].Replicas, rows[i].Sessions = workload, think, replicas, sessions
	}
	return rows
}

// gridRows fill every cell of think {3, 30} x replicas {4, 8} x sessions
// {8, 16}, plus one variant cell, in the order a grid runs them.
func gridRows() []Row {
	var rows []Row
	for _, think := range []float64{30, 3} {
		for _, replicas := range []int{8, 4} {
			for _, sessions := range []int{16, 8} {
				rows = append(rows, cellRows("default", think, replicas, sessions)...)
			}
		}
	}
	return append(rows, cellRows("turns-20", 3, 4, 16)...)
}

func TestCompareGridOrdersCellsByWorkloadReplicasThinkSessions(t *testing.T) {
	cells, err := CompareGrid(gridRows(), "warden")
	if err != nil {
		t.Fatal(err)
	}
	if len(cells) != 9 {
		t.Fatalf("%d cells, want 9", len(cells))
	}
	first, last := cells[0], cells[len(cells)-1]
	if first.Workload != "default" || first.Replicas != 4 || first.ThinkTimeS != 3 || first.Sessions != 8 {
		t.Errorf("first cell %+v", first)
	}
	if cells[7].Replicas != 8 || cells[7].ThinkTimeS != 30 || cells[7].Sessions != 16 {
		t.Errorf("last default cell %+v", cells[7])
	}
	if last.Workload != "turns-20" {
		t.Errorf("last cell %+v", last)
	}
	broken := append(gridRows(), cellRows("default", 3, 2, 8)[2:]...)
	if _, err := CompareGrid(broken, "warden"); err == nil || !strings.Contains(err.Error(), "2 replicas") {
		t.Errorf("a cell without warden: %v", err)
	}
}

func TestPrintGridShowsOursBestAndVerdicts(t *testing.T) {
	cells, err := CompareGrid(cellRows("default", 3, 4, 8), "warden")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := PrintGrid(&out, cells, "warden"); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"| default  | 3s    | 4        | 8        | **warden**",
		"best baseline | b 96±1", "a 0.50±0.00",
		"warden ÷ best | 1.09 win", "2.00 loss", "1.00 tie",
		"Output tok/min  1 win,  0 tie,  0 loss",
		"TTFB p95 (s)    0 win,  1 tie,  0 loss",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in\n%s", want, text)
		}
	}
}

func TestHeatmapsArePanelsPerReplicaCount(t *testing.T) {
	cells, err := CompareGrid(gridRows(), "warden")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "grid")
	// A missing cell (8 replicas, 30 s, 16 sessions) stays blank.
	paths, err := WriteHeatmaps(dir, cells[:7], "warden")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != len(versusColumns) {
		t.Fatalf("wrote %v", paths)
	}
	for _, p := range paths {
		if b := decodePNG(t, p).Bounds(); b.Dx() < 2*b.Dy() {
			t.Errorf("%s should hold two panels side by side, is %dx%d", p, b.Dx(), b.Dy())
		}
	}
	if _, err := WriteHeatmaps(dir, nil, "warden"); err == nil {
		t.Error("drew no cells")
	}
}

func decodePNG(t *testing.T, path string) image.Image {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return img
}
