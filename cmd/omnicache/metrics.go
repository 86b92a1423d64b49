package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof" // its init also registers on http.DefaultServeMux, which is never served here
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/replay"
	"github.com/omnicache/omnicache/internal/replay/sim"
	"github.com/omnicache/omnicache/metrics"
)

// metricsServer serves --metrics-addr: /metrics (every cache-on run's
// cache, labelled workload="model/name", plus the Go runtime and process
// collectors) and /debug/pprof/, on its own mux.
type metricsServer struct {
	url  string // http://ADDR/metrics
	reg  *prometheus.Registry
	srv  *http.Server
	done chan struct{}

	mu       sync.Mutex
	runs     map[string]*liveRun
	replicas map[string]prometheus.Collector // by workload and replica
}

// attachReplica exports a replica's cache (--replicas), labelled
// workload and replica, with its histograms and its tier's; a cache
// attached earlier under the same labels is dropped.
func (m *metricsServer) attachReplica(workload string, replica int, c *omnicache.Cache) {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := fmt.Sprintf("%s\x00%d", workload, replica)
	if old := m.replicas[key]; old != nil {
		m.reg.Unregister(old)
	}
	col := metrics.New(c, metrics.Options{ConstLabels: prometheus.Labels{"workload": workload, "replica": fmt.Sprint(replica)}})
	m.reg.MustRegister(col)
	m.replicas[key] = col
}

// metricsEvent is what metricsHook sees.
type metricsEvent struct {
	url      string // the /metrics URL
	workload string
	closed   bool // the run's cache closed (its final Stats stay exported)
	step     int  // unless closed: the step about to Begin
}

// metricsHook, when set (tests), is called on the engine goroutine before
// every step's Begin of a cache-on run and after its cache closes, while the
// server serves: a test scrapes at a chosen point instead of racing a timer.
var metricsHook func(metricsEvent)

// startMetrics listens on addr and serves until close; it prints the URL to
// stderr (addr may name port 0).
func startMetrics(addr string, stderr io.Writer) (*metricsServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	m := &metricsServer{
		url:  "http://" + ln.Addr().String() + "/metrics",
		reg:  prometheus.NewRegistry(),
		done: make(chan struct{}),
		runs: map[string]*liveRun{},

		replicas: map[string]prometheus.Collector{},
	}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: errLog{stderr}}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(m.done)
		if err := m.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(stderr, "metrics: %v\n", err)
		}
	}()
	fmt.Fprintf(stderr, "metrics: serving on %s (and /debug/pprof/)\n", m.url)
	return m, nil
}

// close stops serving, cutting off scrapes in progress.
func (m *metricsServer) close() {
	m.srv.Close()
	<-m.done
}

// attach makes a cache-on run's cache visible under workload: the first
// run of a workload registers its collector; a repeat replaces the cache
// and restarts its counters (a new cache, as after a process restart).
func (m *metricsServer) attach(o *replay.Options, workload string) {
	m.mu.Lock()
	r := m.runs[workload]
	if r == nil {
		r = &liveRun{queries: new(metrics.QueryCounter)}
		m.runs[workload] = r
		m.reg.MustRegister(metrics.New(r, metrics.Options{Queries: r, ConstLabels: prometheus.Labels{"workload": workload}}))
	}
	m.mu.Unlock()
	newCache := o.NewCache
	if newCache == nil {
		newCache = replay.NewRealCache
	}
	o.NewCache = func(cfg omnicache.Config) (replay.Cache, error) {
		cfg.Histograms = true // exported: omnicache_*_seconds, _bytes
		c, err := newCache(cfg)
		if err != nil {
			return nil, err
		}
		r.open(c)
		return &closeHook{Cache: c, close: func() error {
			err := r.close()
			if metricsHook != nil {
				metricsHook(metricsEvent{url: m.url, workload: workload, closed: true})
			}
			return err
		}}, nil
	}
	o.OnStep = func(st *sim.Step) {
		r.queries.AddQueries(st.Queried) // before the step that counts their hits
		if metricsHook != nil {
			metricsHook(metricsEvent{url: m.url, workload: workload, step: st.Index})
		}
	}
}

// liveRun is one workload's metrics.Source: the open cache's Stats, or
// once it closed, its final Stats.
type liveRun struct {
	mu    sync.Mutex
	cache replay.Cache // nil once closed
	last  omnicache.Stats
	lastH []omnicache.Histogram
	// queries is replaced by open and fed by OnStep, both on the engine
	// goroutine; Collect reads it under mu.
	queries *metrics.QueryCounter
}

func (r *liveRun) open(c replay.Cache) {
	r.mu.Lock()
	r.cache, r.last, r.lastH, r.queries = c, omnicache.Stats{}, nil, new(metrics.QueryCounter)
	r.mu.Unlock()
}

func (r *liveRun) close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cache == nil {
		return nil
	}
	err := r.cache.Close()
	r.last, r.lastH, r.cache = r.cache.Stats(), histogramsOf(r.cache), nil
	return err
}

// histogramsOf is c's histograms when it has any (a real cache does).
func histogramsOf(c replay.Cache) []omnicache.Histogram {
	if h, ok := c.(metrics.HistogramSource); ok {
		return h.Histograms()
	}
	return nil
}

// Histograms implements metrics.HistogramSource: the open cache's, or
// once it closed, its last ones.
func (r *liveRun) Histograms() []omnicache.Histogram {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cache != nil {
		return histogramsOf(r.cache)
	}
	return r.lastH
}

func (r *liveRun) Stats() omnicache.Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cache != nil {
		return r.cache.Stats()
	}
	return r.last
}

func (r *liveRun) QueryTokens() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.queries.QueryTokens()
}

// closeHook is a replay.Cache whose Close runs close instead.
type closeHook struct {
	replay.Cache
	close func() error
}

func (c *closeHook) Close() error { return c.close() }

// errLog prints promhttp's errors to stderr.
type errLog struct{ w io.Writer }

func (l errLog) Println(v ...any) { fmt.Fprintln(l.w, append([]any{"metrics:"}, v...)...) }
