// Package figures draws the replay's figures (omnicache replay --plot): the
// projected throughput change per workload beside the reference's, the
// projected time-to-first-token distributions with the cache off and on,
// and the engine goroutine's cache time per step. It lives in the CLI's
// module so that the library module does not require gonum/plot.
package figures

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/omnicache/omnicache/internal/replay"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// maxPlotPoints bounds the points drawn per run; longer runs are averaged
// over buckets of consecutive steps.
const maxPlotPoints = 2000

// stepPlotCols is the number of panels a row of the per-step plot.
const stepPlotCols = 4

// WritePlots draws the projected change per workload beside the reference's
// (WriteChangePlot) into path, and, when the cache-on runs kept per-step
// samples, their per-step cache time and hit rate (WriteStepPlot) into path
// with "-steps" before its extension.
func WritePlots(path string, reps []*replay.Report) error {
	if err := WriteChangePlot(path, reps); err != nil {
		return err
	}
	if err := WriteTTFTPlot(TTFTPlotPath(path), reps); err != nil {
		return err
	}
	if countSampled(reps) == 0 {
		return nil
	}
	return WriteStepPlot(StepPlotPath(path), reps)
}

// TTFTPlotPath is where WritePlots draws the time-to-first-token
// distributions: "x.png" → "x-ttft.png".
func TTFTPlotPath(path string) string { return suffixed(path, "-ttft") }

// StepPlotPath is where WritePlots draws the per-step plot: "x.png" →
// "x-steps.png".
func StepPlotPath(path string) string { return suffixed(path, "-steps") }

func suffixed(path, suffix string) string {
	if i := strings.LastIndexByte(path, '.'); i > strings.LastIndexByte(path, '/') {
		return path[:i] + suffix + path[i:]
	}
	return path + suffix
}

// WriteTTFTPlot draws, per workload, the distribution (empirical CDF) of
// the requests' projected time to first token with the cache off and on,
// one panel per workload titled with its p50 and p99 change.
func WriteTTFTPlot(path string, reps []*replay.Report) error {
	var panels []*plot.Plot
	for _, run := range replay.Pairs(reps) {
		p := plot.New()
		p.Title.Text = replay.ShortName(run.Name)
		if run.Off != nil && run.On != nil && run.Off.TTFTP50 > 0 {
			p.Title.Text += fmt.Sprintf(": p50 %s, p99 %s", replay.SignedPct(float64(run.On.TTFTP50)/float64(run.Off.TTFTP50)-1, 1),
				replay.SignedPct(float64(run.On.TTFTP99)/float64(run.Off.TTFTP99)-1, 1))
		}
		p.Title.TextStyle.Font.Size = vg.Points(8)
		p.X.Label.Text = "projected time to first token (ms)"
		p.Y.Label.Text = "fraction of requests"
		p.Add(plotter.NewGrid())
		n := 0
		for k, r := range []*replay.Report{run.Off, run.On} {
			if r == nil || len(r.TTFTs) == 0 {
				continue
			}
			v := slices.Clone(r.TTFTs)
			slices.Sort(v)
			step := max(1, len(v)/maxPlotPoints)
			var xys plotter.XYs
			for i := 0; i < len(v); i += step {
				xys = append(xys, plotter.XY{X: float64(v[i]) / 1e6, Y: float64(i+1) / float64(len(v))})
			}
			xys = append(xys, plotter.XY{X: float64(v[len(v)-1]) / 1e6, Y: 1})
			l, err := plotter.NewLine(xys)
			if err != nil {
				return err
			}
			l.Color = plotutil.Color(k)
			l.Dashes = plotutil.Dashes(k)
			l.Width = vg.Points(1.5)
			p.Add(l)
			p.Legend.Add("cache "+r.Cache, l)
			n++
		}
		if n == 0 {
			continue
		}
		p.Legend.Top, p.Legend.Left = false, false
		p.X.Min = 0
		panels = append(panels, p)
	}
	if len(panels) == 0 {
		return fmt.Errorf("plot: no run with projected times to first token")
	}
	return drawPanels(path, panels)
}

// drawPanels draws panels as small multiples, stepPlotCols a row.
func drawPanels(path string, panels []*plot.Plot) error {
	cols := min(stepPlotCols, len(panels))
	rows := (len(panels) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
	}
	for i, p := range panels {
		grid[i/cols][i%cols] = p
	}
	w, h := vg.Length(cols)*9*vg.Centimeter, vg.Length(rows)*6*vg.Centimeter
	return savePNG(path, w, h, func(dc draw.Canvas) {
		tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Centimeter / 2, PadY: vg.Centimeter / 2,
			PadTop: vg.Centimeter / 4, PadBottom: vg.Centimeter / 4, PadLeft: vg.Centimeter / 4, PadRight: vg.Centimeter / 4}
		canvases := plot.Align(grid, tiles, dc)
		for i, p := range panels {
			p.Draw(canvases[i/cols][i%cols])
		}
	})
}

