package soa

import "fmt"

// Handle names a live request in Requests. It is stable while the request
// lives (other requests' removals do not change it) and is reused after
// Remove.
type Handle int32

// NoHandle is the handle of no request.
const NoHandle Handle = -1

// Requests is the live request table: dense columns indexed by position
// 0..Len()-1 (exported for direct use), swap-remove deletion, stable
// handles through a handle→position indirection, and an arena of hit block
// ids. See the package doc for the layout. Single goroutine (the caller's
// lock). Allocation-free after warm-up.
type Requests struct {
	// Dense columns indexed by position.
	ID        []int64
	HitTokens []int32  // hit length at arrival
	HitOff    []int32  // offset of the hit's block ids in Blocks
	HitN      []int32  // number of hit block ids
	Flags     []uint32 // caller-defined bit flags (0 at Add)
	Aux       []int64  // caller-defined integer (0 at Add)
	// Blocks is the arena of hit block ids: appended by Add, compacted
	// when more than half of it belongs to removed requests.
	Blocks []int32

	handle  []int32          // by position: the request's handle
	pos     []int32          // by handle: the request's position, -1 if free
	free    []int32          // stack of free handles
	index   map[int64]Handle // id → handle, live requests only
	garbage int              // Blocks entries of removed requests
	spare   []int32          // compaction target, swapped with Blocks
}

// NewRequests returns an empty table with room for capHint requests.
func NewRequests(capHint int) *Requests {
	capHint = max(capHint, 0)
	return &Requests{
		ID:        make([]int64, 0, capHint),
		HitTokens: make([]int32, 0, capHint),
		HitOff:    make([]int32, 0, capHint),
		HitN:      make([]int32, 0, capHint),
		Flags:     make([]uint32, 0, capHint),
		Aux:       make([]int64, 0, capHint),
		handle:    make([]int32, 0, capHint),
		pos:       make([]int32, 0, capHint),
		index:     make(map[int64]Handle, capHint),
	}
}

// Len returns the number of live requests.
func (t *Requests) Len() int { return len(t.ID) }

// Add inserts request id with its hit (hitTokens, and the hit's block ids,
// copied into the arena; Flags and Aux start at 0) and returns its handle
// and true. If id is already live, Add changes nothing and returns its
// handle and false.
func (t *Requests) Add(id int64, hitTokens int32, blocks []int32) (Handle, bool) {
	if t.index == nil {
		t.index = make(map[int64]Handle)
	}
	if h, ok := t.index[id]; ok {
		return h, false
	}
	var h Handle
	if n := len(t.free); n > 0 {
		h, t.free = Handle(t.free[n-1]), t.free[:n-1]
	} else {
		h = Handle(len(t.pos))
		t.pos = append(t.pos, 0)
	}
	t.insert(h, id, hitTokens, blocks)
	return h, true
}

// AddAt is Add under a chosen handle: it inserts request id as handle h,
// which must be free (a removed request's, to restore it under the handle
// it had), and reports whether it did: false, changing nothing, when id is
// live or h is not free.
func (t *Requests) AddAt(h Handle, id int64, hitTokens int32, blocks []int32) bool {
	if _, ok := t.index[id]; ok || h < 0 || int(h) >= len(t.pos) || t.pos[h] >= 0 {
		return false
	}
	i := len(t.free) - 1 // a handle freed last is usually at the top
	for i >= 0 && Handle(t.free[i]) != h {
		i--
	}
	if i < 0 {
		return false
	}
	t.free = append(t.free[:i], t.free[i+1:]...)
	if t.index == nil {
		t.index = make(map[int64]Handle)
	}
	t.insert(h, id, hitTokens, blocks)
	return true
}

// insert places request id at the end of the columns under handle h.
func (t *Requests) insert(h Handle, id int64, hitTokens int32, blocks []int32) {
	t.pos[h] = int32(len(t.ID))
	t.handle = append(t.handle, int32(h))
	t.ID = append(t.ID, id)
	t.HitTokens = append(t.HitTokens, hitTokens)
	t.HitOff = append(t.HitOff, int32(len(t.Blocks)))
	t.HitN = append(t.HitN, int32(len(blocks)))
	t.Flags = append(t.Flags, 0)
	t.Aux = append(t.Aux, 0)
	t.Blocks = append(t.Blocks, blocks...)
	t.index[id] = h
}

