package metrics

import (
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/omnicache/omnicache"
)

// scrape GETs url and parses the text exposition.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("content type %q, want the text format", ct)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// serve registers cs on a fresh pedantic registry (which checks that
// Collect matches Describe) and serves it; it returns the /metrics URL.
func serve(t *testing.T, cs ...prometheus.Collector) string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

// value is the single sample of family name with the given labels (nil: the
// only one); it fails when there is none or the type is not typ.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, typ dto.MetricType, labels map[string]string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	if f.GetType() != typ {
		t.Fatalf("%s is a %v, want %v", name, f.GetType(), typ)
	}
	var found []float64
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, lp := range m.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		if labels != nil && !reflect.DeepEqual(got, labels) {
			continue
		}
		switch typ {
		case dto.MetricType_COUNTER:
			found = append(found, m.GetCounter().GetValue())
		case dto.MetricType_GAUGE:
			found = append(found, m.GetGauge().GetValue())
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s%v: %d samples, want 1", name, labels, len(found))
	}
	return found[0]
}

// expect checks every exported Stats field of fams against s, exactly.
func expect(t *testing.T, fams map[string]*dto.MetricFamily, s omnicache.Stats, labels map[string]string) {
	t.Helper()
	sv := reflect.ValueOf(s)
	for _, m := range stats {
		want := float64(sv.FieldByName(m.field).Int())
		if strings.HasSuffix(m.name, "_seconds_total") {
			want /= nanosPerSecond
		}
		typ := dto.MetricType_GAUGE
		if m.typ == prometheus.CounterValue {
			typ = dto.MetricType_COUNTER
		}
		if got := value(t, fams, Namespace+"_"+m.name, typ, labels); got != want {
			t.Errorf("%s_%s = %v, want %v (Stats.%s)", Namespace, m.name, got, want, m.field)
		}
	}
}

// engine drives a real cache through the smoke test's story: request 1
// prefills 8 tokens and decodes 3, then finishes while request 2 arrives
// hitting its first 2 blocks (8 tokens) and computes 4 more.
type engine struct {
	t       *testing.T
	c       *omnicache.Cache
	q       *QueryCounter
	table   []int32
	rbs     []int
	pending omnicache.StepID
	has     bool
}

