package tier

import (
	"context"
	"fmt"
	"hash/maphash"
	"os"
	"sync"

	"github.com/omnicache/omnicache/internal/hostmem"
)

// DefaultEmbeddedBytes bounds an embedded store made with a zero capacity.
const DefaultEmbeddedBytes = 1 << 30

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

// Get implements Backend: copies of the values (one allocation for the
// batch).
//
// The copies run outside the store's lock, as Set's do: under it Get finds
// and pins the values (a value replaced, evicted or deleted meanwhile keeps
// its slot until the copy is done), then copies, then unpins.
func (e *Embedded) Get(_ context.Context, keys []string) ([][]byte, []error) {
	vals, errs, _ := e.getInto(keys, nil)
	return vals, errs
}

// getInto is Get copying into buf when it is large enough (a fresh
// allocation otherwise); it returns the buffer the values are in (nil when
// none was found).
func (e *Embedded) getInto(keys []string, buf []byte) ([][]byte, []error, []byte) {
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
		return vals, errs, nil
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
		return vals, errs, nil
	}
	e.inflight++
	e.mu.Unlock()

	if e.fetching != nil {
		e.fetching()
	}
	if cap(buf) < total {
		buf = make([]byte, 0, total)
	}
	buf = buf[:0]
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
	return vals, errs, buf
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
		ci, si, err := e.alloc(int(size))
		if err != nil {
			errs[i] = err
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

// Leading implements Leader (Tier.Lookup on this store): how many leading
// addresses of addrs it holds, the first it lacks ending the run. Under
// one hold of the lock (the engine goroutine asks: it waits for the lock
// at most once, as for Exists), the addresses are formatted into a buffer
// on the stack and hashed a group at a time (8 keys, doubling up to 64),
// then the group's hashes probed: independent probes, whose cache misses
// overlap. No allocation, and nothing done past the group in which the
// first missing key fell. (Exists needs every address of the prefix asked
// formatted, hashed and probed, each allocated.) Presence is by hash, as
// Exists answers. A closed store fails with ErrClosed, nothing counted.
func (e *Embedded) Leading(_ context.Context, addrs Addrs) (int, error) {
	var sb [256]byte
	buf := sb[:0] // a longer address grows it once
	var hb [64]uint64
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, ErrClosed
	}
	total := addrs.Len()
	for lo, step := 0, 8; lo < total; lo, step = lo+step, min(2*step, len(hb)) {
		hs := hb[:0]
		for i := lo; i < min(lo+step, total); i++ {
			buf = addrs.Append(buf[:0], i)
			hs = append(hs, e.hashBytes(buf))
		}
		for i, h := range hs {
			if _, ok := e.idx[h]; !ok {
				return lo + i, nil
			}
		}
	}
	return total, nil
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
