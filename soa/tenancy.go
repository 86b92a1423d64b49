package soa

import (
	"math/bits"
	"sync/atomic"

	"github.com/omnicache/omnicache/internal/hostmem"
)

// Tenancy tracks, for keys that one goroutine writes in order (the cache's
// immediate keys, written by its committer), which write last touched each
// block and which slots were ever written:
//
//	owner   []uint64  one per block: id of the last write into the block
//	written []uint32  one bit per slot: ever written
//
// A block changes tenant as a whole (the engine hands whole blocks to
// requests), so the owner of a block is what a reader compares against the
// writes it has joined; the written bit is what tells an absent row from a
// present one. Updates cost a plain load per row and an atomic store only
// when a value changes (a new owner for the block, a slot's first write),
// instead of an atomic read-modify-write per row.
//
// Exactly one goroutine calls Publish; any goroutine may call Owner and
// Written (atomic loads).
type Tenancy struct {
	owner   []uint64
	written []uint32
	bs      int
	shift   int // log2(bs) when bs is a power of two, else -1
}

// NewTenancy returns the table of numBlocks blocks of blockSize slots. Its
// columns come from internal/hostmem: call Free when done.
func NewTenancy(numBlocks, blockSize int) *Tenancy {
	t := &Tenancy{bs: blockSize, shift: -1}
	if blockSize&(blockSize-1) == 0 {
		t.shift = bits.TrailingZeros(uint(blockSize))
	}
	t.owner, _ = hostmem.Uint64s(numBlocks) // falls back to make; never fails
	t.written, _ = hostmem.Uint32s((numBlocks*blockSize + 31) / 32)
	return t
}

// Free returns the columns to the OS; the table must not be used again.
func (t *Tenancy) Free() {
	hostmem.FreeUint64s(t.owner)
	hostmem.FreeUint32s(t.written)
	t.owner, t.written = nil, nil
}

func (t *Tenancy) block(s int32) int {
	if t.shift >= 0 {
		return int(s) >> t.shift
	}
	return int(s) / t.bs
}

// Publish records that write id wrote every non-negative slot of slots.
// Single writer only; ids must not decrease.
func (t *Tenancy) Publish(slots []int32, id uint64) {
	owner, written := t.owner, t.written
	for _, s := range slots {
		if s < 0 {
			continue
		}
		// The writer is the only goroutine that stores into these columns,
		// so it may read them without atomics.
		if b := t.block(s); owner[b] != id {
			atomic.StoreUint64(&owner[b], id)
		}
		w, bit := s>>5, uint32(1)<<(s&31)
		if old := written[w]; old&bit == 0 {
			atomic.StoreUint32(&written[w], old|bit)
		}
	}
}

// Owner is the id of the last write into the block of slot s (0: none).
func (t *Tenancy) Owner(s int32) uint64 { return atomic.LoadUint64(&t.owner[t.block(s)]) }

// Written reports whether slot s was ever written.
func (t *Tenancy) Written(s int32) bool {
	return atomic.LoadUint32(&t.written[s>>5])&(1<<(s&31)) != 0
}