// WriteChangePlot draws, per workload with a cache-on run, three labelled
// horizontal bars: the projected throughput change of this run, and the
// reference's change before and after its fix (the after label carries its
// range), into a PNG file.
func WriteChangePlot(path string, reps []*replay.Report) error {
	var names []string
	var proj, before, after plotter.Values
	var projL, beforeL, afterL []string
	var runs []*replay.Report
	for _, r := range reps {
		if r.Cache == "on" {
			runs = append(runs, r)
		}
	}
	if len(runs) == 0 {
		return fmt.Errorf("plot: no cache-on run")
	}
	// Top to bottom in run order: the nominal axis counts from the bottom.
	for i := len(runs) - 1; i >= 0; i-- {
		r := runs[i]
		names = append(names, fmt.Sprintf("%s (hit %s)", r.Name, replay.Pct(r.HitRate, 1)))
		proj = append(proj, 100*r.ProjectedChange)
		projL = append(projL, replay.SignedPct(r.ProjectedChange, 2))
		if r.RefReqPerSecOff > 0 {
			before = append(before, 100*r.RefChangeBefore)
			after = append(after, 100*r.RefChangeAfter)
			beforeL = append(beforeL, replay.RefPct(r.RefChangeBefore))
			afterL = append(afterL, fmt.Sprintf("%s (%s..%s)", replay.RefPct(r.RefChangeAfter),
				replay.RefPct(r.RefChangeAfterLo), replay.RefPct(r.RefChangeAfterHi)))
		} else {
			before, after = append(before, 0), append(after, 0)
			beforeL, afterL = append(beforeL, "no reference"), append(afterL, "")
		}
	}

	p := plot.New()
	p.Title.Text = "omnicache replay: throughput change with the cache on, projected vs the reference"
	p.X.Label.Text = "throughput change vs cache off (%)"
	p.Add(plotter.NewGrid())
	const barW = 5 * vg.Millimeter
	series := []struct {
		name   string
		vals   plotter.Values
		labels []string
		col    color.Color
	}{
		{"projected (this run, fitted step cost)", proj, projL, color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}},
		{"reference before its fix", before, beforeL, color.RGBA{R: 0xbb, G: 0xbb, B: 0xbb, A: 0xff}},
		{"reference after its fix (range)", after, afterL, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}},
	}
	lo, hi := 0.0, 0.0
	for k, s := range series {
		b, err := plotter.NewBarChart(s.vals, barW)
		if err != nil {
			return err
		}
		b.Horizontal = true
		b.Color = s.col
		b.LineStyle.Width = 0
		off := vg.Length(1-k) * barW // projected on top
		b.Offset = off
		p.Add(b)
		p.Legend.Add(s.name, b)
		xys := make(plotter.XYs, len(s.vals))
		for i, v := range s.vals {
			xys[i] = plotter.XY{X: max(v, 0), Y: float64(i)}
			lo, hi = min(lo, v), max(hi, v)
		}
		l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: s.labels})
		if err != nil {
			return err
		}
		for i := range l.TextStyle {
			l.TextStyle[i].Font.Size = vg.Points(7)
			l.TextStyle[i].YAlign = draw.YCenter
		}
		l.Offset = vg.Point{X: vg.Millimeter, Y: off}
		p.Add(l)
	}
	// Room for the labels right of the longest bar.
	span := math.Max(hi-lo, 1)
	p.X.Min, p.X.Max = lo-0.05*span, hi+0.45*span
	p.NominalY(names...)
	p.Legend.Top = false // bottom right: the 0%-hit rows' labels end near 0
	p.Legend.Left = false
	h := vg.Length(len(runs))*3.5*barW + 4*vg.Centimeter
	return savePNG(path, 32*vg.Centimeter, h, func(dc draw.Canvas) { p.Draw(dc) })
}

// WriteStepPlot draws, for the cache-on runs with per-step samples
// (replay.Options.KeepSamples), one panel per run (small multiples, each titled by
// its run with its hit rate and projected change, so no legend is needed):
// the engine goroutine's cache time per step, log scale.
func WriteStepPlot(path string, reps []*replay.Report) error {
	var panels []*plot.Plot
	for _, r := range reps {
		if len(r.Samples) == 0 || r.Cache != "on" {
			continue
		}
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s: hit %s, projected %s", r.Name, replay.Pct(r.HitRate, 1), replay.SignedPct(r.ProjectedChange, 2))
		p.Title.TextStyle.Font.Size = vg.Points(8)
		p.X.Label.Text = "step"
		p.Y.Label.Text = "engine µs/step"
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Add(plotter.NewGrid())
		bucket := (len(r.Samples) + maxPlotPoints - 1) / maxPlotPoints
		var cache plotter.XYs
		for lo := 0; lo < len(r.Samples); lo += bucket {
			hi := min(lo+bucket, len(r.Samples))
			var ns int64
			for _, s := range r.Samples[lo:hi] {
				ns += s.EngineNs
			}
			// Floor at 10 ns: the log axis cannot show 0.
			cache = append(cache, plotter.XY{X: float64(lo), Y: max(float64(ns)/float64(hi-lo)/1e3, 0.01)})
		}
		l, err := plotter.NewLine(cache)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(0)
		p.Add(l)
		panels = append(panels, p)
	}
	if len(panels) == 0 {
		return fmt.Errorf("plot: no run with per-step samples (cache on)")
	}
	return drawPanels(path, panels)
}

func savePNG(path string, w, h vg.Length, drawFn func(draw.Canvas)) error {
	img := vgimg.New(w, h)
	drawFn(draw.New(img))
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

func countSampled(reps []*replay.Report) int {
	n := 0
	for _, r := range reps {
		if len(r.Samples) > 0 && r.Cache == "on" {
			n++
		}
	}
	return n
}
