package report

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Plot files written by WritePlots.
const (
	TTFBPlot         = "ttfb.png"
	PrefixHitsPlot   = "prefix_hits.png"
	OutputTokensPlot = "output_tokens.png"
)

const (
	panelWidth  = 14 * vg.Centimeter
	panelHeight = 10 * vg.Centimeter
	legendWidth = 4 * vg.Centimeter
)

// seedColor draws the seed's own measurements, dashed, apart from ours.
var seedColor = color.Gray{Y: 90}

// WritePlots draws rows against the number of sessions, one line per policy
// (the seed's own numbers dashed in grey, added when rows hold none), and
// writes three PNGs into dir: TTFB p50 and p95 on a log scale side by side,
// prefix hits, and output tokens per minute. Over several seeds each point is
// the mean with a standard-deviation bar. It returns the files' paths.
func WritePlots(dir string, rows []Row) ([]string, error) {
	if len(rows) == 0 {
		return nil, errNoRows
	}
	if !hasMode(rows, ModeSeed) {
		rows = append(SeedFor(rows), rows...)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	points, order := aggregate(rows)
	c := chart{points: points, order: order, mixed: mixedModes(order), levels: levels(points)}
	files := []struct {
		name   string
		panels []panel
	}{
		{TTFBPlot, []panel{
			{"Time to first token, median", "TTFB p50 (s)", ttfbP50, true},
			{"Time to first token, 95th percentile", "TTFB p95 (s)", ttfbP95, true},
		}},
		{PrefixHitsPlot, []panel{{"Prefix cache hits", "prompt tokens served from cache (%)", prefixHits, false}}},
		{OutputTokensPlot, []panel{{"Throughput", "output tokens per minute", outputPerMin, false}}},
	}
	var paths []string
	for _, f := range files {
		path := filepath.Join(dir, f.name)
		if err := c.save(path, f.panels); err != nil {
			return paths, fmt.Errorf("plot %s: %w", path, err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// panel is one plot of a metric against sessions.
type panel struct {
	title, yLabel string
	metric        metric
	logScale      bool
}

type chart struct {
	points []point
	order  []series
	mixed  bool
	levels []int
}

func levels(points []point) []int {
	var out []int
	for _, p := range points {
		if len(out) == 0 || out[len(out)-1] != p.sessions {
			out = append(out, p.sessions)
		}
	}
	return out
}

// save draws the panels side by side into one PNG, with one legend for all
// of them on the right, clear of the data.
func (c chart) save(path string, panels []panel) error {
	legend := plot.NewLegend()
	legend.Top, legend.Left = true, true
	plots := make([]*plot.Plot, len(panels))
	for i, pn := range panels {
		p, err := c.plot(pn, &legend, i == 0)
		if err != nil {
			return err
		}
		plots[i] = p
	}
	img := vgimg.New(panelWidth*vg.Length(len(panels))+legendWidth, panelHeight)
	dc := draw.New(img)
	canvases := plot.Align([][]*plot.Plot{plots}, panelTiles(len(panels)), draw.Crop(dc, 0, -legendWidth, 0, 0))
	for i, p := range plots {
		p.Draw(canvases[0][i])
	}
	legend.Draw(draw.Crop(dc, panelWidth*vg.Length(len(panels))+2*vg.Millimeter, 0, 0, -8*vg.Millimeter))
	return savePNG(path, img)
}

// panelTiles lays out panels side by side.
func panelTiles(panels int) draw.Tiles {
	return draw.Tiles{Rows: 1, Cols: panels, PadX: 5 * vg.Millimeter, PadTop: 2 * vg.Millimeter,
		PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter}
}

func savePNG(path string, img *vgimg.Canvas) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// plot draws one panel; the first one also fills the shared legend.
func (c chart) plot(pn panel, legend *plot.Legend, fillLegend bool) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = pn.title
	p.X.Label.Text = "concurrent sessions"
	p.Y.Label.Text = pn.yLabel
	p.Add(plotter.NewGrid())
	ticks := make(plot.ConstantTicks, len(c.levels))
	for i, l := range c.levels {
		ticks[i] = plot.Tick{Value: float64(l), Label: strconv.Itoa(l)}
	}
	p.X.Tick.Marker = ticks
	if pn.logScale {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = oneTwoFiveTicks{}
	} else {
		p.Y.Min = 0
	}
	drawn := 0
	for i, s := range c.order {
		data := c.seriesData(s, pn)
		if len(data) == 0 {
			continue
		}
		line, dots, err := plotter.NewLinePoints(data)
		if err != nil {
			return nil, err
		}
		line.Color, dots.Color, dots.Shape = plotutil.Color(i), plotutil.Color(i), plotutil.Shape(i)
		if s.mode == ModeSeed {
			line.Color, dots.Color = seedColor, seedColor
			line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		}
		p.Add(line, dots)
		if data.spread() {
			bars, err := plotter.NewYErrorBars(data)
			if err != nil {
				return nil, err
			}
			bars.Color = line.Color
			p.Add(bars)
		}
		if fillLegend {
			legend.Add(s.label(c.mixed), line, dots)
		}
		drawn++
	}
	if drawn == 0 {
		return nil, fmt.Errorf("%s: no positive values to draw", pn.title)
	}
	return p, nil
}

// oneTwoFiveTicks labels a log axis at 1, 2 and 5 times each power of ten,
// so that a range within one decade still gets labels.
type oneTwoFiveTicks struct{}

func (oneTwoFiveTicks) Ticks(min, max float64) []plot.Tick {
	var ticks []plot.Tick
	for exp := math.Floor(math.Log10(min)); exp <= math.Ceil(math.Log10(max)); exp++ {
		decade := math.Pow(10, exp)
		for m := 1; m < 10; m++ {
			v := float64(m) * decade
			if v < min || v > max {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = strconv.FormatFloat(v, 'g', -1, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// seriesData is a series' points for a metric, leaving out what a log scale
// cannot show.
func (c chart) seriesData(s series, pn panel) meanPoints {
	var out meanPoints
	for _, p := range c.points {
		if p.series != s {
			continue
		}
		mean, sd := p.stat(pn.metric)
		if math.IsNaN(mean) || pn.logScale && mean <= 0 {
			continue
		}
		if pn.logScale {
			sd = min(sd, mean/2) // a bar below zero has no place on a log scale
		}
		out = append(out, meanPoint{x: float64(p.sessions), y: mean, sd: sd})
	}
	return out
}

type meanPoint struct{ x, y, sd float64 }

// meanPoints serves a series to gonum's line, scatter and error bars.
type meanPoints []meanPoint

func (m meanPoints) Len() int                        { return len(m) }
func (m meanPoints) XY(i int) (float64, float64)     { return m[i].x, m[i].y }
func (m meanPoints) YError(i int) (float64, float64) { return m[i].sd, m[i].sd }
func (m meanPoints) spread() bool {
	for _, p := range m {
		if p.sd > 0 {
			return true
		}
	}
	return false
}
