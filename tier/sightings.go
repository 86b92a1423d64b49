package tier

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// Sightings counts how often each block hash was seen, for admission
// (omnicache.TierConfig.AdmitAfter: a block is published once seen that
// many times), in a count-min sketch of SightingRows rows of atomic 32-bit
// counters: bounded memory whatever the number of blocks, no lock, no
// allocation per sighting. A count is never under the true one; it is
// over it when every row's counter of the hash is shared with other
// hashes (with n distinct hashes since the last aging and w counters a
// row, about (1-e^(-n/w))^4: 1% at n = w/2.6). Aging halves every counter
// once the sightings since the last aging reach 8 × w, so that blocks
// seen long ago stop counting.
type Sightings struct {
	w     uint64 // counters per row, a power of two
	rows  [SightingRows][]atomic.Uint32
	adds  atomic.Uint64 // sightings since the last aging
	aging sync.Mutex
}

// SightingRows is the sketch's number of rows (independent hashes).
const SightingRows = 4

// DefaultSightingCounters is the counters per row of a tier's sketch
// when Options.SightingCounters is zero: 4 rows × 2^18 × 4 bytes = 4 MiB.
const DefaultSightingCounters = 1 << 18

// MaxSightingCounters bounds Options.SightingCounters.
const MaxSightingCounters = 1 << 26

// NewSightings returns a sketch of w counters a row (rounded up to a
// power of two; at least 64): 16·w bytes.
func NewSightings(w int) *Sightings {
	w = max(64, w)
	n := uint64(1) << bits.Len64(uint64(w-1))
	s := &Sightings{w: n}
	for r := range s.rows {
		s.rows[r] = make([]atomic.Uint32, n)
	}
	return s
}

// Bytes is the sketch's memory.
func (s *Sightings) Bytes() int64 { return int64(SightingRows) * int64(s.w) * 4 }

// slot is row r's counter index for hash h (block hashes are already
// uniform; each row mixes them differently).
func (s *Sightings) slot(h uint64, r int) uint64 {
	x := (h ^ uint64(r)*0x9e3779b97f4a7c15) * 0xbf58476d1ce4e5b9
	x ^= x >> 31
	return x & (s.w - 1)
}

// See counts one sighting of h and returns its estimated count, this one
// included. Safe for concurrent use: every row's counter is raised by an
// atomic add, so concurrent sightings are all counted.
func (s *Sightings) See(h uint64) int {
	m := uint32(1<<32 - 1)
	for r := range s.rows {
		m = min(m, s.rows[r][s.slot(h, r)].Add(1))
	}
	if s.adds.Add(1) >= 8*s.w {
		s.age()
	}
	return int(m)
}

// Count is h's estimated count, not counting a sighting.
func (s *Sightings) Count(h uint64) int {
	m := uint32(1<<32 - 1)
	for r := range s.rows {
		m = min(m, s.rows[r][s.slot(h, r)].Load())
	}
	return int(m)
}

// age halves every counter (one caller does it; the others go on: a
// sighting landing meanwhile may be halved or not, an estimate either way).
func (s *Sightings) age() {
	if !s.aging.TryLock() {
		return
	}
	defer s.aging.Unlock()
	if s.adds.Load() < 8*s.w {
		return
	}
	s.adds.Store(0)
	for r := range s.rows {
		for i := range s.rows[r] {
			c := &s.rows[r][i]
			for {
				v := c.Load()
				if v == 0 || c.CompareAndSwap(v, v/2) {
					break
				}
			}
		}
	}
}

// Sightings is the tier's sketch of block sightings, shared by every cache
// using the tier (replicas in one process count together); it is made on
// first use (Options.SightingCounters sizes it).
func (t *Tier) Sightings() *Sightings {
	t.sightOnce.Do(func() { t.sight = NewSightings(t.sightW) })
	return t.sight
}
