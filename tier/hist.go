package tier

import (
	"time"

	"github.com/omnicache/omnicache/internal/hist"
)

// Histogram is a latency or size histogram at one moment
// (Tier.Histograms, omnicache.Cache.Histograms), as a Prometheus
// histogram: Name is the metric's name without the "omnicache_"
// namespace (its unit, _seconds or _bytes, last), Bounds the buckets'
// upper bounds in that unit, Counts[i] the observations at or under
// Bounds[i] (cumulative), Count every observation (+Inf) and Sum their
// total in the unit.
type Histogram struct {
	Name, Help string
	Bounds     []float64
	Counts     []uint64
	Count      uint64
	Sum        float64
}

// newHistogram is h's state as a Histogram; div turns h's unit into the
// metric's (1e9: nanoseconds to seconds). For this module's packages (h is
// internal).
func newHistogram(name, help string, h *hist.H, div float64) Histogram {
	b, c, n, sum := h.Export(div)
	return Histogram{Name: name, Help: help, Bounds: b, Counts: c, Count: n, Sum: sum}
}

// tierHists are a tier's histograms (Options.Histograms); nil: off.
type tierHists struct {
	lookup, get, set   *hist.H // batch latency, nanoseconds
	getBytes, setBytes *hist.H // batch value bytes
}

func newTierHists() *tierHists {
	return &tierHists{lookup: hist.NewDur(), get: hist.NewDur(), set: hist.NewDur(), getBytes: hist.NewSize(), setBytes: hist.NewSize()}
}

// since observes the time since t0 into h (nothing when histograms are
// off: t0 is then zero and h nil).
func since(h *hist.H, t0 time.Time) {
	if h != nil {
		h.Observe(int64(time.Since(t0)))
	}
}

// start is time.Now when histograms are on, else the zero time (no clock
// read).
func (t *Tier) start() time.Time {
	if t.h == nil {
		return time.Time{}
	}
	return time.Now()
}

// Histograms returns the tier's latency and size histograms, nil unless
// Options.Histograms:
//
//	tier_lookup_seconds   one Lookup (the scheduler's query), backend time
//	tier_get_seconds      one Get/Fetch batch on the backend
//	tier_set_seconds      one Put/PutValues batch on the backend
//	tier_get_bytes        value bytes one Get/Fetch batch read
//	tier_set_bytes        value bytes one Put/PutValues batch stored
func (t *Tier) Histograms() []Histogram {
	h := t.h
	if h == nil {
		return nil
	}
	return []Histogram{
		newHistogram("tier_lookup_seconds", "Time of one tier Lookup (the scheduler's query of leading blocks).", h.lookup, 1e9),
		newHistogram("tier_get_seconds", "Time of one tier get batch (an import's fetch) on the backend.", h.get, 1e9),
		newHistogram("tier_set_seconds", "Time of one tier set batch (a publisher's store) on the backend.", h.set, 1e9),
		newHistogram("tier_get_bytes", "Value bytes one tier get batch read.", h.getBytes, 1),
		newHistogram("tier_set_bytes", "Value bytes one tier set batch stored.", h.setBytes, 1),
	}
}