// Lookup returns the handle of live request id.
func (t *Requests) Lookup(id int64) (Handle, bool) {
	h, ok := t.index[id]
	return h, ok
}

// Pos returns the dense position of live handle h (-1 if h is free).
func (t *Requests) Pos(h Handle) int { return int(t.pos[h]) }

// HitBlocks returns h's hit block ids: a view into the arena, valid until
// the next Add, Remove or Reset.
func (t *Requests) HitBlocks(h Handle) []int32 {
	p := t.pos[h]
	off, n := t.HitOff[p], t.HitN[p]
	return t.Blocks[off : off+n : off+n]
}

// SetHit replaces live request h's hit with hitTokens and a copy of
// blocks (a preempted request that resumes with a hit); its old block ids
// become garbage in the arena.
func (t *Requests) SetHit(h Handle, hitTokens int32, blocks []int32) {
	p := t.pos[h]
	if p < 0 {
		panic(fmt.Sprintf("soa: SetHit of free handle %d", h))
	}
	if off, n := t.HitOff[p], t.HitN[p]; int(off+n) == len(t.Blocks) {
		t.Blocks = t.Blocks[:off]
	} else {
		t.garbage += int(n)
	}
	t.HitTokens[p] = hitTokens
	t.HitOff[p] = int32(len(t.Blocks))
	t.HitN[p] = int32(len(blocks))
	t.Blocks = append(t.Blocks, blocks...)
	if 2*t.garbage > len(t.Blocks) {
		t.compact()
	}
}

// Remove deletes live request h in O(1): the last request moves into its
// position; every other handle stays valid. h becomes free for reuse.
// Removing a free handle panics.
func (t *Requests) Remove(h Handle) {
	p := t.pos[h]
	if p < 0 {
		panic(fmt.Sprintf("soa: Remove of free handle %d", h))
	}
	if off, n := t.HitOff[p], t.HitN[p]; int(off+n) == len(t.Blocks) {
		t.Blocks = t.Blocks[:off] // the arena's tail: no garbage
	} else {
		t.garbage += int(n)
	}
	delete(t.index, t.ID[p])
	last := len(t.ID) - 1
	if int(p) != last {
		t.ID[p] = t.ID[last]
		t.HitTokens[p] = t.HitTokens[last]
		t.HitOff[p] = t.HitOff[last]
		t.HitN[p] = t.HitN[last]
		t.Flags[p] = t.Flags[last]
		t.Aux[p] = t.Aux[last]
		moved := t.handle[last]
		t.handle[p] = moved
		t.pos[moved] = p
	}
	t.ID = t.ID[:last]
	t.HitTokens = t.HitTokens[:last]
	t.HitOff = t.HitOff[:last]
	t.HitN = t.HitN[:last]
	t.Flags = t.Flags[:last]
	t.Aux = t.Aux[:last]
	t.handle = t.handle[:last]
	t.pos[h] = -1
	t.free = append(t.free, int32(h))
	if 2*t.garbage > len(t.Blocks) {
		t.compact()
	}
}

// compact copies the live requests' block ids, in position order, into the
// spare arena and swaps the two: allocation-free once spare has grown to
// the largest live size.
func (t *Requests) compact() {
	dst := t.spare[:0]
	for p, off := range t.HitOff {
		n := t.HitN[p]
		t.HitOff[p] = int32(len(dst))
		dst = append(dst, t.Blocks[off:off+n]...)
	}
	t.spare, t.Blocks = t.Blocks[:0], dst
	t.garbage = 0
}

// Reset removes every request, keeping the columns' capacity. All handles
// become free.
func (t *Requests) Reset() {
	t.ID = t.ID[:0]
	t.HitTokens = t.HitTokens[:0]
	t.HitOff = t.HitOff[:0]
	t.HitN = t.HitN[:0]
	t.Flags = t.Flags[:0]
	t.Aux = t.Aux[:0]
	t.Blocks = t.Blocks[:0]
	t.handle = t.handle[:0]
	t.pos = t.pos[:0]
	t.free = t.free[:0]
	clear(t.index)
	t.garbage = 0
}
