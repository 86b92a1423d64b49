package soa

import (
	"fmt"
	"sync/atomic"

	"github.com/omnicache/omnicache/internal/hostmem"
)

// Slot states, the low two bits of an Occupancy word.
const (
	Absent    uint8 = 0
	InTransit uint8 = 1
	Committed uint8 = 2
)

const (
	stateBits = 2
	stateMask = 1<<stateBits - 1
	// MaxOwner is the largest owner (write-task) id a word can hold.
	MaxOwner = 1<<62 - 1
)

// Pack returns the occupancy word of (state, owner): owner<<2 | state.
func Pack(state uint8, owner uint64) uint64 { return owner<<stateBits | uint64(state) }

// Unpack splits an occupancy word into its state and owner.
func Unpack(w uint64) (state uint8, owner uint64) {
	return uint8(w & stateMask), w >> stateBits
}

// Occupancy is the per-slot occupancy of one key: a packed word column
// (atomic) and a row column (plain; under the caller's lock). See the
// package doc for the layout and the goroutine rules.
type Occupancy struct {
	word []uint64
	row  []uint32
}

// NewOccupancy returns the occupancy of numSlots slots, all Absent. It is
// two plain makes: no loop over the slots.
//
// Large columns come straight from the OS (internal/hostmem), so creating
// the table of a big mirror costs microseconds and no resident memory until
// slots are claimed; call Free when done with it. When the OS refuses the
// memory (an address-space limit) it returns an error wrapping
// the system's error and holds nothing.
func NewOccupancy(numSlots int) (*Occupancy, error) {
	o := &Occupancy{}
	var err error
	if o.word, err = hostmem.Uint64s(numSlots); err == nil {
		o.row, err = hostmem.Uint32s(numSlots)
	}
	if err != nil {
		o.Free()
		return nil, fmt.Errorf("soa: occupancy of %d slots: %w", numSlots, err)
	}
	return o, nil
}

// Free returns the columns to the OS. The table must not be used again.
func (o *Occupancy) Free() {
	hostmem.FreeUint64s(o.word)
	hostmem.FreeUint32s(o.row)
	o.word, o.row = nil, nil
}

// Len returns the number of slots.
func (o *Occupancy) Len() int { return len(o.word) }

// Load returns the state and owner write id of slot s (atomic load; safe
// from any goroutine).
func (o *Occupancy) Load(s int32) (state uint8, owner uint64) {
	return Unpack(atomic.LoadUint64(&o.word[s]))
}

// Word returns the packed word of slot s (atomic load): readers remember it
// at plan time and compare it later.
func (o *Occupancy) Word(s int32) uint64 { return atomic.LoadUint64(&o.word[s]) }

// Row returns the row index recorded by the last Claim of s (plain load;
// callers hold the cache lock).
func (o *Occupancy) Row(s int32) uint32 { return o.row[s] }

// Claim marks slots[i] InTransit(owner) with row firstRow+i, stealing any
// slot in transit for another owner, and returns how many slots it stole
// from a different in-transit owner (a slot repeated in slots counts once).
// Negative slots are skipped (their row numbers are still consumed). Each
// word is loaded and then stored (no locked swap): a concurrent Commit of
// the old owner either fails, or flips the word between the load and the
// store and is overwritten; either way the slot ends InTransit(owner). In
// the second case that slot counts as stolen although its Commit also
// counted it as flipped: the count is exact only without a concurrent
// Commit (the cache uses it for nothing but tests).
func (o *Occupancy) Claim(slots []int32, owner uint64, firstRow uint32) (stolen int) {
	checkOwner(owner)
	claimed := Pack(InTransit, owner)
	word, row := o.word, o.row
	for i, s := range slots {
		if s < 0 {
			continue
		}
		row[s] = firstRow + uint32(i)
		// Load + Store rather than Swap: only the claiming goroutine stores
		// InTransit, and a Commit racing between the two only flips a word
		// this store then overwrites, which is the steal it is meant to be.
		// Both are plain MOVs on amd64 (a Swap is a locked XCHG).
		old := atomic.LoadUint64(&word[s])
		atomic.StoreUint64(&word[s], claimed)
		if old&stateMask == uint64(InTransit) && old != claimed {
			stolen++
		}
	}
	return stolen
}

// ClaimRow claims slot s for owner with an explicit row, with Claim's
// rules; it reports whether s was stolen from another in-transit owner.
func (o *Occupancy) ClaimRow(s int32, owner uint64, row uint32) (stolen bool) {
	checkOwner(owner)
	if s < 0 {
		return false
	}
	claimed := Pack(InTransit, owner)
	o.row[s] = row
	old := atomic.LoadUint64(&o.word[s])
	atomic.StoreUint64(&o.word[s], claimed)
	return old&stateMask == uint64(InTransit) && old != claimed
}

// Owns reports whether s is InTransit for owner (atomic load).
func (o *Occupancy) Owns(s int32, owner uint64) bool {
	return atomic.LoadUint64(&o.word[s]) == Pack(InTransit, owner)
}

// Commit flips slots[i] from InTransit(owner) to Committed(owner) with a
// compare-and-swap, leaving slots another owner stole untouched, and
// returns how many it flipped. Negative slots are skipped.
func (o *Occupancy) Commit(slots []int32, owner uint64) (flipped int) {
	from, to := Pack(InTransit, owner), Pack(Committed, owner)
	word := o.word
	for _, s := range slots {
		if s < 0 {
			continue
		}
		if atomic.CompareAndSwapUint64(&word[s], from, to) {
			flipped++
		}
	}
	return flipped
}

// Publish stores word w for every non-negative slot of slots (one atomic
// store each). It is for a table with a single writer that orders its own
// updates (the cache's committer for immediate keys): no steal accounting,
// no row column.
func (o *Occupancy) Publish(slots []int32, w uint64) {
	word := o.word
	for _, s := range slots {
		if s >= 0 {
			atomic.StoreUint64(&word[s], w)
		}
	}
}

// MarkAbsent records that the newest write of slots omitted the key: every
// non-negative slot turns Absent, stealing it from any owner still in
// transit (that owner's commit then skips it, as for a Claim), and it
// returns how many it stole. Claim's ordering rules apply: only the
// claiming goroutine calls it, in write order with Claim.
func (o *Occupancy) MarkAbsent(slots []int32) (stolen int) {
	word := o.word
	for _, s := range slots {
		if s < 0 {
			continue
		}
		old := atomic.LoadUint64(&word[s])
		if old == 0 {
			continue
		}
		atomic.StoreUint64(&word[s], 0)
		if old&stateMask == uint64(InTransit) {
			stolen++
		}
	}
	return stolen
}

// Reset marks slot s Absent (atomic store; used by tests and Close).
func (o *Occupancy) Reset(s int32) { atomic.StoreUint64(&o.word[s], 0) }

// ResetAll marks every slot Absent (atomic stores): the cache's Reset,
// once no write is in transit.
func (o *Occupancy) ResetAll() {
	for s := range o.word {
		atomic.StoreUint64(&o.word[s], 0)
	}
}

func checkOwner(owner uint64) {
	if owner-1 >= MaxOwner { // owner == 0 wraps around
		panic(fmt.Sprintf("soa: owner %d outside [1, 1<<62)", owner))
	}
}
