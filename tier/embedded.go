package tier

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/bits"
	"os"
	"sync"

	"github.com/omnicache/omnicache/internal/hostmem"
)

// DefaultEmbeddedBytes bounds an embedded store made with a zero capacity.
const DefaultEmbeddedBytes = 1 << 30

// Slab geometry of the embedded store.
const (
	frameMax     = hostmem.HugePage // bytes of one chunk of slots at most (a larger value takes a chunk of its own)
	regionFrames = 16               // frames mapped at a time
	slackBytes   = 8 << 20
)

// Embedded is the in-process backend: values held in this process, bounded in
// bytes (key and value lengths), evicted by its Policy (PolicyS3FIFO by
// default, or PolicyLRU); pinned values (Pin) are never evicted. It is the
// default tier: one process's caches (replicas in one replay) share it.
//
// A store of a million values must not cost the garbage collector a million
// objects to mark, nor its publishers an allocation per value: keys and
// values are copied into slabs (chunks of equal slots, one slot size per
// size class, slots rounded up by at most 1/16), indexed by a map from a
// key hash to pointer-free entries (the full key is kept and compared).
//
// The slabs are mapped from the OS, outside the Go heap: a gigabyte held
// here would otherwise count as live heap and raise the collector's heap
// goal by as much, and every other allocation of the process (the
// engine's scheduler's among them) would walk through that much memory
// never touched before, cold in every cache, between two collections. A
// chunk is a frame of 2 MiB (in a store under 32 MiB, 1/16 of the bound
// rounded up to a page) cut from regions of 16 frames, each region one
// mapping advised as transparent huge pages (hostmem.AllocHuge): filling a
// gigabyte faults 2 MiB at a time, not 4 KiB (the 262,144 page faults a
// gigabyte cost the publishers' threads become 512, seconds of CPU in a
// replica replay), and costs 32 mappings, not one per
// chunk. A value larger than a frame takes a mapping of its own.
//
// A freed slot is reused by the next value of its class. The memory held
// is at most the bound plus 1/16 plus 8 MiB: when a value finds no free
// slot of its class and a new chunk would pass that, chunks left empty are
// released (a frame's pages go back to the OS on Linux, the frame waits
// for the next chunk; a value's own mapping is unmapped), then values are
// evicted (evictOne) until a slot or the room for a chunk frees up.
//
// Memory besides the slabs: per value a 48-byte entry and its index slot;
// with PolicyS3FIFO two ghost queues of at most as many 8-byte hashes (and
// a map entry each) as the main queue holds values.
//
// Set copies: the caller may reuse its keys and values once Set returns.
// Get returns copies as well.
type Embedded struct {
	mu    sync.Mutex
	max   int64 // bound on key+value bytes held
	used  int64
	limit int64 // bound on slab bytes
	held  int64 // slab bytes allocated
	seed  maphash.Seed
	idx   map[uint64]int32 // key hash → first entry of that hash (coll chains the rest)
	ents  []ent
	free  int32 // free entries, linked through next; -1: none
	// q are the eviction queues (qSmall, qMain; q[qNone] unused): with
	// PolicyLRU every value is in qMain, most recently used at the head;
	// with PolicyS3FIFO new values enter qSmall (or qMain when their key
	// hash is in the ghost queue) and the tails are evicted as S3-FIFO
	// says (evictOne). Pinned values are in neither.
	q      [3]fifo
	policy Policy
	ghost  ghostQueue
	ghostM ghostQueue // key hashes evicted from the main queue
	smallT int64      // the small queue's target bytes (adapts)
	pinned int64      // bytes of pinned values (in used)
	chunks []chunk
	gone   []int32 // released chunk ids, reused first
	// frame is a frame's bytes; regions the mappings frames are cut from
	// (carved: bytes of the last one handed out); cold the released frames,
	// handed out first (their pages were given back: not held).
	frame   int
	regions [][]byte
	carved  int
	cold    []coldFrame
	empty   int // chunks holding no value
	cls     map[int]*slabClass
	hashFn  func(string) uint64 // tests: forced collisions; nil: maphash
	closed  bool
	evicts  int64
	// inflight counts Sets and Gets copying outside the lock; idle (on mu)
	// wakes Close when the last is done.
	inflight int
	reserved int64 // bytes of the values they copy (in used)
	idle     sync.Cond
	copied   func() // tests: called after a Set's copies, outside the lock
	fetching func() // tests: called before a Get's copies, outside the lock
}

