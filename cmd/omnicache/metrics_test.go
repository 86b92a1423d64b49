package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/replay"
	"github.com/omnicache/omnicache/metrics"
)

// get GETs url and returns the body; it fails the test on any error.
func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	return string(b)
}

// samples parses a text exposition into "name{workload}" → value, counters
// and gauges only.
func samples(t *testing.T, text string) map[string]float64 {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			key := name
			for _, l := range m.GetLabel() {
				if l.GetName() == "workload" {
					key += "{" + l.GetValue() + "}"
				}
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out[key] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[key] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM: // its count, as name_count
				out[name+"_count"+key[len(name):]] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// TestReplayMetrics runs a small replay of a workload that hits, with
// --metrics-addr on a loopback port, and scrapes it from the hook: in the
// middle of the run (the cache live) and right after its cache closed; the
// final scrape must match the run's JSON report.
func TestReplayMetrics(t *testing.T) {
	const workload = "Qwen3-Omni/P1024_h50_c64"
	const midStep = 5
	var url string
	var mid, final map[string]float64
	var pprofIndex string
	metricsHook = func(ev metricsEvent) {
		if ev.workload != workload {
			t.Errorf("event for %q", ev.workload)
		}
		url = ev.url
		switch {
		case !ev.closed && ev.step == midStep:
			mid = samples(t, get(t, ev.url))
			pprofIndex = get(t, strings.TrimSuffix(ev.url, "/metrics")+"/debug/pprof/")
		case ev.closed:
			final = samples(t, get(t, ev.url))
		}
	}
	t.Cleanup(func() { metricsHook = nil })

	js := filepath.Join(t.TempDir(), "r.jsonl")
	code, _, errs := run(t, "--workloads", workload+"$", "--scale", "0.01", "--concurrency", "8", "--cache", "on",
		"--metrics-addr", "127.0.0.1:0", "--json", js)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if url == "" || mid == nil || final == nil {
		t.Fatalf("hook saw url %q, mid %v, final %v", url, mid != nil, final != nil)
	}
	if !strings.Contains(errs, "metrics: serving on "+url) {
		t.Errorf("stderr does not name %s:\n%s", url, errs)
	}
	if !strings.Contains(pprofIndex, "goroutine") || !strings.Contains(pprofIndex, "profile") {
		t.Errorf("/debug/pprof/ index:\n%s", pprofIndex)
	}
	if resp, err := http.Get(url); err == nil {
		resp.Body.Close()
		t.Errorf("still serving after the replay returned")
	}

	// Mid-run: steps 0..4 saved, step 5 not begun yet.
	w := "{" + workload + "}"
	if got := mid["omnicache_steps_total"+w]; got != midStep {
		t.Errorf("mid-run steps_total %v, want %d", got, midStep)
	}
	if mid["omnicache_live_requests"+w] == 0 || mid["omnicache_prefix_cache_queries_total"+w] == 0 {
		t.Errorf("mid-run: nothing live or queried: %v", mid)
	}
	if _, ok := mid["go_goroutines"]; !ok {
		t.Errorf("no Go runtime metrics")
	}
	// The cache's histograms (Config.Histograms, on with --metrics-addr):
	// a page claim per write (buffered decode steps share one).
	if got := mid["omnicache_staging_page_wait_seconds_count"+w]; got < 1 || got > midStep {
		t.Errorf("mid-run staging_page_wait_seconds_count %v, want 1..%d", got, midStep)
	}
	for _, name := range []string{"hit_read_wait_seconds", "committer_wait_seconds", "device_to_host_copy_seconds", "device_to_host_copy_bytes"} {
		if _, ok := mid["omnicache_"+name+"_count"+w]; !ok {
			t.Errorf("mid-run: no histogram omnicache_%s", name)
		}
	}

	// Final: the run's report (one JSON line, cache on).
	f, err := os.Open(js)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	if !sc.Scan() {
		t.Fatalf("no report")
	}
	var rep struct {
		Name          string `json:"name"`
		Steps         float64
		QueriedTokens float64 `json:"queried_tokens"`
		HitTokens     float64 `json:"hit_tokens"`
		RowsWritten   float64 `json:"rows_written"`
		BytesWritten  float64 `json:"bytes_written"`
	}
	if err := json.Unmarshal(sc.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Name != workload {
		t.Fatalf("report of %q", rep.Name)
	}
	if rep.HitTokens == 0 || rep.RowsWritten == 0 {
		t.Fatalf("the workload should hit: %s", sc.Text())
	}
	for name, want := range map[string]float64{
		"omnicache_steps_total":                rep.Steps,
		"omnicache_prefix_cache_queries_total": rep.QueriedTokens,
		"omnicache_prefix_cache_hits_total":    rep.HitTokens,
		"omnicache_written_rows_total":         rep.RowsWritten,
		"omnicache_written_bytes_total":        rep.BytesWritten,
		"omnicache_staging_pages_in_use":       0,
		"omnicache_mirror_resident_bytes":      0, // Close frees the mirror
		"omnicache_budget_charged_bytes":       0,
	} {
		got, ok := final[name+w]
		if !ok || got != want {
			t.Errorf("final %s = %v (present %v), want %v", name, got, ok, want)
		}
	}
}

// TestLiveRunRepeat: a closed run keeps its final values; a repeat's new
// cache restarts the counters, queries included.
func TestLiveRunRepeat(t *testing.T) {
	cfg := omnicache.Config{NumBlocks: 4, BlockSize: 4, Keys: []omnicache.Key{{Name: "hidden", RowBytes: 8}}}
	r := &liveRun{queries: new(metrics.QueryCounter)}
	c1, err := replay.NewRealCache(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.open(c1)
	r.queries.AddQueries(12)
	if err := c1.Begin(&omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{4},
		Table: []int32{0}, Stride: 1, Arrivals: []int64{1}, HitTokens: []int32{0}}); err != nil {
		t.Fatal(err)
	}
	if r.Stats().LiveRequests != 1 {
		t.Fatalf("live stats %+v", r.Stats())
	}
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
	if err := c1.Begin(&omnicache.Plan{}); !errors.Is(err, omnicache.ErrClosed) {
		t.Fatalf("close did not close the cache: %v", err)
	}
	if got := r.QueryTokens(); got != 12 {
		t.Fatalf("queries after close %d, want 12", got)
	}
	if err := r.close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	c2, err := replay.NewRealCache(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.open(c2)
	defer r.close()
	if s := r.Stats(); s.LiveRequests != 0 || r.QueryTokens() != 0 {
		t.Fatalf("a repeat's counters did not restart: %+v, queries %d", s, r.QueryTokens())
	}
}

func TestReplayMetricsBadAddr(t *testing.T) {
	code, _, errs := run(t, "--cache", "off", "--workloads", "DEC100_c32$", "--metrics-addr", "127.0.0.1:notaport")
	if code == 0 || !strings.Contains(errs, "--metrics-addr") {
		t.Fatalf("exit %d: %s", code, errs)
	}
}
