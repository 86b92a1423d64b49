package bench

import (
	"fmt"
	"os"

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

// WritePlot draws, for the cache-on runs with per-step samples
// (Options.KeepSamples),
// the engine goroutine's cache time per step (top) and the cumulative prefix
// hit rate (bottom) over the steps, runs one after another on the x axis,
// into a PNG file.
func WritePlot(path string, reps []*Report) error {
	top, bottom := plot.New(), plot.New()
	top.Title.Text = "omnicache replay: engine-goroutine cache time per step"
	top.Y.Label.Text = "µs per step (Begin+Save+Materialize/Discard, log)"
	top.Y.Scale = plot.LogScale{}
	top.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	bottom.Y.Label.Text = "cumulative hit rate"
	bottom.X.Label.Text = "engine step (runs in order)"
	bottom.Y.Min, bottom.Y.Max = 0, 1
	top.Add(plotter.NewGrid())
	bottom.Add(plotter.NewGrid())

	offset := 0
	n := 0
	for _, r := range reps {
		if len(r.Samples) == 0 || r.Cache != "on" {
			continue
		}
		bucket := (len(r.Samples) + maxPlotPoints - 1) / maxPlotPoints
		var cache, hits plotter.XYs
		var queried, hit int64
		for lo := 0; lo < len(r.Samples); lo += bucket {
			hi := min(lo+bucket, len(r.Samples))
			var ns int64
			for _, s := range r.Samples[lo:hi] {
				ns += s.EngineNs
				queried += int64(s.Queried)
				hit += int64(s.Hit)
			}
			x := float64(offset + lo)
			// Floor at 10 ns: the log axis cannot show 0.
			cache = append(cache, plotter.XY{X: x, Y: max(float64(ns)/float64(hi-lo)/1e3, 0.01)})
			rate := 0.0
			if queried > 0 {
				rate = float64(hit) / float64(queried)
			}
			hits = append(hits, plotter.XY{X: x, Y: rate})
		}
		col := plotutil.Color(n)
		l1, err := plotter.NewLine(cache)
		if err != nil {
			return err
		}
		l1.Color = col
		l2, err := plotter.NewLine(hits)
		if err != nil {
			return err
		}
		l2.Color = col
		top.Add(l1)
		bottom.Add(l2)
		if countSampled(reps) <= 8 {
			top.Legend.Add(r.Name, l1)
		}
		offset += len(r.Samples)
		n++
	}
	if n == 0 {
		return fmt.Errorf("plot: no run with per-step samples (cache on)")
	}
	top.Legend.Top = true

	const w, h = 30 * vg.Centimeter, 20 * vg.Centimeter
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Centimeter / 2, PadTop: vg.Centimeter / 4,
		PadBottom: vg.Centimeter / 4, PadLeft: vg.Centimeter / 4, PadRight: vg.Centimeter / 2}
	plots := [][]*plot.Plot{{top}, {bottom}}
	canvases := plot.Align(plots, tiles, dc)
	top.Draw(canvases[0][0])
	bottom.Draw(canvases[1][0])

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

func countSampled(reps []*Report) int {
	n := 0
	for _, r := range reps {
		if len(r.Samples) > 0 && r.Cache == "on" {
			n++
		}
	}
	return n
}