// ent is one value's index entry: no pointers, so the index costs the
// garbage collector nothing to mark.
type ent struct {
	hash        uint64
	prev, next  int32 // LRU neighbours; next links the free entries too
	coll        int32 // the next entry of the same hash; -1: none
	chunk, slot int32
	klen, vlen  int32
	// pins counts Gets copying the value out; removed while pinned, the
	// entry is dead (out of the index and the LRU, its bytes no longer
	// used) and its slot is freed by the last unpin.
	pins int32
	dead bool
	// q is the queue the entry is in (qNone: pinned, or not linked); freq
	// its S3-FIFO access count (0..3); kept marks a value pinned by Pin:
	// out of every queue, never evicted.
	q    uint8
	freq uint8
	kept bool
}

// Queues of Embedded.q.
const (
	qNone = iota
	qSmall
	qMain
)

// fifo is an eviction queue of entries, linked through ent.prev/next.
type fifo struct {
	head, tail int32 // -1: empty
	bytes      int64 // key+value bytes of its entries
	n          int
}

// Policy is the embedded store's eviction policy.
type Policy string

// Eviction policies (EmbeddedOptions.Policy).
const (
	// PolicyLRU evicts the least recently stored or read value.
	PolicyLRU Policy = "lru"
	// PolicyS3FIFO is S3-FIFO (Yang et al., SOSP 2023) with an adaptive
	// small queue: a value enters a small FIFO queue; one read again
	// before it reaches the small queue's tail moves to the main FIFO
	// queue, one not read is evicted and its key hash remembered in a
	// ghost queue, so that a value stored again soon after enters the
	// main queue at once. The main queue's tail goes back to its head
	// while read since it last passed (up to 3 reads counted), else it is
	// evicted, its hash remembered in a second ghost queue. One-off values
	// leave quickly without pushing reused ones out: scan resistance.
	// The small queue's share starts at a tenth of the bytes and adapts
	// as ARC's does: a value stored again whose hash is in the small
	// queue's ghost raises it (the small queue let it go too soon), one
	// in the main queue's ghost lowers it (between 1/50 and 9/10). Each
	// ghost queue holds as many hashes as the main queue holds values.
	PolicyS3FIFO Policy = "s3fifo"
)

// DefaultPolicy is the embedded store's policy when none is named.
const DefaultPolicy = PolicyS3FIFO

// smallShare is S3-FIFO's small queue's first share of the bytes (1/10).
const smallShare = 10

type chunk struct {
	buf    []byte // nil: released
	region int32  // the region buf is a frame of; -1: buf is a mapping of its own
	cl     *slabClass
	free   []int32 // free slots
	live   int
}

// coldFrame is a released frame and its region.
type coldFrame struct {
	buf    []byte
	region int32
}

type slabClass struct {
	size  int     // slot bytes
	per   int     // slots per chunk
	avail []int32 // chunks that may have a free slot (checked when taken)
}

// NewEmbedded returns an embedded store of at most maxBytes (0:
// DefaultEmbeddedBytes) evicting by DefaultPolicy.
func NewEmbedded(maxBytes int64) (*Embedded, error) {
	return NewEmbeddedPolicy(maxBytes, DefaultPolicy)
}

// NewEmbeddedPolicy is NewEmbedded with an eviction policy ("": the
// default); an unknown one is ErrConfig.
func NewEmbeddedPolicy(maxBytes int64, policy Policy) (*Embedded, error) {
	if maxBytes == 0 {
		maxBytes = DefaultEmbeddedBytes
	}
	if maxBytes < 0 {
		return nil, fmt.Errorf("%w: embedded store of %d bytes", ErrConfig, maxBytes)
	}
	switch policy {
	case "":
		policy = DefaultPolicy
	case PolicyLRU, PolicyS3FIFO:
	default:
		return nil, fmt.Errorf("%w: eviction policy %q: want %s or %s", ErrConfig, policy, PolicyLRU, PolicyS3FIFO)
	}
	e := &Embedded{max: maxBytes, limit: maxBytes + maxBytes/16 + slackBytes, seed: maphash.MakeSeed(), policy: policy}
	e.idle.L = &e.mu
	page := int64(os.Getpagesize())
	e.frame = int(min(frameMax, (maxBytes/16+page-1)/page*page))
	e.reset()
	return e, nil
}

