// The embedded store's eviction: the policies (S3-FIFO, LRU), their
// queues and ghost queues, and evictOne.

package tier

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
