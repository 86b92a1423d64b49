// Package hist is a lock-free histogram of exponential buckets: one atomic
// add per bucket count and one for the sum per observation, no lock, no
// allocation, so that an observation on the engine goroutine costs a few
// nanoseconds. A scrape reads the counts at any moment (each count is
// exact; a snapshot taken while observations land may see one in its
// count and not yet in its sum, off by one observation at most).
package hist

import (
	"math/bits"
	"sync/atomic"
)

// MaxBuckets is the most finite buckets a histogram has.
const MaxBuckets = 40

// H is a histogram of integer observations (nanoseconds, bytes) in
// exponential buckets: bucket i holds values in (base·2^(i-1), base·2^i],
// bucket 0 values ≤ base, and values above the last bound count in the
// +Inf bucket. The zero value is not usable: see New.
type H struct {
	base   uint64
	n      int
	counts [MaxBuckets + 1]atomic.Uint64 // [n] is +Inf
	sum    atomic.Int64
}

// New returns a histogram of n finite buckets (1..MaxBuckets), the first
// bound base (> 0), each next bound twice the one before.
func New(base int64, n int) *H {
	if base <= 0 || n < 1 || n > MaxBuckets || bits.Len64(uint64(base))+n > 63 {
		panic("hist: bad bucket layout")
	}
	return &H{base: uint64(base), n: n}
}

// Bucket is the bucket index of v.
func (h *H) Bucket(v int64) int {
	if v <= int64(h.base) {
		return 0
	}
	return min(bits.Len64((uint64(v)-1)/h.base), h.n)
}

// Observe counts v (negative counts as 0). Safe for concurrent use; a nil
// H ignores it.
func (h *H) Observe(v int64) {
	if h == nil {
		return
	}
	if v <= 0 { // a wait that did not happen: one add
		h.counts[0].Add(1)
		return
	}
	h.counts[h.Bucket(v)].Add(1)
	h.sum.Add(v)
}

// Snapshot is a histogram's state: Bounds[i] the upper bound of bucket i in
// the observed unit, Counts[i] the observations in bucket i alone (not
// cumulative), Inf those above the last bound, Count all of them.
type Snapshot struct {
	Bounds []int64
	Counts []uint64
	Inf    uint64
	Count  uint64
	Sum    int64
}

// Snapshot reads the counts. A nil H gives an empty snapshot.
func (h *H) Snapshot() Snapshot {
	if h == nil {
		return Snapshot{}
	}
	s := Snapshot{Bounds: make([]int64, h.n), Counts: make([]uint64, h.n)}
	for i := 0; i < h.n; i++ {
		s.Bounds[i] = int64(h.base) << i
		s.Counts[i] = h.counts[i].Load()
		s.Count += s.Counts[i]
	}
	s.Inf = h.counts[h.n].Load()
	s.Count += s.Inf
	s.Sum = h.sum.Load()
	return s
}

// Layouts the project uses: durations in nanoseconds from 1 µs to 8.4 s
// (24 buckets), sizes in bytes from 256 B to 1 GiB (23 buckets).
const (
	DurBase, DurBuckets   = 1000, 24
	SizeBase, SizeBuckets = 256, 23
)

// Export is h's state now in a metric's unit (div turns h's unit into
// it: 1e9 for nanoseconds to seconds): the buckets' upper bounds, the
// cumulative counts at or under each, every observation and their sum.
func (h *H) Export(div float64) (bounds []float64, counts []uint64, count uint64, sum float64) {
	s := h.Snapshot()
	bounds, counts = s.Cumulative(div)
	return bounds, counts, s.Count, float64(s.Sum) / div
}

// NewDur is a duration histogram (nanoseconds), NewSize a byte-size one.
func NewDur() *H  { return New(DurBase, DurBuckets) }
func NewSize() *H { return New(SizeBase, SizeBuckets) }

// Cumulative is the snapshot as Prometheus wants it: upper bounds over
// div (1e9 for nanoseconds to seconds, 1 for bytes) and the count of
// observations at or under each bound.
func (s Snapshot) Cumulative(div float64) (bounds []float64, counts []uint64) {
	bounds, counts = make([]float64, len(s.Bounds)), make([]uint64, len(s.Bounds))
	var c uint64
	for i, b := range s.Bounds {
		c += s.Counts[i]
		bounds[i], counts[i] = float64(b)/div, c
	}
	return bounds, counts
}