func (e *Embedded) reset() {
	for ci := range e.chunks {
		if c := &e.chunks[ci]; c.region < 0 {
			e.freeChunk(c) // frames go with their regions
		}
	}
	for _, r := range e.regions {
		// Unmapping a whole mapping this store made does not fail.
		_ = hostmem.Free(r)
	}
	e.regions, e.carved, e.cold = nil, 0, nil
	e.used, e.held, e.empty, e.pinned = 0, 0, 0, 0
	e.idx = map[uint64]int32{}
	e.ents, e.chunks, e.gone = nil, nil, nil
	e.free = -1
	for i := range e.q {
		e.q[i] = fifo{head: -1, tail: -1}
	}
	e.ghost, e.ghostM = ghostQueue{}, ghostQueue{}
	e.smallT = e.max / smallShare
	e.cls = map[int]*slabClass{}
}

func (e *Embedded) String() string { return "embedded" }

// Policy is the store's eviction policy.
func (e *Embedded) Policy() Policy { return e.policy }

func (e *Embedded) hash(k string) uint64 {
	if e.hashFn != nil {
		return e.hashFn(k)
	}
	return maphash.String(e.seed, k)
}

// hashBytes is hash of b's bytes as a string (maphash gives both the same
// hash), without making that string: b may be a scratch buffer.
func (e *Embedded) hashBytes(b []byte) uint64 {
	if e.hashFn != nil {
		return e.hashFn(string(b)) // tests: a copy, the hook may keep it
	}
	return maphash.Bytes(e.seed, b)
}

// hashKeys hashes keys, before the lock is taken.
func (e *Embedded) hashKeys(keys []string) []uint64 {
	hs := make([]uint64, len(keys))
	for i, k := range keys {
		hs[i] = e.hash(k)
	}
	return hs
}

// find returns key's entry, or -1.
func (e *Embedded) find(h uint64, key string) int32 {
	i, ok := e.idx[h]
	if !ok {
		return -1
	}
	for ; i >= 0; i = e.ents[i].coll {
		en := &e.ents[i]
		if int(en.klen) == len(key) && string(e.bytesOf(en)[:en.klen]) == key {
			return i
		}
	}
	return -1
}

// bytesOf is an entry's slot: its key, then its value.
func (e *Embedded) bytesOf(en *ent) []byte {
	return e.slotBytes(en.chunk, en.slot, int(en.klen)+int(en.vlen))
}

// slotBytes is the first n bytes of slot si of chunk ci.
func (e *Embedded) slotBytes(ci, si int32, n int) []byte {
	c := &e.chunks[ci]
	off := int(si) * c.cl.size
	return c.buf[off : off+n]
}

// Get implements Backend: copies of the values (one allocation for the
// batch).
//
// The copies run outside the store's lock, as Set's do: under it Get finds
// and pins the values (a value replaced, evicted or deleted meanwhile keeps
// its slot until the copy is done), then copies, then unpins.
func (e *Embedded) Get(_ context.Context, keys []string) ([][]byte, []error) {
	vals, errs := make([][]byte, len(keys)), make([]error, len(keys))
	hs := e.hashKeys(keys)
	type pinned struct {
		i   int
		x   int32
		src []byte
	}
	var pins []pinned
	total := 0
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		for i := range errs {
			errs[i] = ErrClosed
		}
		return vals, errs
	}
	for i, k := range keys {
		x := e.find(hs[i], k)
		if x < 0 {
			continue
		}
		en := &e.ents[x]
		en.pins++
		e.touch(x)
		pins = append(pins, pinned{i, x, e.bytesOf(en)[en.klen:]})
		total += int(en.vlen)
	}
	if len(pins) == 0 {
		e.mu.Unlock()
		return vals, errs
	}
	e.inflight++
	e.mu.Unlock()

	if e.fetching != nil {
		e.fetching()
	}
	buf := make([]byte, 0, total)
	for _, p := range pins {
		start := len(buf)
		buf = append(buf, p.src...)
		vals[p.i] = buf[start:len(buf):len(buf)]
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range pins {
		en := &e.ents[p.x]
		if en.pins--; en.pins == 0 && en.dead {
			e.freeEnt(p.x)
		}
	}
	e.copyDone()
	return vals, errs
}

