// Package metrics exports a cache's Stats as Prometheus metrics, so that an
// engine vendoring omnicache scrapes standard names instead of polling Stats
// and inventing its own. The core package does not import Prometheus; this
// package does.
//
// It owns two things: the Collector, a prometheus.Collector that reads a
// Source (anything with Stats(), e.g. *omnicache.Cache) on every scrape, and
// the QueryCounter, where the engine counts its prefix-cache queries (the
// cache cannot: it never sees prompt lengths).
//
// Goroutines: Collect and Describe run on the goroutine of whoever gathers
// the registry (the promhttp handler's, per scrape), concurrently with the
// engine goroutine; they only call Source.Stats, which the cache allows from
// any goroutine and which never waits on the cache's state lock, and
// QuerySource.QueryTokens. Nothing runs on the engine goroutine except
// QueryCounter.AddQueries, one atomic add.
//
// Histograms: a Source that is also a HistogramSource (*omnicache.Cache
// with Config.Histograms) has its latency and size histograms exported
// too (the names in Histograms), each read from the cache's lock-free
// counters at scrape time and sent as a const histogram: nothing is
// recorded through this package on the engine goroutine.
//
// Names follow the Prometheus conventions: the omnicache_ namespace,
// counters end in _total, units are base units in the name (_bytes,
// _seconds). Prefix-cache queries and hits count tokens, as vLLM's
// vllm:prefix_cache_queries and vllm:prefix_cache_hits do, so the hit rate is
//
//	rate(omnicache_prefix_cache_hits_total[1m]) / rate(omnicache_prefix_cache_queries_total[1m])
package metrics

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/omnicache/omnicache"
)

// Namespace prefixes every metric name.
const Namespace = "omnicache"

// Source is what the Collector reads; *omnicache.Cache implements it. Stats
// must be safe to call from any goroutine.
type Source interface {
	Stats() omnicache.Stats
}

// HistogramSource is a Source that also has histograms (*omnicache.Cache
// does, with Config.Histograms): the Collector exports each one it knows
// (Histograms) as a Prometheus histogram, read at scrape time.
type HistogramSource interface {
	Histograms() []omnicache.Histogram
}

// Histograms names the histograms the Collector exports (without the
// namespace), in exposition order: the cache's, then its tier's.
var Histograms = []string{
	"hit_read_wait_seconds", "staging_page_wait_seconds", "committer_wait_seconds",
	"device_to_host_copy_seconds", "device_to_host_copy_bytes",
	"tier_lookup_seconds", "tier_get_seconds", "tier_set_seconds", "tier_get_bytes", "tier_set_bytes",
}

var histHelp = map[string]string{
	"hit_read_wait_seconds":       "Time Materialize spent reading a step with hits when its rows were not ready: its wait for the prefetch or the writes it joins, and the copy (0 when they were ready).",
	"staging_page_wait_seconds":   "Time a Save waited for a free staging page (0 when one was free).",
	"committer_wait_seconds":      "Time the engine goroutine waited for the committer (Sync, device byte budget pressure).",
	"device_to_host_copy_seconds": "Time of a write's device-to-host copies, from their issue to the committer seeing them complete.",
	"device_to_host_copy_bytes":   "Bytes of a write's device-to-host copies.",
	"tier_lookup_seconds":         "Time of one tier Lookup (the scheduler's query of leading blocks).",
	"tier_get_seconds":            "Time of one tier get batch (an import's fetch) on the backend.",
	"tier_set_seconds":            "Time of one tier set batch (a publisher's store) on the backend.",
	"tier_get_bytes":              "Value bytes one tier get batch read.",
	"tier_set_bytes":              "Value bytes one tier set batch stored.",
}

// QuerySource yields the prefix-cache query count in tokens; QueryCounter
// implements it.
type QuerySource interface {
	QueryTokens() int64
}

// QueryCounter counts prefix-cache queries in tokens, as vLLM does: every
// request the engine looks up in its KV prefix cache adds its prompt tokens
// (hits and misses alike), once, when it first arrives. The zero value is
// ready; it is safe for concurrent use and AddQueries does not allocate.
type QueryCounter struct {
	n atomic.Int64
}

// AddQueries counts tokens looked up (a request's prompt tokens at arrival).
// Call it before the Begin of the request's arrival step: the cache counts
// the request's hit in that step (Stats.HitTokens moves in its Save).
func (q *QueryCounter) AddQueries(tokens int) { q.n.Add(int64(tokens)) }

