package writer

import (
	"slices"

	"github.com/omnicache/omnicache/soa"
)

// DecodeBuf parks pure-decode steps: steps where every scheduled request
// decodes exactly one token, the same requests in the same order as the
// parked steps, and nothing arrives, finishes, aborts or is preempted. Up to
// block_size parked steps are written as one Write, bounded by the staging
// page (steps × tokens ≤ capacity) and by the device byte budget. Engine
// goroutine only.
type DecodeBuf struct {
	K   int     // steps parked
	IDs []int64 // the requests of the parked steps, in order
	W   *Write  // the write the parked steps form
}

// Continues reports whether a pure-decode step over ids may join the parked
// steps (an empty buffer takes any).
func (b *DecodeBuf) Continues(ids []int64) bool {
	return b.K == 0 || slices.Equal(ids, b.IDs)
}

// Fits reports whether one more step of n tokens fits a page of capacity
// rows.
func (b *DecodeBuf) Fits(n, capacity int) bool { return (b.K+1)*n <= capacity }

// Open starts a buffer for the requests ids, written by w.
func (b *DecodeBuf) Open(ids []int64, w *Write) {
	b.K, b.W = 0, w
	b.IDs = append(b.IDs[:0], ids...)
}

// Take empties the buffer and returns its write (nil when empty).
func (b *DecodeBuf) Take() *Write {
	w := b.W
	if b.K == 0 {
		w = nil
	}
	b.K, b.W = 0, nil
	return w
}

// Runs holds the pending deferred rows of every request: runs of a clone's
// rows, one singly linked list per request handle, in append order. A
// request's list is its open deferred write; Take closes it, so the next
// append opens a new one. Engine goroutine only.
type Runs struct {
	w    []*Write
	off  []int32
	n    []int32
	next []int32
	free []int32
	head []int32 // per handle, -1 when empty
	tail []int32
	// Out collects the runs taken for the next deferred task.
	Out []Seg
}

func (t *Runs) ensure(h soa.Handle) {
	for int(h) >= len(t.head) {
		t.head = append(t.head, -1)
		t.tail = append(t.tail, -1)
	}
}

// Push appends rows [off, off+n) of clone w to h's pending write.
func (t *Runs) Push(h soa.Handle, w *Write, off, n int32) {
	t.ensure(h)
	var i int32
	if k := len(t.free); k > 0 {
		i = t.free[k-1]
		t.free = t.free[:k-1]
		t.w[i], t.off[i], t.n[i], t.next[i] = w, off, n, -1
	} else {
		i = int32(len(t.w))
		t.w = append(t.w, w)
		t.off = append(t.off, off)
		t.n = append(t.n, n)
		t.next = append(t.next, -1)
	}
	if t.head[h] < 0 {
		t.head[h] = i
	} else {
		t.next[t.tail[h]] = i
	}
	t.tail[h] = i
}

// Take moves h's runs, in order, to Out.
func (t *Runs) Take(h soa.Handle) {
	if int(h) >= len(t.head) {
		return
	}
	for i := t.head[h]; i >= 0; {
		t.Out = append(t.Out, Seg{W: t.w[i], Off: t.off[i], N: t.n[i]})
		nx := t.next[i]
		t.w[i] = nil
		t.free = append(t.free, i)
		i = nx
	}
	t.head[h], t.tail[h] = -1, -1
}