// Set implements Backend: it copies each value into the store, evicting
// the least recently used values to stay within the bound.
//
// The copies run outside the store's lock, so that Exists (the scheduler's
// Lookup, on the engine goroutine), Get and other Sets wait for index
// updates only, never for a batch's megabytes of copying: under the lock
// Set replaces or evicts what it must and reserves a slot per value (its
// bytes counted, the slot out of the LRU and the index, so nothing evicts
// or frees it); it copies; then, under the lock again, it links the values
// in, in order. Until then a value is not held: Get and Exists miss it,
// and a Delete of its key finds nothing. A value for which the bytes
// reserved by copies in flight leave no room fails with ErrNoRoom, before
// anything is evicted for it; so does one whose size class finds no slot
// once every held value was evicted for it (the slabs all reserved: a
// store a few values large). Close waits for the copies in flight.
func (e *Embedded) Set(_ context.Context, keys []string, vals [][]byte) []error {
	errs := make([]error, len(keys))
	hs := e.hashKeys(keys)
	type reserved struct {
		i           int
		chunk, slot int32
		dst         []byte
		kept        bool // the value it replaces was pinned: so is it
	}
	res := make([]reserved, 0, len(keys))
	e.mu.Lock()
	for i, k := range keys {
		if e.closed {
			errs[i] = ErrClosed
			continue
		}
		size := int64(len(k) + len(vals[i]))
		if size > e.max {
			errs[i] = fmt.Errorf("%w: %d bytes, the store holds %d", ErrTooLarge, size, e.max)
			continue
		}
		kept := false
		old := e.find(hs[i], k)
		var oldPinned int64
		if old >= 0 && e.ents[old].kept {
			kept, oldPinned = true, int64(e.ents[old].klen)+int64(e.ents[old].vlen)
		}
		if e.reserved+e.pinned-oldPinned+size > e.max { // checked before anything is evicted
			errs[i] = fmt.Errorf("%w: %d bytes, %d of the store's %d reserved by values being stored, %d pinned", ErrNoRoom, size, e.reserved, e.max, e.pinned)
			continue
		}
		if old >= 0 {
			e.remove(old)
		}
		for e.used+size > e.max { // the queued values cover it: used-reserved-pinned of them
			if !e.evictOne() {
				break // unreachable: see the check above
			}
		}
		ci, si, ok := e.alloc(int(size))
		if !ok {
			errs[i] = fmt.Errorf("%w: no slot of %d bytes: the slabs are held by values being stored or pinned", ErrNoRoom, size)
			continue
		}
		res = append(res, reserved{i, ci, si, e.slotBytes(ci, si, int(size)), kept})
		e.used += size
		e.reserved += size
	}
	if len(res) == 0 {
		e.mu.Unlock()
		return errs
	}
	e.inflight++
	e.mu.Unlock()

	for _, r := range res {
		copy(r.dst[copy(r.dst, keys[r.i]):], vals[r.i])
	}
	if e.copied != nil {
		e.copied()
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	for _, r := range res {
		e.reserved -= int64(len(r.dst))
	}
	e.copyDone()
	if e.closed {
		for _, r := range res {
			errs[r.i] = ErrClosed
		}
		return errs
	}
	for _, r := range res {
		k, h := keys[r.i], hs[r.i]
		if x := e.find(h, k); x >= 0 { // a Set of the same key linked it meanwhile
			r.kept = r.kept || e.ents[x].kept // and it was pinned since: so is this value
			e.remove(x)
		}
		x := e.newEnt()
		en := &e.ents[x]
		*en = ent{hash: h, prev: -1, next: -1, coll: -1, chunk: r.chunk, slot: r.slot, klen: int32(len(k)), vlen: int32(len(vals[r.i]))}
		if first, ok := e.idx[h]; ok {
			en.coll = first
		}
		e.idx[h] = x
		switch {
		case r.kept:
			en.kept = true
			e.pinned += int64(len(r.dst))
		case e.policy == PolicyS3FIFO && e.ghost.has(h):
			e.smallT = min(e.max*9/10, e.smallT+int64(len(r.dst))*max(1, int64(e.ghostM.len())/max(1, int64(e.ghost.len()))))
			e.push(x, qMain)
		case e.policy == PolicyS3FIFO && e.ghostM.has(h):
			e.smallT = max(e.max/50, e.smallT-int64(len(r.dst))*max(1, int64(e.ghost.len())/max(1, int64(e.ghostM.len()))))
			e.push(x, qMain)
		case e.policy == PolicyS3FIFO && !e.ghost.has(h):
			e.push(x, qSmall)
		default:
			e.push(x, qMain)
		}
	}
	return errs
}

// sizeClass rounds n up to its slot size: 64-byte steps up to 1 KiB, then
// steps of 1/16 of the next power of two.
func sizeClass(n int) int {
	if n <= 1024 {
		return (n + 63) &^ 63
	}
	step := 1 << (bits.Len(uint(n-1)) - 4)
	return (n + step - 1) / step * step
}

// alloc returns a free slot for n bytes (a chunk id and slot index),
// making room as the type's doc says; false when none can be made (every
// value held is being stored: reserved by a Set, out of the LRU).
func (e *Embedded) alloc(n int) (int32, int32, bool) {
	size := sizeClass(n)
	cl := e.cls[size]
	if cl == nil {
		per := max(1, e.frame/size)
		cl = &slabClass{size: size, per: per}
		e.cls[size] = cl
	}
	for {
		for len(cl.avail) > 0 {
			ci := cl.avail[len(cl.avail)-1]
			c := &e.chunks[ci]
			if c.buf == nil || c.cl != cl || len(c.free) == 0 {
				cl.avail = cl.avail[:len(cl.avail)-1]
				continue
			}
			si := c.free[len(c.free)-1]
			c.free = c.free[:len(c.free)-1]
			if len(c.free) == 0 {
				cl.avail = cl.avail[:len(cl.avail)-1]
			}
			if c.live == 0 {
				e.empty--
			}
			c.live++
			return ci, si, true
		}
		bytes := int64(max(cl.size, e.frame))
		switch {
		case e.held+bytes <= e.limit || e.held == 0:
			e.newChunk(cl)
		case e.empty > 0:
			e.releaseEmpty()
		case e.evictOne():
		default:
			return 0, 0, false
		}
	}
}

func (e *Embedded) newChunk(cl *slabClass) {
	var ci int32
	if n := len(e.gone); n > 0 {
		ci, e.gone = e.gone[n-1], e.gone[:n-1]
	} else {
		ci = int32(len(e.chunks))
		e.chunks = append(e.chunks, chunk{})
	}
	c := &e.chunks[ci]
	*c = chunk{cl: cl, free: make([]int32, cl.per), region: -1}
	if cl.size <= e.frame {
		c.buf, c.region = e.newFrame()
	} else {
		c.buf, _ = hostmem.AllocHuge(cl.size) // it falls back to make rather than fail
	}
	for i := range c.free {
		c.free[i] = int32(cl.per - 1 - i) // slot 0 first
	}
	cl.avail = append(cl.avail, ci)
	e.held += int64(len(c.buf))
	e.empty++
}

// newFrame hands out a released frame, else the next frame of the last
// region, mapping a region when it has none left.
func (e *Embedded) newFrame() ([]byte, int32) {
	if n := len(e.cold); n > 0 {
		f := e.cold[n-1]
		e.cold = e.cold[:n-1]
		return f.buf, f.region
	}
	if len(e.regions) == 0 || e.carved == len(e.regions[len(e.regions)-1]) {
		// At most the frames the bound allows, so that a small store does
		// not reserve 16 frames' addresses for a few.
		n := min(regionFrames, int((e.limit+int64(e.frame)-1)/int64(e.frame)))
		r, _ := hostmem.AllocHuge(n * e.frame) // it falls back to make rather than fail
		e.regions, e.carved = append(e.regions, r), 0
	}
	ri := int32(len(e.regions) - 1)
	r := e.regions[ri]
	f := r[e.carved : e.carved+e.frame : e.carved+e.frame]
	e.carved += e.frame
	return f, ri
}

// releaseEmpty gives the chunks holding no value back to the OS.
func (e *Embedded) releaseEmpty() {
	for ci := range e.chunks {
		c := &e.chunks[ci]
		if c.buf != nil && c.live == 0 {
			e.held -= int64(len(c.buf))
			e.freeChunk(c)
			e.gone = append(e.gone, int32(ci))
		}
	}
	e.empty = 0
}

// freeChunk gives a chunk's memory back to the OS and clears it: a frame's
// pages are released and the frame waits for a later chunk; a mapping of
// its own is unmapped. Every access to a slot holds e.mu, as this does: no
// copy is in flight.
func (e *Embedded) freeChunk(c *chunk) {
	if c.region >= 0 {
		// Releasing whole pages of a mapping this store made does not fail
		// (madvise fails only on a bad range).
		_ = hostmem.Release(e.regions[c.region], c.buf)
		e.cold = append(e.cold, coldFrame{c.buf, c.region})
	} else {
		// Unmapping a whole mapping this store made does not fail (munmap
		// fails only on a range it would have to split, or a bad address).
		_ = hostmem.Free(c.buf)
	}
	*c = chunk{region: -1}
}

func (e *Embedded) newEnt() int32 {
	if e.free >= 0 {
		x := e.free
		e.free = e.ents[x].next
		return x
	}
	e.ents = append(e.ents, ent{})
	return int32(len(e.ents) - 1)
}

// touch records a read of entry x: with PolicyLRU it becomes the most
// recently used, with PolicyS3FIFO its access count goes up (at most 3).
func (e *Embedded) touch(x int32) {
	en := &e.ents[x]
	if e.policy == PolicyS3FIFO {
		en.freq = min(en.freq+1, 3)
		return
	}
	if en.q != qMain || e.q[qMain].head == x {
		return
	}
	e.unlink(x)
	e.push(x, qMain)
}

// push links entry x (in no queue) at the head of queue q.
func (e *Embedded) push(x int32, q uint8) {
	en := &e.ents[x]
	l := &e.q[q]
	en.q, en.prev, en.next = q, -1, l.head
	if l.head >= 0 {
		e.ents[l.head].prev = x
	} else {
		l.tail = x
	}
	l.head = x
	l.bytes += int64(en.klen) + int64(en.vlen)
	l.n++
}

// unlink takes entry x out of its queue (none: nothing to do).
func (e *Embedded) unlink(x int32) {
	en := &e.ents[x]
	if en.q == qNone {
		return
	}
	l := &e.q[en.q]
	if en.prev >= 0 {
		e.ents[en.prev].next = en.next
	} else {
		l.head = en.next
	}
	if en.next >= 0 {
		e.ents[en.next].prev = en.prev
	} else {
		l.tail = en.prev
	}
	l.bytes -= int64(en.klen) + int64(en.vlen)
	l.n--
	en.q, en.prev, en.next = qNone, -1, -1
}

// evictOne evicts one value as the policy says (counted in evicts); false
// when every value held is pinned or being stored (no queue holds one).
// S3-FIFO: while the small queue holds over its target bytes (or
// the main queue is empty), its tail moves to the main queue when it was
// read since it entered, else it is evicted and its key hash enters the
// ghost queue; otherwise the main queue's tail goes back to the head when
// read since it last passed (its count down by one), else it is evicted.
// Every step either evicts or lowers a count or moves a value from the
// small queue to the main one: the loop ends.
func (e *Embedded) evictOne() bool {
	small, main := &e.q[qSmall], &e.q[qMain]
	for {
		var x int32
		switch {
		case small.tail >= 0 && (small.bytes > e.smallT || main.tail < 0):
			x = small.tail
			en := &e.ents[x]
			if en.freq > 0 {
				e.unlink(x)
				en.freq = 0
				e.push(x, qMain)
				continue
			}
			e.ghost.add(en.hash, max(main.n, 64))
		case main.tail >= 0:
			x = main.tail
			if en := &e.ents[x]; en.freq > 0 {
				en.freq--
				e.unlink(x)
				e.push(x, qMain)
				continue
			}
			e.ghostM.add(e.ents[x].hash, max(main.n, 64))
		default:
			return false
		}
		e.remove(x)
		e.evicts++
		return true
	}
}

// ghostQueue remembers the key hashes of values S3-FIFO evicted from its
// small queue (Embedded.ghost) or its main queue (ghostM), oldest out
// first, at most as many as the main queue holds values (and 64).
type ghostQueue struct {
	ring []uint64
	head int
	set  map[uint64]int32 // hash → times in ring
}

func (g *ghostQueue) has(h uint64) bool { return g.set[h] > 0 }

func (g *ghostQueue) len() int { return len(g.ring) - g.head }

func (g *ghostQueue) add(h uint64, limit int) {
	if g.set == nil {
		g.set = map[uint64]int32{}
	}
	g.ring = append(g.ring, h)
	g.set[h]++
	for len(g.ring)-g.head > limit {
		old := g.ring[g.head]
		if g.set[old]--; g.set[old] == 0 {
			delete(g.set, old)
		}
		g.head++
	}
	if g.head > 1024 && g.head > len(g.ring)/2 {
		g.ring = g.ring[:copy(g.ring, g.ring[g.head:])]
		g.head = 0
	}
}

// unreserve frees slot si of chunk ci (alloc's).
func (e *Embedded) unreserve(ci, si int32) {
	c := &e.chunks[ci]
	c.free = append(c.free, si)
	if len(c.free) == 1 {
		c.cl.avail = append(c.cl.avail, ci)
	}
	if c.live--; c.live == 0 {
		e.empty++
	}
}

// remove drops entry x: its index link, its slot and its bytes.
func (e *Embedded) remove(x int32) {
	e.unlink(x)
	en := &e.ents[x]
	if en.kept {
		e.pinned -= int64(en.klen) + int64(en.vlen)
		en.kept = false
	}
	first := e.idx[en.hash]
	if first == x {
		if en.coll >= 0 {
			e.idx[en.hash] = en.coll
		} else {
			delete(e.idx, en.hash)
		}
	} else {
		p := first
		for e.ents[p].coll != x {
			p = e.ents[p].coll
		}
		e.ents[p].coll = en.coll
	}
	e.used -= int64(en.klen) + int64(en.vlen)
	if en.pins > 0 { // a Get is copying it out: the last unpin frees the slot
		en.dead = true
		return
	}
	e.freeEnt(x)
}

// freeEnt frees unlinked entry x and its slot.
func (e *Embedded) freeEnt(x int32) {
	en := &e.ents[x]
	e.unreserve(en.chunk, en.slot)
	*en = ent{next: e.free}
	e.free = x
}

// Exists implements Backend from the index alone: a key counts as held
// when a key of the same 64-bit hash is (the entries and the slots, where
// the full keys are, stay untouched). A different key sharing the hash (odds
// of about n/2^64 for n values held) is the one inexact answer; it costs
// the scheduler a block that Get then misses, never a wrong value: Get
// compares the full key. The keys are hashed before the lock is taken:
// only the index probes hold off the publishers and importers.
func (e *Embedded) Exists(_ context.Context, keys []string) ([]bool, []error) {
	held, errs := make([]bool, len(keys)), make([]error, len(keys))
	hs := e.hashKeys(keys)
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, h := range hs {
		if e.closed {
			errs[i] = ErrClosed
		} else {
			_, held[i] = e.idx[h]
		}
	}
	return held, errs
}

// leading is Tier.Lookup on this store: how many leading blocks of hashes
// it holds (every key of each), the first key it lacks ending the run.
// Under one hold of the lock (the engine goroutine asks: it waits for the
// lock at most once, as for Exists), the addresses are formatted into a
// buffer on the stack and hashed a group at a time (8 keys, doubling up to
// 64), then the group's hashes probed: independent probes, whose cache
// misses overlap. No allocation, and nothing done past the group in which
// the first missing key fell. (Exists needs every address of the prefix
// asked formatted, hashed and probed, each allocated.) A closed store
// fails with ErrClosed, nothing counted.
func (e *Embedded) leading(t *Tier, hashes []uint64) (int, error) {
	nk := len(t.ns.Keys)
	var sb [256]byte
	buf := sb[:0] // a longer address grows it once
	var hb [64]uint64
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, ErrClosed
	}
	total := len(hashes) * nk
	for lo, step := 0, 8; lo < total; lo, step = lo+step, min(2*step, len(hb)) {
		hs := hb[:0]
		for i := lo; i < min(lo+step, total); i++ {
			buf = t.appendAddr(buf[:0], hashes[i/nk], i%nk)
			hs = append(hs, e.hashBytes(buf))
		}
		for i, h := range hs {
			if _, ok := e.idx[h]; !ok {
				return (lo + i) / nk, nil
			}
		}
	}
	return len(hashes), nil
}