// QueryTokens returns the tokens counted so far.
func (q *QueryCounter) QueryTokens() int64 { return q.n.Load() }

// Options configure a Collector.
type Options struct {
	// Queries feeds omnicache_prefix_cache_queries_total. Nil leaves that
	// metric out rather than exporting a made-up value: Stats has hits but
	// no queries.
	Queries QuerySource
	// ConstLabels are added to every metric (e.g. {"cache": "thinker"} for
	// an engine running several caches in one registry).
	ConstLabels prometheus.Labels
}

// Collector is a prometheus.Collector over a Source's Stats: one Stats call
// per scrape, every value from that one snapshot.
type Collector struct {
	src     Source
	queries QuerySource
	descs   []*prometheus.Desc          // parallel to stats
	qdesc   *prometheus.Desc            // nil without Options.Queries
	hsrc    HistogramSource             // nil: src has none
	hdescs  map[string]*prometheus.Desc // by histogram name; read-only after New
}

// metric is one exported Stats field.
type metric struct {
	name  string // without the namespace
	field string // the Stats field (for the tests and the docs)
	typ   prometheus.ValueType
	help  string
	value func(*omnicache.Stats) float64
}

const nanosPerSecond = 1e9

// stats lists every exported Stats field, in exposition order.
var stats = []metric{
	{"prefix_cache_hits_total", "HitTokens", prometheus.CounterValue,
		"Prompt tokens the prefix cache hit at arrival (as vLLM's prefix_cache_hits).",
		func(s *omnicache.Stats) float64 { return float64(s.HitTokens) }},
	{"prefix_cache_hit_requests_total", "HitRequests", prometheus.CounterValue,
		"Arrivals with a prefix hit.",
		func(s *omnicache.Stats) float64 { return float64(s.HitRequests) }},
	{"hit_rows_read_total", "HitRowsRead", prometheus.CounterValue,
		"Prefix rows served by Materialize (all keys).",
		func(s *omnicache.Stats) float64 { return float64(s.HitRowsRead) }},
	{"hit_reads_on_caller_total", "HitReadsOnCaller", prometheus.CounterValue,
		"Prefetched steps consumed before the committer started their hit read: Materialize read the rows itself.",
		func(s *omnicache.Stats) float64 { return float64(s.HitReadsOnCaller) }},
	{"steps_total", "Steps", prometheus.CounterValue,
		"Steps saved (Save calls that succeeded).",
		func(s *omnicache.Stats) float64 { return float64(s.Steps) }},
	{"write_tasks_total", "WriteTasks", prometheus.CounterValue,
		"Write tasks handed to the committer.",
		func(s *omnicache.Stats) float64 { return float64(s.WriteTasks) }},
	{"written_rows_total", "RowsWritten", prometheus.CounterValue,
		"Rows scattered into the host mirror (all keys).",
		func(s *omnicache.Stats) float64 { return float64(s.RowsWritten) }},
	{"written_bytes_total", "BytesWritten", prometheus.CounterValue,
		"Bytes scattered into the host mirror (all keys).",
		func(s *omnicache.Stats) float64 { return float64(s.BytesWritten) }},
	{"skipped_rows_total", "RowsSkipped", prometheus.CounterValue,
		"Rows a write task skipped because a newer write took the slot.",
		func(s *omnicache.Stats) float64 { return float64(s.RowsSkipped) }},
	{"buffered_steps_total", "BufferedSteps", prometheus.CounterValue,
		"Pure-decode steps parked in the decode buffer.",
		func(s *omnicache.Stats) float64 { return float64(s.BufferedSteps) }},
	{"buffer_flushes_total", "BufferFlushes", prometheus.CounterValue,
		"Decode-buffer flushes (each one write task).",
		func(s *omnicache.Stats) float64 { return float64(s.BufferFlushes) }},
	{"deferred_writes_total", "DeferredWrites", prometheus.CounterValue,
		"Write tasks of deferred keys.",
		func(s *omnicache.Stats) float64 { return float64(s.DeferredWrites) }},
	{"budget_flushes_total", "BudgetFlushes", prometheus.CounterValue,
		"Writes forced out early by device byte budget pressure.",
		func(s *omnicache.Stats) float64 { return float64(s.BudgetFlushes) }},
	{"cloned_bytes_total", "ClonedBytes", prometheus.CounterValue,
		"Bytes copied defensively out of outputs not marked Owned.",
		func(s *omnicache.Stats) float64 { return float64(s.ClonedBytes) }},
	{"engine_stall_seconds_total", "StallNanos", prometheus.CounterValue,
		"Time the engine goroutine waited on back-pressure (a free staging page, the committer under budget pressure).",
		func(s *omnicache.Stats) float64 { return float64(s.StallNanos) / nanosPerSecond }},
	{"committer_busy_seconds_total", "CommitterNanos", prometheus.CounterValue,
		"Time the committer goroutine spent moving rows into the mirror.",
		func(s *omnicache.Stats) float64 { return float64(s.CommitterNanos) / nanosPerSecond }},
	{"mirror_resident_bytes", "MirrorResidentBytes", prometheus.GaugeValue,
		"Host memory really backing the mirror.",
		func(s *omnicache.Stats) float64 { return float64(s.MirrorResidentBytes) }},
	{"budget_charged_bytes", "BudgetCharged", prometheus.GaugeValue,
		"Device bytes the cache holds now (step clones, deferred clones, parked decode rows).",
		func(s *omnicache.Stats) float64 { return float64(s.BudgetCharged) }},
	{"budget_limit_bytes", "BudgetLimit", prometheus.GaugeValue,
		"Device byte budget (Config.DeviceBudgetBytes).",
		func(s *omnicache.Stats) float64 { return float64(s.BudgetLimit) }},
	{"budget_peak_bytes", "BudgetPeak", prometheus.GaugeValue,
		"Highest device byte charge ever held.",
		func(s *omnicache.Stats) float64 { return float64(s.BudgetPeak) }},
	{"staging_pages_in_use", "PagesInUse", prometheus.GaugeValue,
		"Staging pages held now (one per saved step not yet materialized or discarded).",
		func(s *omnicache.Stats) float64 { return float64(s.PagesInUse) }},
	{"staging_pages_allocating", "PagesAllocating", prometheus.GaugeValue,
		"1 while a staging page's memory is being allocated ahead in the background, else 0.",
		func(s *omnicache.Stats) float64 { return float64(s.PagesAllocating) }},
	{"read_ahead_bytes", "ReadAheadBytes", prometheus.GaugeValue,
		"Hit prefetch buffers held by steps not consumed yet (Config.ReadAheadBytes bounds it).",
		func(s *omnicache.Stats) float64 { return float64(s.ReadAheadBytes) }},
	{"live_requests", "LiveRequests", prometheus.GaugeValue,
		"Requests the cache tracks now.",
		func(s *omnicache.Stats) float64 { return float64(s.LiveRequests) }},
	{"prefetch_used_steps_total", "PrefetchUsed", prometheus.CounterValue,
		"Steps whose hit prefixes were read ahead and served by Materialize.",
		func(s *omnicache.Stats) float64 { return float64(s.PrefetchUsed) }},
	{"prefetch_dropped_steps_total", "PrefetchDropped", prometheus.CounterValue,
		"Steps whose hit prefixes were read ahead (or queued to be) and then discarded or aborted.",
		func(s *omnicache.Stats) float64 { return float64(s.PrefetchDropped) }},
	{"resets_total", "Resets", prometheus.CounterValue,
		"Cache.Reset calls that dropped every row (after a weight update).",
		func(s *omnicache.Stats) float64 { return float64(s.Resets) }},
	// With a tier (Config.Tier); zero without.
	{"tier_published_blocks_total", "TierPublished", prometheus.CounterValue,
		"Full blocks published to the tier.",
		func(s *omnicache.Stats) float64 { return float64(s.TierPublished) }},
	{"tier_publish_dropped_blocks_total", "TierPublishDropped", prometheus.CounterValue,
		"Full blocks not published because the publish queue was full.",
		func(s *omnicache.Stats) float64 { return float64(s.TierPublishDropped) }},
	{"tier_publish_skipped_blocks_total", "TierPublishSkipped", prometheus.CounterValue,
		"Full blocks not published because their rows were not all committed.",
		func(s *omnicache.Stats) float64 { return float64(s.TierPublishSkipped) }},
	{"tier_publish_recent_blocks_total", "TierPublishRecent", prometheus.CounterValue,
		"Full blocks not published because the tier stored them within its recent window.",
		func(s *omnicache.Stats) float64 { return float64(s.TierPublishRecent) }},
	{"tier_publish_unadmitted_blocks_total", "TierPublishUnadmitted", prometheus.CounterValue,
		"Full blocks not published because they were seen fewer than TierConfig.AdmitAfter times.",
		func(s *omnicache.Stats) float64 { return float64(s.TierPublishUnadmitted) }},
	{"tier_publish_failed_blocks_total", "TierPublishErrors", prometheus.CounterValue,
		"Full blocks whose store in the tier failed.",
		func(s *omnicache.Stats) float64 { return float64(s.TierPublishErrors) }},
	{"tier_published_bytes_total", "TierBytesPublished", prometheus.CounterValue,
		"Value bytes stored in the tier.",
		func(s *omnicache.Stats) float64 { return float64(s.TierBytesPublished) }},
	{"tier_publish_pending_blocks", "TierPublishPending", prometheus.GaugeValue,
		"Full blocks in the publish queue or being stored now.",
		func(s *omnicache.Stats) float64 { return float64(s.TierPublishPending) }},
	{"tier_imported_blocks_total", "TierImported", prometheus.CounterValue,
		"Blocks imported from the tier into the mirror.",
		func(s *omnicache.Stats) float64 { return float64(s.TierImported) }},
	{"tier_import_failed_blocks_total", "TierImportFailed", prometheus.CounterValue,
		"Blocks an import could not bring (evicted, corrupt, unreachable, too slow): their requests failed.",
		func(s *omnicache.Stats) float64 { return float64(s.TierImportFailed) }},
	{"tier_imported_bytes_total", "TierBytesImported", prometheus.CounterValue,
		"Row bytes imported from the tier into the mirror.",
		func(s *omnicache.Stats) float64 { return float64(s.TierBytesImported) }},
	{"tier_circuit_opens_total", "TierCircuitOpens", prometheus.CounterValue,
		"Times a tier call ran out of its time and opened the tier's circuit (calls then fail at once).",
		func(s *omnicache.Stats) float64 { return float64(s.TierCircuitOpens) }},
	{"tier_circuit_open", "TierCircuitOpen", prometheus.GaugeValue,
		"1 while the tier's circuit is open (the store timed out and has not answered a probe since), else 0.",
		func(s *omnicache.Stats) float64 { return float64(s.TierCircuitOpen) }},
}

