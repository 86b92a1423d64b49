// The embedded store's index: pointer-free entries found by key hash
// (collisions chained, the full key compared), and their removal.

package tier

import (
	"hash/maphash"
)

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

func (e *Embedded) newEnt() int32 {
	if e.free >= 0 {
		x := e.free
		e.free = e.ents[x].next
		return x
	}
	e.ents = append(e.ents, ent{})
	return int32(len(e.ents) - 1)
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