// copyDone ends a Set's or Get's copy outside the lock (e.mu held): the
// last one wakes a Close waiting for it.
func (e *Embedded) copyDone() {
	if e.inflight--; e.inflight == 0 && e.closed {
		e.idle.Broadcast()
	}
}

// Close drops every value once the copies of Sets and Gets in flight are
// done; later calls fail with ErrClosed.
func (e *Embedded) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	for e.inflight > 0 {
		e.idle.Wait()
	}
	e.reset()
	return nil
}

// Usage reports the bytes held, the bound and the values evicted so far.
func (e *Embedded) Usage() (used, max, evicted int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.used, e.max, e.evicts
}

// slabBytes reports the slab memory the store holds and its bound (see
// the type's doc).
func (e *Embedded) slabBytes() (held, limit int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.held, e.limit
}

// Delete implements Deleter: it drops keys as an eviction would (counted
// in Usage's evicted).
func (e *Embedded) Delete(_ context.Context, keys []string) []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return closedErrs(len(keys))
	}
	for _, k := range keys {
		if x := e.find(e.hash(k), k); x >= 0 {
			e.remove(x)
			e.evicts++
		}
	}
	return make([]error, len(keys))
}

// Purge implements Purger: it removes every value whose key starts with
// prefix (a walk of the index under the store's lock; counted in Usage's
// evicted like Delete).
func (e *Embedded) Purge(_ context.Context, prefix string) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, ErrClosed
	}
	var drop []int32
	for _, head := range e.idx {
		for i := head; i >= 0; i = e.ents[i].coll {
			en := &e.ents[i]
			if k := e.bytesOf(en)[:en.klen]; len(k) >= len(prefix) && string(k[:len(prefix)]) == prefix {
				drop = append(drop, i)
			}
		}
	}
	for _, x := range drop {
		e.remove(x)
		e.evicts++
	}
	return len(drop), nil
}

