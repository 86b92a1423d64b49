package soa

import (
	"fmt"
	"math/bits"
	"sync/atomic"

	"github.com/omnicache/omnicache/internal/hostmem"
)

// Tenancy tracks, for keys that one goroutine writes in order (the cache's
// immediate keys, written by its committer), which write last touched each
// block and the state of each slot's row:
//
//	owner   []uint64  one per block: id of the last write into the block
//	written []uint32  one bit per slot: ever written
//	stale   []uint32  one bit per slot: the last write that claimed the slot
//	                  skipped it (a newer queued write replaces it), so the
//	                  row is older than that write; cleared when a write
//	                  puts its row there
//	absent  [][]uint32 per optional key (nil for the others), one bit per
//	                  slot: the last write that put its rows into the slot
//	                  omitted that key (its row reads as zeros, whatever
//	                  older row the mirror still holds); cleared when a
//	                  write supplies the key there
//
// A reader planned when the newest write handed over was maxOwner, and
// joined up to it, finds the rows it planned in a block only if the
// block's owner is at most maxOwner (no newer write touched the block) and
// none of its slots is stale (every planned write put its rows there);
// otherwise a write newer than the plan claimed the block, and the read
// fails instead of returning another tenant's rows. The written bit tells
// an absent row from a present one. Updates cost plain loads per row and an
// atomic store only when a value changes (a new owner for the block, a
// slot's first write, a skip), instead of an atomic store per row.
//
// The writer updates a write's absent bits (SetAbsent, ClearAbsent) in the
// same scatter as its rows, before the Publish that makes the block's owner
// the write: a reader that saw an absent bit change under it sees the epoch
// move and then the newer owner, exactly as for a row it copied.
//
// Exactly one goroutine calls Publish, SetAbsent and ClearAbsent; any
// goroutine may call Owner, Written, Stale and Absent (atomic loads).
type Tenancy struct {
	owner   []uint64
	written []uint32
	stale   []uint32
	bs      int
	shift   int // log2(bs) when bs is a power of two, else -1
	nstale  int // stale bits set (writer only): 0 lets Publish skip the column
	absent  [][]uint32
	nabsent []int // per key: absent bits set (writer only): 0 lets ClearAbsent return at once
}

// NewTenancy returns the table of numBlocks blocks of blockSize slots for
// the keys whose optional entry is given (key i is optional when
// optional[i]): only optional keys get an absent column. Its columns come
// from internal/hostmem: call Free when done. When the OS refuses the
// memory (an address-space limit) it returns an error wrapping
// the system's error and holds nothing.
func NewTenancy(numBlocks, blockSize int, optional ...bool) (*Tenancy, error) {
	t := &Tenancy{bs: blockSize, shift: -1}
	if blockSize&(blockSize-1) == 0 {
		t.shift = bits.TrailingZeros(uint(blockSize))
	}
	words := (numBlocks*blockSize + 31) / 32
	t.absent = make([][]uint32, len(optional))
	t.nabsent = make([]int, len(optional))
	var err error
	if t.owner, err = hostmem.Uint64s(numBlocks); err == nil {
		if t.written, err = hostmem.Uint32s(words); err == nil {
			t.stale, err = hostmem.Uint32s(words)
		}
	}
	for i, opt := range optional {
		if opt && err == nil {
			t.absent[i], err = hostmem.Uint32s(words)
		}
	}
	if err != nil {
		t.Free()
		return nil, fmt.Errorf("soa: tenancy of %d blocks of %d: %w", numBlocks, blockSize, err)
	}
	return t, nil
}

// Free returns the columns to the OS; the table must not be used again.
func (t *Tenancy) Free() {
	hostmem.FreeUint64s(t.owner)
	hostmem.FreeUint32s(t.written)
	hostmem.FreeUint32s(t.stale)
	for _, a := range t.absent {
		if a != nil {
			hostmem.FreeUint32s(a)
		}
	}
	t.owner, t.written, t.stale, t.absent = nil, nil, nil, nil
}

// RunEnd returns the index just past the run of slots from sl[i] on that
// lie in the block of bs slots starting at slot lo (a request's tokens fill
// a block before the next), checking four slots a compare: a scan of a
// step's slots for their blocks costs a division per block, not per token.
func RunEnd(sl []int32, i int, lo int32, bs int) int {
	ubs, n := uint32(bs), len(sl)
	for ; i+4 <= n && max(uint32(sl[i]-lo), uint32(sl[i+1]-lo), uint32(sl[i+2]-lo), uint32(sl[i+3]-lo)) < ubs; i += 4 {
	}
	for ; i < n && uint32(sl[i]-lo) < ubs; i++ {
	}
	return i
}

// Shift is log2 of the block size when it is a power of two (a slot's
// block is then s >> Shift), else -1.
func (t *Tenancy) Shift() int { return t.shift }

// Block is the block that holds slot s.
func (t *Tenancy) Block(s int32) int { return t.block(s) }

func (t *Tenancy) block(s int32) int {
	if t.shift >= 0 {
		return int(s) >> t.shift
	}
	return int(s) / t.bs
}

