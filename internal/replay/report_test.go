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