// New returns a Collector over src. Register it with a prometheus.Registerer.
func New(src Source, o Options) *Collector {
	c := &Collector{src: src, queries: o.Queries, descs: make([]*prometheus.Desc, len(stats))}
	for i, m := range stats {
		c.descs[i] = prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", m.name), m.help, nil, o.ConstLabels)
	}
	if hs, ok := src.(HistogramSource); ok {
		c.hsrc, c.hdescs = hs, map[string]*prometheus.Desc{}
		for _, name := range Histograms {
			c.hdescs[name] = prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), histHelp[name], nil, o.ConstLabels)
		}
	}
	if o.Queries != nil {
		c.qdesc = prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "prefix_cache_queries_total"),
			"Prompt tokens looked up in the prefix cache at arrival, hits and misses (as vLLM's prefix_cache_queries).",
			nil, o.ConstLabels)
	}
	return c
}

// Describe sends every metric's descriptor.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	if c.qdesc != nil {
		ch <- c.qdesc
	}
	for _, d := range c.descs {
		ch <- d
	}
	if c.hsrc != nil {
		for _, name := range Histograms {
			ch <- c.hdescs[name]
		}
	}
}

// Collect reads Stats once and sends every metric from that snapshot. The
// query count is read after Stats, so that with queries counted before the
// arrival step (see AddQueries) a scrape never shows more hits than queries.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.Stats()
	if c.qdesc != nil {
		ch <- prometheus.MustNewConstMetric(c.qdesc, prometheus.CounterValue, float64(c.queries.QueryTokens()))
	}
	for i, m := range stats {
		ch <- prometheus.MustNewConstMetric(c.descs[i], m.typ, m.value(&s))
	}
	if c.hsrc == nil {
		return
	}
	for _, h := range c.hsrc.Histograms() {
		d := c.hdescs[h.Name]
		if d == nil {
			continue // not one Describe announced
		}
		buckets := make(map[float64]uint64, len(h.Bounds))
		for i, b := range h.Bounds {
			buckets[b] = h.Counts[i]
		}
		ch <- prometheus.MustNewConstHistogram(d, h.Count, h.Sum, buckets)
	}
}
