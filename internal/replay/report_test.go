package replay

import (
	"strings"
	"testing"
)

func TestHitVsMiss(t *testing.T) {
	hit := &Report{Cache: "on", Model: "m", Keys: "k"}
	hit.BySize.add(true, 1000, 30) // bucket 10
	hit.BySize.add(true, 1000, 50)
	hit.BySize.add(true, 5000, 90) // bucket 13: no step of its size without a hit
	hit.BySize.add(false, 1000, 10)
	other := &Report{Cache: "on", Model: "m", Keys: "k"}
	other.BySize.add(false, 600, 30) // bucket 10
	foreign := &Report{Cache: "on", Model: "x", Keys: "k"}
	foreign.BySize.add(false, 1000, 1e6)
	off := &Report{Cache: "off", Model: "m", Keys: "k"}
	off.BySize.add(false, 1000, 1e6)
	h, m, n, misses := HitVsMiss(hit, []*Report{hit, other, foreign, off})
	if h != 40 || m != 20 || n != 2 || misses != 2 {
		t.Fatalf("hit %v miss %v over %d hit steps, %d miss steps: want 40, 20, 2, 2", h, m, n, misses)
	}
	if _, _, n, _ := HitVsMiss(foreign, []*Report{foreign}); n != 0 {
		t.Fatalf("a run without hit steps compared %d", n)
	}
}

// Under --verify the step-time targets are not judged: a loss far over the
// 0%-hit target and a gain far off the reference are not Missed, and the
// summary says so instead of OVER/OFF TARGET; without --verify they are.
func TestCheckUnderVerify(t *testing.T) {
	for _, verify := range []bool{false, true} {
		zero := &Report{Name: "m/P1_h0_c1", Cache: "on", ProjectedChange: -0.5, Verify: verify}
		hit := &Report{Name: "m/P1_h50_c1", Cache: "on", HitTokens: 10, HitRate: 0.5, ProjectedChange: 0.9,
			RefReqPerSecOff: 1, RefChangeAfter: 0.1, Verify: verify}
		v := Check([]*Report{zero, hit})
		var b strings.Builder
		if err := WriteSummary(&b, []*Report{zero, hit}); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		if verify {
			if !v.Verified || len(v.Missed) != 0 || strings.Count(out, notJudged) != 2 || strings.Contains(out, "TARGET") {
				t.Fatalf("--verify: verdict %+v, summary:\n%s", v, out)
			}
			continue
		}
		if v.Verified || len(v.Missed) != 2 || !strings.Contains(out, "OVER TARGET") || !strings.Contains(out, "OFF TARGET") {
			t.Fatalf("without --verify: verdict %+v, summary:\n%s", v, out)
		}
	}
}