// Publish records that write id put its rows into slots, except those whose
// entry in mask is negative: those it skipped (they turn stale). mask may
// be slots itself when nothing was skipped; negative slots are ignored.
// Single writer only; ids must not decrease.
func (t *Tenancy) Publish(slots, mask []int32, id uint64) {
	owner, written, stale := t.owner, t.written, t.stale
	if t.nstale == 0 && len(mask) == len(slots) && (len(slots) == 0 || &mask[0] == &slots[0]) {
		// Nothing skipped and no slot stale (the common case): the stale
		// column is neither read nor written.
		for _, s := range slots {
			if s < 0 {
				continue
			}
			if b := t.block(s); owner[b] != id {
				atomic.StoreUint64(&owner[b], id)
			}
			w, bit := s>>5, uint32(1)<<(s&31)
			if old := written[w]; old&bit == 0 {
				atomic.StoreUint32(&written[w], old|bit)
			}
		}
		return
	}
	// The slow path: some slots skipped, or stale bits to clear. A write's
	// slots run in blocks, so the written and stale bits of consecutive
	// slots share a word: they are gathered per word and each word is
	// stored once (an atomic store per slot was most of a prefill scatter's
	// bookkeeping). A slot's last occurrence in the call decides its stale
	// bit, as if the slots were applied one by one (a word seen again
	// after another is read back and updated again).
	cw := int32(-1)             // the word being gathered
	var wset, sset, sclr uint32 // its written bits to set, stale bits to set, stale bits to clear
	flush := func() {
		if cw < 0 {
			return
		}
		// The writer is the only goroutine that stores into these columns,
		// so it may read them without atomics.
		if old := written[cw]; old|wset != old {
			atomic.StoreUint32(&written[cw], old|wset)
		}
		if old := stale[cw]; (old|sset)&^sclr != old {
			nw := (old | sset) &^ sclr
			atomic.StoreUint32(&stale[cw], nw)
			t.nstale += bits.OnesCount32(nw&^old) - bits.OnesCount32(old&^nw)
		}
	}
	for i, s := range slots {
		if s < 0 {
			continue
		}
		w, bit := s>>5, uint32(1)<<(s&31)
		if w != cw {
			flush()
			cw, wset, sset, sclr = w, 0, 0, 0
		}
		if mask[i] < 0 {
			sset, sclr = sset|bit, sclr&^bit
			continue
		}
		if b := t.block(s); owner[b] != id {
			atomic.StoreUint64(&owner[b], id)
		}
		wset |= bit
		sset, sclr = sset&^bit, sclr|bit
	}
	flush()
}

// SetAbsent records that the write being scattered omitted optional key ki
// for the non-negative slots of mask (the slots it puts its rows into). It
// panics for a key without an absent column (a required key cannot be
// omitted). Single writer only.
func (t *Tenancy) SetAbsent(ki int, mask []int32) {
	col := t.absent[ki]
	if col == nil {
		panic("soa: SetAbsent of a key without an absent column (not optional)")
	}
	for _, s := range mask {
		if s < 0 {
			continue
		}
		w, bit := s>>5, uint32(1)<<(s&31)
		if old := col[w]; old&bit == 0 {
			atomic.StoreUint32(&col[w], old|bit)
			t.nabsent[ki]++
		}
	}
}

// ClearAbsent records that the write being scattered supplied key ki for
// the non-negative slots of mask. While no absent bit of ki is set (always
// for a key without a column) it returns at once: writes that supply every
// key pay nothing per row. Single writer only.
func (t *Tenancy) ClearAbsent(ki int, mask []int32) {
	if ki >= len(t.nabsent) || t.nabsent[ki] == 0 {
		return
	}
	col := t.absent[ki]
	for _, s := range mask {
		if s < 0 {
			continue
		}
		w, bit := s>>5, uint32(1)<<(s&31)
		if old := col[w]; old&bit != 0 {
			atomic.StoreUint32(&col[w], old&^bit)
			if t.nabsent[ki]--; t.nabsent[ki] == 0 {
				return
			}
		}
	}
}

// Absent reports whether the last write that put its rows into slot s
// omitted key ki (false for a key without an absent column).
func (t *Tenancy) Absent(ki int, s int32) bool {
	if ki >= len(t.absent) || t.absent[ki] == nil {
		return false
	}
	return atomic.LoadUint32(&t.absent[ki][s>>5])&(1<<(s&31)) != 0
}

// Reset records that write id dropped every row: every block's owner
// becomes id (a read planned before it fails: a newer write claimed the
// block), and every slot reads as never written (a hit over it finds its
// rows absent), neither stale nor absent. Single writer only; ids must not
// decrease.
func (t *Tenancy) Reset(id uint64) {
	for b := range t.owner {
		atomic.StoreUint64(&t.owner[b], id)
	}
	for w := range t.written {
		atomic.StoreUint32(&t.written[w], 0)
		atomic.StoreUint32(&t.stale[w], 0)
	}
	t.nstale = 0
	for ki, col := range t.absent {
		for w := range col {
			atomic.StoreUint32(&col[w], 0)
		}
		t.nabsent[ki] = 0
	}
}

// Owner is the id of the last write into the block of slot s (0: none).
func (t *Tenancy) Owner(s int32) uint64 { return atomic.LoadUint64(&t.owner[t.block(s)]) }

// Written reports whether slot s was ever written.
func (t *Tenancy) Written(s int32) bool {
	return atomic.LoadUint32(&t.written[s>>5])&(1<<(s&31)) != 0
}

// Stale reports whether the last write that claimed slot s skipped it.
func (t *Tenancy) Stale(s int32) bool {
	return atomic.LoadUint32(&t.stale[s>>5])&(1<<(s&31)) != 0
}