func newEngine(t *testing.T, buffer bool, histograms ...bool) *engine {
	c, err := omnicache.New(omnicache.Config{
		NumBlocks: 16, BlockSize: 4,
		Keys:                []omnicache.Key{{Name: "hidden", RowBytes: 8}, {Name: "codes", RowBytes: 4, Deferred: true}},
		DisableDecodeBuffer: !buffer,
		Histograms:          len(histograms) > 0 && histograms[0],
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &engine{t: t, c: c, q: new(QueryCounter), table: []int32{0, 1, 2, 3, 0, 1, 5, 6}, rbs: []int{8, 4}}
}

// step runs Begin and Save for one request scheduling n tokens from start;
// prompt > 0 makes it an arrival of that prompt length hitting hit tokens.
// The previous step is discarded after Save, the new one left pending.
func (e *engine) step(id int64, row, start, n, prompt, hit int, finished ...int64) {
	e.t.Helper()
	p := &omnicache.Plan{IDs: []int64{id}, Rows: []int32{int32(row)}, Start: []int32{int32(start)}, Count: []int32{int32(n)},
		Table: e.table, Stride: 4, Finished: finished}
	if prompt > 0 {
		e.q.AddQueries(prompt) // before Begin, as Collect expects
		p.Arrivals, p.HitTokens = []int64{id}, []int32{int32(hit)}
		for b := 0; b < hit/4; b++ {
			p.HitBlocks = append(p.HitBlocks, e.table[row*4+b])
		}
	}
	if err := e.c.Begin(p); err != nil {
		e.t.Fatal(err)
	}
	o := &omnicache.Outputs{Tokens: n}
	for _, rb := range e.rbs {
		o.Tensors = append(o.Tensors, omnicache.Tensor{Host: make([]byte, n*rb), Rows: n})
	}
	sid, err := e.c.Save(o)
	if err != nil {
		e.t.Fatal(err)
	}
	if e.has {
		if err := e.c.Discard(e.pending); err != nil {
			e.t.Fatal(err)
		}
	}
	e.pending, e.has = sid, true
}

// TestScrapeRealCache scrapes a real cache over HTTP mid-run and after a
// hit, and checks every value against Stats.
func TestScrapeRealCache(t *testing.T) {
	for _, buffer := range []bool{true, false} {
		e := newEngine(t, buffer)
		url := serve(t, New(e.c, Options{Queries: e.q}))

		e.step(1, 0, 0, 8, 8, 0)
		// Not yet consumed and not synced: only the values the committer
		// cannot move are fixed.
		fams := scrape(t, url)
		for name, want := range map[string]float64{
			"omnicache_staging_pages_in_use": 1,
			"omnicache_live_requests":        1,
		} {
			if got := value(t, fams, name, dto.MetricType_GAUGE, nil); got != want {
				t.Errorf("buffer=%v: %s = %v, want %v", buffer, name, got, want)
			}
		}
		for name, want := range map[string]float64{
			"omnicache_steps_total":                1,
			"omnicache_prefix_cache_queries_total": 8,
			"omnicache_prefix_cache_hits_total":    0,
		} {
			if got := value(t, fams, name, dto.MetricType_COUNTER, nil); got != want {
				t.Errorf("buffer=%v: %s = %v, want %v", buffer, name, got, want)
			}
		}

		for s := 8; s < 11; s++ {
			e.step(1, 0, s, 1, 0, 0)
		}
		e.step(2, 1, 8, 4, 12, 8, 1)
		var res omnicache.Result
		if err := e.c.Materialize(e.pending, []int64{2}, &res); err != nil {
			t.Fatal(err)
		}
		if res.Prefix(0) != 8 {
			t.Fatalf("prefix %d, want a hit of 8", res.Prefix(0))
		}
		if err := e.c.Sync(); err != nil {
			t.Fatal(err)
		}
		want := e.c.Stats()
		fams = scrape(t, url)
		if again := e.c.Stats(); again != want {
			t.Fatalf("Stats moved while idle: %+v then %+v", want, again)
		}
		expect(t, fams, want, nil)
		if got := value(t, fams, "omnicache_prefix_cache_queries_total", dto.MetricType_COUNTER, nil); got != 20 {
			t.Errorf("buffer=%v: queries %v, want 20 (prompts of 8 and 12)", buffer, got)
		}
		// What the story fixes, whatever the write schedule.
		if want.HitTokens != 8 || want.HitRequests != 1 || want.Steps != 5 || want.LiveRequests != 1 || want.PagesInUse != 0 ||
			want.RowsWritten == 0 || want.BytesWritten == 0 || want.MirrorResidentBytes == 0 {
			t.Errorf("buffer=%v: unexpected stats %+v", buffer, want)
		}
		if buffer && want.BufferedSteps == 0 {
			t.Errorf("decode steps not buffered: %+v", want)
		}
	}
}

// fixed is a Source returning one Stats value.
type fixed omnicache.Stats

func (f *fixed) Stats() omnicache.Stats { return omnicache.Stats(*f) }

// distinct returns Stats whose every field holds a different value.
func distinct() omnicache.Stats {
	var s omnicache.Stats
	v := reflect.ValueOf(&s).Elem()
	for i := range v.NumField() {
		v.Field(i).SetInt(int64(1000*(i+1) + 7)) // nanosecond fields give fractional seconds
	}
	return s
}

// TestEveryStatsField fails when a Stats field is not exported, or is
// exported from the wrong field: every field holds a different value.
func TestEveryStatsField(t *testing.T) {
	s := distinct()
	src := fixed(s)
	fams := scrape(t, serve(t, New(&src, Options{})))
	expect(t, fams, s, nil)

	exported := map[string]bool{}
	for _, m := range stats {
		if exported[m.field] {
			t.Errorf("Stats.%s exported twice", m.field)
		}
		exported[m.field] = true
	}
	st := reflect.TypeFor[omnicache.Stats]()
	for i := range st.NumField() {
		if f := st.Field(i).Name; !exported[f] {
			t.Errorf("Stats.%s is not exported as a metric", f)
		}
	}
	if len(fams) != len(stats) {
		t.Errorf("%d families, want %d", len(fams), len(stats))
	}
	if _, ok := fams["omnicache_prefix_cache_queries_total"]; ok {
		t.Errorf("queries exported without a query source")
	}
}

// TestConventions runs the Prometheus linter (naming, units, _total) over
// the collector, queries included.
func TestConventions(t *testing.T) {
	src := fixed(distinct())
	probs, err := testutil.CollectAndLint(New(&src, Options{Queries: new(QueryCounter)}))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range probs {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	for _, m := range stats {
		if counter := m.typ == prometheus.CounterValue; counter != strings.HasSuffix(m.name, "_total") {
			t.Errorf("%s: counter %v", m.name, counter)
		}
	}
}

// TestConstLabels serves two caches from one registry, told apart by a
// label, with their own query counters.
func TestConstLabels(t *testing.T) {
	a, b := fixed(distinct()), fixed{HitTokens: 64, PagesInUse: 2}
	var qa, qb QueryCounter
	qa.AddQueries(5000)
	qb.AddQueries(128)
	fams := scrape(t, serve(t,
		New(&a, Options{Queries: &qa, ConstLabels: prometheus.Labels{"cache": "a"}}),
		New(&b, Options{Queries: &qb, ConstLabels: prometheus.Labels{"cache": "b"}}),
	))
	expect(t, fams, omnicache.Stats(a), map[string]string{"cache": "a"})
	expect(t, fams, omnicache.Stats(b), map[string]string{"cache": "b"})
	for l, want := range map[string]float64{"a": 5000, "b": 128} {
		if got := value(t, fams, "omnicache_prefix_cache_queries_total", dto.MetricType_COUNTER, map[string]string{"cache": l}); got != want {
			t.Errorf("cache %s: queries %v, want %v", l, got, want)
		}
	}
}

// TestSecondsExact: nanosecond counters are exported as seconds without
// losing the nanoseconds that float64 holds.
func TestSecondsExact(t *testing.T) {
	src := fixed{StallNanos: 1_500_000_001, CommitterNanos: math.MaxInt32}
	fams := scrape(t, serve(t, New(&src, Options{})))
	if got := value(t, fams, "omnicache_engine_stall_seconds_total", dto.MetricType_COUNTER, nil); got != 1.500000001 {
		t.Errorf("stall %v", got)
	}
	if got := value(t, fams, "omnicache_committer_busy_seconds_total", dto.MetricType_COUNTER, nil); got != float64(math.MaxInt32)/1e9 {
		t.Errorf("committer %v", got)
	}
}

// TestScrapeHistograms scrapes a real cache with Config.Histograms: every
// cache histogram is exported with buckets from 1µs, the hit read counted
// once, a page claim per step; without the option none is exported.
func TestScrapeHistograms(t *testing.T) {
	for _, on := range []bool{true, false} {
		e := newEngine(t, false, on)
		url := serve(t, New(e.c, Options{Queries: e.q}))
		e.step(1, 0, 0, 8, 8, 0)
		e.step(2, 1, 8, 4, 12, 8, 1)
		var res omnicache.Result
		if err := e.c.Materialize(e.pending, []int64{2}, &res); err != nil {
			t.Fatal(err)
		}
		e.has = false
		if err := e.c.Sync(); err != nil {
			t.Fatal(err)
		}
		fams := scrape(t, url)
		if !on {
			for _, name := range Histograms {
				if _, ok := fams[Namespace+"_"+name]; ok {
					t.Errorf("%s exported without Config.Histograms", name)
				}
			}
			continue
		}
		count := map[string]uint64{}
		for _, name := range Histograms[:5] {
			f, ok := fams[Namespace+"_"+name]
			if !ok || f.GetType() != dto.MetricType_HISTOGRAM || len(f.GetMetric()) != 1 {
				t.Fatalf("%s: not one histogram: %v", name, f)
			}
			h := f.GetMetric()[0].GetHistogram()
			b := h.GetBucket()
			want := 1e-6
			if strings.HasSuffix(name, "_bytes") {
				want = 256
			}
			if len(b) < 20 || b[0].GetUpperBound() != want {
				t.Errorf("%s: %d buckets from %v", name, len(b), b[0].GetUpperBound())
			}
			count[name] = h.GetSampleCount()
		}
		if count["hit_read_wait_seconds"] != 1 || count["staging_page_wait_seconds"] != 2 {
			t.Errorf("counts %v: want 1 hit read, 2 page claims", count)
		}
		if _, ok := fams[Namespace+"_tier_get_seconds"]; ok {
			t.Errorf("tier histograms exported without a tier")
		}
	}
}
