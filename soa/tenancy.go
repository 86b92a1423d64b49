package soa

import (
	"sync/atomic"

	"github.com/omnicache/omnicache/internal/hostmem"
)

// Tenancy tracks, for keys that one goroutine writes in order (the cache's
// immediate keys, written by its committer), which write last put its row
// into each slot:
//
//	owner   []uint64  one per slot: id of the last write whose row landed
//	                  in the slot (0: never written)
//
// The owner is per slot, not per block: a write can skip some slots of a
// block (a newer queued write replaces them), so only a per-slot owner says
// exactly whose row a slot holds. A reader that planned to read write W's
// row in slot s reads it only if the owner is exactly W, before and after
// its copy (see the committer's epoch): a smaller owner means W skipped the
// slot, a larger one that a newer write replaced it; either way the row is
// not the planned one. The column comes from internal/hostmem, so only the
// pages of slots ever written become resident.
//
// Exactly one goroutine calls Publish; any goroutine may call Owner
// (atomic loads).
type Tenancy struct {
	owner []uint64
}

// NewTenancy returns the table of numBlocks blocks of blockSize slots. Its
// column comes from internal/hostmem: call Free when done.
func NewTenancy(numBlocks, blockSize int) *Tenancy {
	t := &Tenancy{}
	t.owner, _ = hostmem.Uint64s(numBlocks * blockSize) // falls back to make; never fails
	return t
}

// Free returns the column to the OS; the table must not be used again.
func (t *Tenancy) Free() {
	hostmem.FreeUint64s(t.owner)
	t.owner = nil
}

// Publish records that write id's rows landed in every non-negative slot
// of slots. Single writer only; ids must not decrease.
func (t *Tenancy) Publish(slots []int32, id uint64) {
	owner := t.owner
	for _, s := range slots {
		// The writer is the only goroutine that stores into the column,
		// so it may read it without atomics.
		if s >= 0 && owner[s] != id {
			atomic.StoreUint64(&owner[s], id)
		}
	}
}

// Owner is the id of the last write whose row landed in slot s (0: none).
func (t *Tenancy) Owner(s int32) uint64 { return atomic.LoadUint64(&t.owner[s]) }

// Written reports whether slot s was ever written.
func (t *Tenancy) Written(s int32) bool { return t.Owner(s) != 0 }
