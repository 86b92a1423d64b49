package replay

import (
	"strings"
	"testing"
	"time"

	"github.com/omnicache/omnicache"
)

// TestLatencyProjection: with a constant step time and one client, every
// time is a whole number of steps: a 16-token prompt is computed in one
// step that samples the first token, then each decode step samples one.
func TestLatencyProjection(t *testing.T) {
	w := Workload{Model: "test", Name: "one", InputLen: 16, OutputLen: 4, Concurrency: 1, Prompts: 3,
		Keys: []omnicache.Key{{Name: "hidden", RowBytes: 8}}}
	const step = 10 * time.Millisecond
	tests := []struct {
		name       string
		downstream bool
		ttfp       int64
	}{
		{"no downstream stage", false, 0},
		{"downstream stage", true, int64(step)},
	}
	for _, tc := range tests {
		spec := w.Spec(1)
		spec.Downstream = tc.downstream
		rep, err := Replay(spec, Options{StepTime: step})
		if err != nil {
			t.Fatal(err)
		}
		if rep.TTFTP50 != int64(step) || rep.TTFTP99 != int64(step) || rep.E2EP50 != int64(4*step) ||
			rep.E2EP99 != int64(4*step) || rep.FirstRequestTTFTNs != int64(step) || len(rep.TTFTs) != 3 {
			t.Fatalf("%s: ttft %d/%d e2e %d/%d first %d (%d requests), want %d and %d", tc.name, rep.TTFTP50, rep.TTFTP99,
				rep.E2EP50, rep.E2EP99, rep.FirstRequestTTFTNs, len(rep.TTFTs), step, 4*step)
		}
		if rep.TTFPP50 != tc.ttfp || rep.TTFPP99 != tc.ttfp {
			t.Fatalf("%s: ttfp %d/%d, want %d", tc.name, rep.TTFPP50, rep.TTFPP99, tc.ttfp)
		}
	}
}

// TestLatencyCacheOnAddsCacheTime: with the cache on and no hit, each
// request's times only grow by the cache's time; the first request's time
// to first token includes the cache's start-up.
func TestLatencyCacheOnAddsCacheTime(t *testing.T) {
	w := small()
	w.SharedPrefix = 0
	spec := w.Spec(1)
	spec.Downstream = true
	o := Options{StepTime: 10 * time.Millisecond, ForceStepTime: true}
	off, err := Replay(spec, o)
	if err != nil {
		t.Fatal(err)
	}
	o.Cache = true
	on, err := Replay(spec, o)
	if err != nil {
		t.Fatal(err)
	}
	if on.TTFTP50 < off.TTFTP50 || on.E2EP99 < off.E2EP99 || on.TTFPP50 < off.TTFPP50 || off.TTFPP50 == 0 {
		t.Fatalf("on %+v\noff %+v", on, off)
	}
	if on.FirstRequestTTFTNs < off.FirstRequestTTFTNs+on.FirstRequestNs {
		t.Fatalf("first request: on %d, off %d + start-up %d", on.FirstRequestTTFTNs, off.FirstRequestTTFTNs, on.FirstRequestNs)
	}
}

// TestLatencyHitCutsTTFT: a hit skips its prefix's prefill, which the step
// cost prices per token: the slowest requests' time to first token falls.
func TestLatencyHitCutsTTFT(t *testing.T) {
	w := small()
	w.SharedPrefix, w.InputLen, w.RangeRatio, w.Prompts = 512, 32, 0, 32
	spec := w.Spec(1)
	spec.Cost = StepCost{Model: "test", A: 1e6, B: 1e5}
	off, err := Replay(spec, Options{MaxBatchedTokens: 256})
	if err != nil {
		t.Fatal(err)
	}
	on, err := Replay(spec, Options{Cache: true, MaxBatchedTokens: 256})
	if err != nil {
		t.Fatal(err)
	}
	if on.HitRate == 0 || on.TTFTP99 >= off.TTFTP99 || on.E2EP50 >= off.E2EP50 {
		t.Fatalf("hit %.2f: ttft p99 on %d off %d, e2e p50 on %d off %d", on.HitRate, on.TTFTP99, off.TTFTP99, on.E2EP50, off.E2EP50)
	}
	var b strings.Builder
	if err := WriteTable(&b, []*Report{off, on}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "projected latency") || !strings.Contains(b.String(), "ttft p50") {
		t.Fatalf("no latency table:\n%s", b.String())
	}
	b.Reset()
	if err := WriteWideTable(&b, []*Report{off, on}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "ttft p90") || !strings.Contains(b.String(), "first req ttft") {
		t.Fatalf("no latency percentiles in the wide table:\n%s", b.String())
	}
}

func TestLatencyFormats(t *testing.T) {
	for _, tc := range []struct {
		ns   int64
		want string
	}{
		{0, "0µs"}, {999_499, "999µs"}, {1_000_000, "1.0ms"}, {99_940_000, "99.9ms"}, {419_900_000, "420ms"},
		{3_320_000_000, "3.32s"}, {134_120_000_000, "134s"}, {9_999e9, "9999s"}, {10_000e9, ">9999s"},
	} {
		if got := latDur(tc.ns); got != tc.want || len([]rune(got)) > 6 {
			t.Errorf("latDur(%d) = %q, want %q", tc.ns, got, tc.want)
		}
	}
	for _, tc := range []struct {
		f    float64
		want string
	}{
		{0, "0"}, {-0.826, "-82.6%"}, {0.999, "+99.9%"}, {1, "+100%"}, {9.99, "+999%"}, {10, ">+999%"}, {-1, "-100.0%"},
	} {
		if got := shortChange(tc.f); got != tc.want {
			t.Errorf("shortChange(%v) = %q, want %q", tc.f, got, tc.want)
		}
	}
}
