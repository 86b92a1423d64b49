package figures

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/omnicache/omnicache/internal/replay"
)

// reports are one workload's cache-off and cache-on runs with what every
// figure draws: projected times to first token, the reference's changes
// and per-step samples (cache on), plus a second workload run with the
// cache on only and no reference.
func reports() []*replay.Report {
	ttfts := func(base int64) []int64 {
		v := make([]int64, 50)
		for i := range v {
			v[i] = base + int64(i*i)*1000
		}
		return v
	}
	off := &replay.Report{Name: "w/a", Cache: "off", TTFTs: ttfts(4e6), TTFTP50: 5e6, TTFTP99: 9e6}
	on := &replay.Report{Name: "w/a", Cache: "on", HitRate: 0.5, ProjectedChange: 0.8, TTFTs: ttfts(1e6),
		TTFTP50: 2e6, TTFTP99: 4e6, RefReqPerSecOff: 3, RefChangeBefore: -0.1, RefChangeAfter: 0.7,
		RefChangeAfterLo: 0.6, RefChangeAfterHi: 0.8}
	for i := range 5000 {
		on.Samples = append(on.Samples, replay.StepSample{EngineNs: int64(1000 + i%7)})
	}
	other := &replay.Report{Name: "w/b", Cache: "on", ProjectedChange: -0.0004}
	return []*replay.Report{off, on, other}
}

func TestWritePlots(t *testing.T) {
	png := filepath.Join(t.TempDir(), "p.png")
	if err := WritePlots(png, reports()); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{png, StepPlotPath(png), TTFTPlotPath(png)} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 1000 || string(b[1:4]) != "PNG" {
			t.Fatalf("%s: %d bytes, not a PNG image", f, len(b))
		}
	}
}

func TestPlotPaths(t *testing.T) {
	for in, want := range map[string][2]string{
		"x.png":         {"x-steps.png", "x-ttft.png"},
		"d.v/x":         {"d.v/x-steps", "d.v/x-ttft"},
		"out/run.1.png": {"out/run.1-steps.png", "out/run.1-ttft.png"},
	} {
		if got := [2]string{StepPlotPath(in), TTFTPlotPath(in)}; got != want {
			t.Errorf("%s: %v, want %v", in, got, want)
		}
	}
}

// A run without what a figure needs fails that figure and writes nothing.
func TestWithoutData(t *testing.T) {
	dir := t.TempDir()
	offOnly := []*replay.Report{{Name: "w", Cache: "off"}}
	if err := WriteChangePlot(filepath.Join(dir, "c.png"), offOnly); err == nil {
		t.Fatal("a change plot without a cache-on run")
	}
	if err := WriteStepPlot(filepath.Join(dir, "s.png"), reports()[:1]); err == nil {
		t.Fatal("a step plot without samples")
	}
	if err := WriteTTFTPlot(filepath.Join(dir, "t.png"), offOnly); err == nil {
		t.Fatal("a TTFT plot without times")
	}
	if _, err := os.Stat(filepath.Join(dir, "c.png")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("c.png: %v", err)
	}
	// Without per-step samples WritePlots draws the other two only.
	png := filepath.Join(dir, "p.png")
	rs := reports()
	rs[1].Samples = nil
	if err := WritePlots(png, rs); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(StepPlotPath(png)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("step plot without samples: %v", err)
	}
}
