package writer

import (
	"sync"
	"time"
)

// Queue is the committer's FIFO of pending work: an unbounded ring that
// allocates only when it grows. Push never blocks; Pop blocks until an item
// is queued or the queue is closed and drained.
type Queue[T any] struct {
	mu     sync.Mutex
	cond   *sync.Cond
	buf    []T
	head   int
	n      int
	closed bool
	// done counts items whose processing finished (Done); Drain waits on it.
	pushed, done uint64
	idle         *sync.Cond
}

// NewQueue returns an empty queue.
func NewQueue[T any](capHint int) *Queue[T] {
	if capHint < 1 {
		capHint = 1
	}
	q := &Queue[T]{buf: make([]T, capHint)}
	q.cond = sync.NewCond(&q.mu)
	q.idle = sync.NewCond(&q.mu)
	return q
}

// Push appends v and returns its sequence number (1, 2, ...).
func (q *Queue[T]) Push(v T) uint64 {
	q.mu.Lock()
	if q.n == len(q.buf) {
		nb := make([]T, 2*len(q.buf))
		for i := 0; i < q.n; i++ {
			nb[i] = q.buf[(q.head+i)%len(q.buf)]
		}
		q.buf, q.head = nb, 0
	}
	q.buf[(q.head+q.n)%len(q.buf)] = v
	q.n++
	q.pushed++
	seq := q.pushed
	q.cond.Signal()
	q.mu.Unlock()
	return seq
}

// Pop returns the oldest item, blocking while the queue is empty; ok is
// false once the queue is closed and empty.
func (q *Queue[T]) Pop() (v T, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.n == 0 {
		if q.closed {
			return v, false
		}
		q.cond.Wait()
	}
	v = q.buf[q.head]
	var zero T
	q.buf[q.head] = zero
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	return v, true
}

// Done marks one popped item as processed.
func (q *Queue[T]) Done() {
	q.mu.Lock()
	q.done++
	q.idle.Broadcast()
	q.mu.Unlock()
}

// Wait blocks until the item with sequence number seq (from Push) and every
// item before it has been processed, or the queue closed.
func (q *Queue[T]) Wait(seq uint64) {
	q.mu.Lock()
	for !q.reached(seq) {
		q.idle.Wait()
	}
	q.mu.Unlock()
}

// WaitFor is Wait bounded by timeout; it reports whether the wait ended
// before the timeout (timeout < 0: no bound).
func (q *Queue[T]) WaitFor(seq uint64, timeout time.Duration) bool {
	if timeout < 0 {
		q.Wait(seq)
		return true
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.reached(seq) {
		return true
	}
	deadline := time.Now().Add(timeout)
	t := time.AfterFunc(timeout, func() {
		q.mu.Lock()
		q.idle.Broadcast()
		q.mu.Unlock()
	})
	defer t.Stop()
	for !q.reached(seq) {
		if !time.Now().Before(deadline) {
			return false
		}
		q.idle.Wait()
	}
	return true
}

func (q *Queue[T]) reached(seq uint64) bool {
	return q.done >= seq || (q.closed && q.n == 0 && q.done == q.pushed)
}

// Drain blocks until everything pushed so far has been processed.
func (q *Queue[T]) Drain() {
	q.mu.Lock()
	seq := q.pushed
	q.mu.Unlock()
	q.Wait(seq)
}

// Since calls fn, under the queue's lock, for every queued item with a
// sequence number above seq, oldest first, until fn returns false, and
// returns the sequence number of the last item fn accepted (seq when none;
// items already popped count as accepted). fn must not call back into the
// queue.
func (q *Queue[T]) Since(seq uint64, fn func(v T) bool) uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	first := q.pushed - uint64(q.n) + 1 // sequence number of the head
	last := max(seq, first-1)
	for s := last + 1; s <= q.pushed; s++ {
		if !fn(q.buf[(q.head+int(s-first))%len(q.buf)]) {
			break
		}
		last = s
	}
	return last
}

// Pushed is the sequence number of the last item pushed.
func (q *Queue[T]) Pushed() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.pushed
}

// Pending is the number of items pushed and not yet processed.
func (q *Queue[T]) Pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return int(q.pushed - q.done)
}

// Close makes Pop return false once the queue is empty.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.idle.Broadcast()
	q.mu.Unlock()
}