// On a busy machine (load average above the CPUs at the start, or a
// figure's runs further apart than its target allows) a target missed
// below is not judged: not Missed, not OVER/OFF TARGET, and the summary
// says why. A target met is met however busy, and a gain above the
// reference's band is missed however busy (load only lowers a projection).
func TestCheckOnABusyMachine(t *testing.T) {
	hit := func(proj, lo, hi float64, runs int, load float64) *Report {
		return &Report{Name: "Qwen3-Omni/P1024_h50_c64", Cache: "on", HitTokens: 10, HitRate: 0.5, ProjectedChange: proj,
			ProjectedChangeMin: lo, ProjectedChangeMax: hi, Repeats: runs, RefReqPerSecOff: 1, RefChangeAfter: 0.765,
			CPUs: 2, LoadAverage: load}
	}
	zero := func(proj, lo float64, runs int, load float64) *Report {
		return &Report{Name: "m/DEC", Cache: "on", ProjectedChange: proj, ProjectedChangeMin: lo, ProjectedChangeMax: proj,
			Repeats: runs, CPUs: 2, LoadAverage: load}
	}
	for _, c := range []struct {
		name             string
		rep              *Report
		missed, unjudged int
		want, not        []string
	}{
		{"gain below, loaded", hit(0.40, 0.40, 0.40, 1, 3), 0, 1,
			[]string{notJudgedBusy, "machine busy: load average 3.00 at start on 2 CPUs"}, []string{"OFF TARGET"}},
		{"gain below, unsteady runs", hit(0.55, 0.20, 0.55, 3, 1), 0, 1,
			[]string{notJudgedBusy, "machine busy: Qwen3-Omni/P1024_h50_c64 moved 35 points over 3 runs, more than the ±15 points target allows"},
			[]string{"OFF TARGET", "load average"}},
		{"gain below, quiet and steady", hit(0.40, 0.38, 0.40, 3, 1), 1, 0, []string{"OFF TARGET"}, []string{"not judged", "machine busy"}},
		{"gain above, loaded", hit(1.20, 1.20, 1.20, 1, 3), 1, 0, []string{"OFF TARGET"}, []string{"not judged", "machine busy"}},
		{"gain met, loaded", hit(0.70, 0.30, 0.70, 3, 3), 0, 0, []string{"target ±15: ok"}, []string{"machine busy"}},
		{"loss over, loaded", zero(-0.01, -0.01, 1, 2.5), 0, 1, []string{"target <= 0.1%: " + notJudgedBusy, "load average 2.50"}, []string{"OVER"}},
		{"loss over, unsteady runs", zero(-0.002, -0.01, 3, 0.5), 0, 1, []string{notJudgedBusy, "m/DEC moved 0.8 points over 3 runs"}, []string{"OVER"}},
		{"loss over, quiet", zero(-0.01, -0.01, 3, 0.5), 1, 0, []string{"OVER TARGET"}, []string{"not judged"}},
		{"loss met, loaded", zero(-0.0005, -0.0009, 3, 9), 0, 0, []string{"target <= 0.1%: ok"}, []string{"machine busy"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := Check([]*Report{c.rep})
			var b strings.Builder
			if err := WriteSummary(&b, []*Report{c.rep}); err != nil {
				t.Fatal(err)
			}
			out := b.String()
			if len(v.Missed) != c.missed || len(v.Unjudged) != c.unjudged {
				t.Errorf("missed %q, not judged %q: want %d, %d", v.Missed, v.Unjudged, c.missed, c.unjudged)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("summary lacks %q:\n%s", w, out)
				}
			}
			for _, w := range c.not {
				if strings.Contains(out, w) {
					t.Errorf("summary has %q:\n%s", w, out)
				}
			}
		})
	}
}

// Best keeps the run of highest projected throughput and the range of all
// the runs' projected changes; the default table shows its spread and the
// output goroutine's Materialize per step, and its legend.
func TestBestAndItsRange(t *testing.T) {
	runs := []*Report{
		{Name: "w", Cache: "on", ModelReqPerSec: 10, ProjectedChange: 0.5},
		{Name: "w", Cache: "on", ModelReqPerSec: 12, ProjectedChange: 0.8, Steps: 4, MaterializeOn: "output", MaterializeNsTotal: 8e6},
		{Name: "w", Cache: "on", ModelReqPerSec: 9, ProjectedChange: 0.35},
	}
	b := Best(runs)
	if b != runs[1] || b.Repeats != 3 || b.ProjectedChangeMin != 0.35 || b.ProjectedChangeMax != 0.8 {
		t.Fatalf("best %+v", b)
	}
	var out strings.Builder
	if err := WriteTable(&out, []*Report{b}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"out/step", "spread", "2.0ms", "  45.0  ", "the best of 3 cache-on runs; spread: how many points apart the 3 were",
		"only the part that outlasts"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, out.String())
		}
	}
	if one := Best(runs[:1]); one.Repeats != 1 || spreadCol(one) != "-" {
		t.Fatalf("one run: %+v, spread %q", one, spreadCol(one))
	}
}
