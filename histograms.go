package omnicache

import (
	"github.com/omnicache/omnicache/internal/hist"
	"github.com/omnicache/omnicache/internal/writer"
	"github.com/omnicache/omnicache/tier"
)

// Histogram is a latency or size histogram at one moment, as a Prometheus
// histogram (see tier.Histogram).
type Histogram = tier.Histogram

func newWriterHists(on bool) *writer.Hists {
	if !on {
		return nil
	}
	return writer.NewHists()
}

// Histograms returns the cache's histograms, nil unless
// Config.Histograms (names without the "omnicache_" namespace):
//
//	hit_read_wait_seconds         Materialize's read of a step with hits: 0 when its rows
//	                              were ready (the prefetch done, the writes it joins
//	                              landed; no clock read), else the read, wait included
//	staging_page_wait_seconds     a Save's wait for a free staging page (0 when one was free)
//	committer_wait_seconds        the engine goroutine's waits for the committer
//	                              (Sync, device byte budget pressure)
//	device_to_host_copy_seconds   a write's device→host copies, issue to completion seen
//	device_to_host_copy_bytes     their bytes
//
// With a tier, the link's own, whatever Config.Histograms says:
//
//	tier_publish_lag_seconds      a full block's Begin to its store in the tier
//	                              (with TierConfig.PublishBarrier)
//	tier_import_seconds           a step's Begin to its tier blocks' rows in the mirror
//	tier_import_wait_seconds      a consumer's wait for its step's import
//
// With a tier whose histograms are on (tier.Options.Histograms), its own
// follow (tier_lookup_seconds, ...; see tier.Tier.Histograms): a tier
// shared by several caches reports the same values through each. Any
// goroutine; it never waits on the cache's locks.
func (c *Cache) Histograms() []Histogram {
	if c.hitWait == nil {
		var out []Histogram
		if c.tl != nil {
			out = append(c.linkHistograms(), c.tl.Store().Histograms()...)
		}
		return out
	}
	h := c.parts.Hists
	out := []Histogram{
		histogramOf("hit_read_wait_seconds", "Time Materialize spent reading a step with hits when its rows were not ready: its wait for the prefetch or the writes it joins, and the copy (0 when they were ready).", c.hitWait, 1e9),
		histogramOf("staging_page_wait_seconds", "Time a Save waited for a free staging page (0 when one was free).", h.PageWait, 1e9),
		histogramOf("committer_wait_seconds", "Time the engine goroutine waited for the committer (Sync, device byte budget pressure).", h.CommitterWait, 1e9),
		histogramOf("device_to_host_copy_seconds", "Time of a write's device-to-host copies, from their issue to the committer seeing them complete.", h.CopyTime, 1e9),
		histogramOf("device_to_host_copy_bytes", "Bytes of a write's device-to-host copies.", h.CopyBytes, 1),
	}
	if c.tl != nil {
		out = append(out, c.linkHistograms()...)
		out = append(out, c.tl.Store().Histograms()...)
	}
	return out
}

// linkHistograms are the tier link's own, kept whenever a tier is set.
func (c *Cache) linkHistograms() []Histogram {
	lag, imp, wait := c.tl.Histograms()
	return []Histogram{
		histogramOf("tier_publish_lag_seconds", "Time from the Begin of the step that completed a full block to the block stored in the tier (with TierConfig.PublishBarrier).", lag, 1e9),
		histogramOf("tier_import_seconds", "Time from the Begin of a step with tier blocks to their rows in the mirror.", imp, 1e9),
		histogramOf("tier_import_wait_seconds", "Time a step's consumer waited for its tier import to be in the mirror (0 when it was).", wait, 1e9),
	}
}

// histogramOf is h's state as a Histogram (div: h's unit into the
// metric's, 1e9 for nanoseconds to seconds).
func histogramOf(name, help string, h *hist.H, div float64) Histogram {
	b, c, n, sum := h.Export(div)
	return Histogram{Name: name, Help: help, Bounds: b, Counts: c, Count: n, Sum: sum}
}