// Pin implements Pinner: every key's value is kept (out of the eviction
// queues, never evicted) until Unpin or Delete; a Set of a pinned key
// keeps the new value pinned. A key not held is ErrMiss and then nothing
// is pinned (every key is checked first). Pinned bytes count in the
// bound: a Set that finds no room beside them fails with ErrNoRoom.
func (e *Embedded) Pin(_ context.Context, keys []string) []error {
	errs := make([]error, len(keys))
	hs := e.hashKeys(keys)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return closedErrs(len(keys))
	}
	xs := make([]int32, len(keys))
	failed := false
	for i, k := range keys {
		if xs[i] = e.find(hs[i], k); xs[i] < 0 {
			errs[i] = fmt.Errorf("%w: %s", ErrMiss, k)
			failed = true
		}
	}
	if failed {
		return errs
	}
	for _, x := range xs {
		if en := &e.ents[x]; !en.kept {
			e.unlink(x)
			en.kept = true
			e.pinned += int64(en.klen) + int64(en.vlen)
		}
	}
	return errs
}

// Unpin implements Pinner: the values go back to the eviction queues (the
// main one's head: they were kept for a reason). A key not held, or not
// pinned, is no error.
func (e *Embedded) Unpin(_ context.Context, keys []string) []error {
	errs := make([]error, len(keys))
	hs := e.hashKeys(keys)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return closedErrs(len(keys))
	}
	for i, k := range keys {
		if x := e.find(hs[i], k); x >= 0 && e.ents[x].kept {
			en := &e.ents[x]
			en.kept = false
			e.pinned -= int64(en.klen) + int64(en.vlen)
			e.push(x, qMain)
		}
	}
	return errs
}

// Pinned reports the bytes of pinned values (in Usage's used).
func (e *Embedded) Pinned() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pinned
}
