package report

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/palette/moreland"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// heatmapColors is how many steps the heat maps' palette has.
const heatmapColors = 64

// minHeatmapRange is the smallest ratio drawn at full color, so that a map
// of near-ties does not paint a 1% difference as a rout.
const minHeatmapRange = 1.1

// WriteHeatmaps draws, for each compared column, ours over the best
// baseline in every cell of one workload: think time up, sessions across,
// one panel per replica count. Color is on a log scale around 1, green
// where ours is better, red where worse, the same scale in every panel;
// each cell shows the ratio and the verdict. It writes one PNG per column
// into dir and returns their paths.
func WriteHeatmaps(dir string, cells []GridCell, ours string) ([]string, error) {
	if len(cells) == 0 {
		return nil, errNoRows
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var paths []string
	for i, col := range versusColumns {
		path := filepath.Join(dir, col.name+".png")
		if err := saveHeatmap(path, cells, i, ours); err != nil {
			return paths, fmt.Errorf("heat map %s: %w", path, err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// ratioGrid is one panel's cells: z is how much worse ours is (the log of
// the ratio, negated where higher is better), so that one palette reads the
// same for every column.
type ratioGrid struct {
	thinks   []float64
	sessions []int
	z        [][]float64 // [think][sessions]
	labels   plotter.XYLabels
}

func (g ratioGrid) Dims() (c, r int)   { return len(g.sessions), len(g.thinks) }
func (g ratioGrid) Z(c, r int) float64 { return g.z[r][c] }
func (g ratioGrid) X(c int) float64    { return float64(c) }
func (g ratioGrid) Y(r int) float64    { return float64(r) }

func newRatioGrid(cells []GridCell, column, replicas int, thinks []float64, sessions []int) ratioGrid {
	g := ratioGrid{thinks: thinks, sessions: sessions, z: make([][]float64, len(thinks))}
	for r := range g.z {
		g.z[r] = slices.Repeat([]float64{math.NaN()}, len(sessions))
	}
	for _, c := range cells {
		if c.Replicas != replicas {
			continue
		}
		v := c.Columns[column]
		row, col := slices.Index(thinks, c.ThinkTimeS), slices.Index(sessions, c.Sessions)
		g.z[row][col] = math.Log(v.Ratio())
		if versusColumns[column].higherIsBetter {
			g.z[row][col] = -g.z[row][col]
		}
		g.labels.XYs = append(g.labels.XYs, plotter.XY{X: float64(col), Y: float64(row)})
		g.labels.Labels = append(g.labels.Labels, formatRatio(v.Ratio())+"\n"+string(v.Verdict))
	}
	return g
}

func saveHeatmap(path string, cells []GridCell, column int, ours string) error {
	var thinks []float64
	var sessions, replicas []int
	for _, c := range cells {
		thinks, sessions, replicas = append(thinks, c.ThinkTimeS), append(sessions, c.Sessions), append(replicas, c.Replicas)
	}
	slices.Sort(thinks)
	slices.Sort(sessions)
	slices.Sort(replicas)
	thinks, sessions, replicas = slices.Compact(thinks), slices.Compact(sessions), slices.Compact(replicas)

	grids := make([]ratioGrid, len(replicas))
	extent := math.Log(minHeatmapRange)
	for i, n := range replicas {
		grids[i] = newRatioGrid(cells, column, n, thinks, sessions)
		for _, row := range grids[i].z {
			for _, z := range row {
				if !math.IsNaN(z) && !math.IsInf(z, 0) {
					extent = max(extent, math.Abs(z))
				}
			}
		}
	}
	colors := moreland.SmoothGreenRed()
	colors.SetMin(-extent)
	colors.SetMax(extent)
	pal := colors.Palette(heatmapColors)

	plots := make([]*plot.Plot, len(replicas))
	for i, g := range grids {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s, %s ÷ best baseline: %d replicas", versusColumns[column].header, ours, replicas[i])
		p.X.Label.Text = "concurrent sessions"
		p.Y.Label.Text = "mean think time"
		p.X.Tick.Marker = indexTicks(sessions, strconv.Itoa)
		p.Y.Tick.Marker = indexTicks(thinks, thinkLabel)
		heat := plotter.NewHeatMap(g, pal)
		heat.Min, heat.Max = -extent, extent
		heat.NaN = color.White
		p.Add(heat)
		labels, err := plotter.NewLabels(g.labels)
		if err != nil {
			return err
		}
		for j := range labels.TextStyle {
			labels.TextStyle[j].XAlign, labels.TextStyle[j].YAlign = text.XCenter, text.YCenter
		}
		p.Add(labels)
		plots[i] = p
	}
	img := vgimg.New(panelWidth*vg.Length(len(plots)), panelHeight)
	canvases := plot.Align([][]*plot.Plot{plots}, panelTiles(len(plots)), draw.New(img))
	for i, p := range plots {
		p.Draw(canvases[0][i])
	}
	return savePNG(path, img)
}

// indexTicks labels the columns or rows of a grid plotted at 0, 1, 2...
func indexTicks[T any](values []T, label func(T) string) plot.ConstantTicks {
	ticks := make(plot.ConstantTicks, len(values))
	for i, v := range values {
		ticks[i] = plot.Tick{Value: float64(i), Label: label(v)}
	}
	return ticks
}
