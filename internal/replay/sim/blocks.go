package sim

// Blocks is the KV block manager: a fixed pool of block ids with reference
// counts, a free queue and a prefix-hash index, as vLLM's v1 block pool.
//
// A block whose reference count drops to zero goes to the tail of the free
// queue and keeps its hash: until it is handed out again it can still be hit
// (Touch takes it back out of the queue). Alloc pops the head of the queue,
// the least recently freed block, and evicts its hash: the slot changes
// tenant. Blocks are never allocated in any other order, so a replay really
// cycles the whole slot space.
//
// Columns are flat slices indexed by block id; the free queue is an intrusive
// doubly linked list over prev/next.
type Blocks struct {
	ref    []int32
	hash   []uint64
	hashed []bool
	prev   []int32
	next   []int32
	head   int32 // least recently freed, -1 when empty
	tail   int32 // most recently freed
	free   int
	index  map[uint64]int32

	Evictions int64 // hashed blocks handed to a new tenant
}

// NewBlocks returns a pool of n blocks, all free, queued in id order.
func NewBlocks(n int) *Blocks {
	b := &Blocks{
		ref:    make([]int32, n),
		hash:   make([]uint64, n),
		hashed: make([]bool, n),
		prev:   make([]int32, n),
		next:   make([]int32, n),
		head:   -1,
		tail:   -1,
		index:  make(map[uint64]int32),
	}
	for i := range n {
		b.pushBack(int32(i))
	}
	return b
}

// Len is the pool size.
func (b *Blocks) Len() int { return len(b.ref) }

// NumFree is the number of blocks with reference count zero.
func (b *Blocks) NumFree() int { return b.free }

// Ref is block id's reference count.
func (b *Blocks) Ref(id int32) int32 { return b.ref[id] }

// Cached is the number of hashes that can be hit.
func (b *Blocks) Cached() int { return len(b.index) }

// Lookup returns the block holding the prefix whose chained hash is h.
func (b *Blocks) Lookup(h uint64) (int32, bool) {
	id, ok := b.index[h]
	return id, ok
}

// Hash returns block id's hash, if it has one.
func (b *Blocks) Hash(id int32) (uint64, bool) { return b.hash[id], b.hashed[id] }

// Alloc hands out the least recently freed block with reference count 1,
// evicting its hash. It returns -1 when no block is free.
func (b *Blocks) Alloc() int32 {
	id := b.head
	if id < 0 {
		return -1
	}
	b.unlink(id)
	if b.hashed[id] {
		if cur, ok := b.index[b.hash[id]]; ok && cur == id {
			delete(b.index, b.hash[id])
		}
		b.hashed[id] = false
		b.Evictions++
	}
	b.ref[id] = 1
	return id
}

// Touch takes another reference to block id (a prefix hit), taking it off
// the free queue if it was free.
func (b *Blocks) Touch(id int32) {
	if b.ref[id] == 0 {
		b.unlink(id)
	}
	b.ref[id]++
}

// Free drops a reference; at zero the block joins the tail of the free
// queue, keeping its hash.
func (b *Blocks) Free(id int32) {
	if b.ref[id] <= 0 {
		panic("sim: free of a free block")
	}
	b.ref[id]--
	if b.ref[id] == 0 {
		b.pushBack(id)
	}
}

// Register gives block id (full, computed this step) the chained hash h. It
// reports whether the block became the one Lookup(h) returns: when another
// block already holds h (two requests computed the same prefix at once) the
// first stays cached and this one is not indexed.
func (b *Blocks) Register(id int32, h uint64) bool {
	if b.hashed[id] {
		return b.index[b.hash[id]] == id
	}
	if _, ok := b.index[h]; ok {
		return false
	}
	b.hash[id] = h
	b.hashed[id] = true
	b.index[h] = id
	return true
}

// Unregister drops block id's hash (its rows are about to be rewritten):
// Lookup no longer finds it.
func (b *Blocks) Unregister(id int32) {
	if !b.hashed[id] {
		return
	}
	if cur, ok := b.index[b.hash[id]]; ok && cur == id {
		delete(b.index, b.hash[id])
	}
	b.hashed[id] = false
}

// FreeOrder returns the free queue from least to most recently freed (for
// tests).
func (b *Blocks) FreeOrder() []int32 {
	out := make([]int32, 0, b.free)
	for id := b.head; id >= 0; id = b.next[id] {
		out = append(out, id)
	}
	return out
}

func (b *Blocks) pushBack(id int32) {
	b.prev[id] = b.tail
	b.next[id] = -1
	if b.tail >= 0 {
		b.next[b.tail] = id
	} else {
		b.head = id
	}
	b.tail = id
	b.free++
}

func (b *Blocks) unlink(id int32) {
	p, n := b.prev[id], b.next[id]
	if p >= 0 {
		b.next[p] = n
	} else {
		b.head = n
	}
	if n >= 0 {
		b.prev[n] = p
	} else {
		b.tail = p
	}
	b.prev[id], b.next[id] = -1, -1
	b.free--
}
