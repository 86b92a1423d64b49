package writer

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnicache/omnicache/internal/spin"
)

// Queue is the committer's FIFO of pending work: an unbounded ring that
// allocates only when it grows. Push never blocks; Pop blocks until an item
// is queued or the queue is closed and drained.
//
// Waking a sleeping consumer is a system call (and, in a VM, an
// inter-processor interrupt) paid by the goroutine that pushes: several µs
// of the engine goroutine's time per step; and the woken consumer runs
// µs later still (in a VM a goroutine readied from a sleep can wait ten
// µs or more before it runs). So a consumer that ran out of
// work first spins for more (Pop: up to consumerSpin, pausing between
// checks of an atomic push count, and not on one P), which a steady
// producer's next item reaches without any wake; then it polls for a
// while before it sleeps for good (every pollMin, backing off to pollMax,
// for pollIdle), and PushLazy leaves a polling consumer alone: work that
// nobody waits for yet (a decode-buffer flush, a small step's rows) is
// picked up within pollMax at the consumer's own cost. Push wakes the
// consumer at once, and so does every wait for progress (Wait, WaitFor,
// Drain, Kick): nothing waits on a poll.
//
// The queue's lock is taken by the engine goroutine (Push) and the
// committer (Pop, Done, Since): padding keeps its line apart from the
// objects allocated beside it.
type Queue[T any] struct {
	_      linePad
	mu     sync.Mutex
	buf    []T
	head   int
	n      int
	pushed uint64
	idle   *sync.Cond
	// consumers sleeping in Pop, and those of them polling (with timer,
	// which one at a time uses); a token on wake (closed by Close) ends a
	// sleep.
	sleepers, pollers int
	wake              chan struct{}
	timer             *time.Timer
	// done counts items whose processing finished (Done; Drain waits on
	// it); closed is set by Close. Both are written under mu and read
	// under it, except by WaitFor's spin, which loads them without it:
	// they are on a line of their own, so that its loads do not pull the
	// lock's line away from the goroutines taking it.
	_      linePad
	done   atomic.Uint64
	closed atomic.Bool
	_      linePad
	// pushes is pushed, stored after every push (under mu) for the
	// consumer's spin, which loads it without the lock: on a line of its
	// own, written by the producer only.
	pushes atomic.Uint64
	_      linePad
}

// The consumer's spin and polling (see Queue): it spins up to consumerSpin
// once the queue ran empty, then polls first pollMin later, each next poll
// twice as late up to pollMax, and polls no more (sleeps until woken) once
// the queue has been empty for pollIdle. WaitFor spins up to waitSpin
// before it sleeps. (Variables for the tests.)
//
// consumerSpin, 20 µs, is about twice the wake it saves (a system call
// for the producer, then the consumer's delay before it runs). With the
// reader leaving a working committer its hit reads, it lets the committer
// start almost every hit read before the engine comes for it:
// BenchmarkStep shape=decode64 hit=50 shows it in sec/op and in
// caller-reads/op (the reads the engine did itself). An idle consumer pays
// the spin once per run of work, on its own core.
var (
	consumerSpin = 20 * time.Microsecond
	waitSpin     = 50 * time.Microsecond
	pollMin      = 50 * time.Microsecond
	pollMax      = time.Millisecond
	pollIdle     = time.Second
)

// NewQueue returns an empty queue.
func NewQueue[T any](capHint int) *Queue[T] {
	if capHint < 1 {
		capHint = 1
	}
	q := &Queue[T]{buf: make([]T, capHint), wake: make(chan struct{}, 1)}
	q.idle = sync.NewCond(&q.mu)
	return q
}

// Push appends v, wakes the consumer and returns v's sequence number (1,
// 2, ...).
func (q *Queue[T]) Push(v T) uint64 {
	q.mu.Lock()
	seq := q.appendLocked(v)
	q.wakeLocked()
	q.mu.Unlock()
	return seq
}

// PushLazy appends v and returns its sequence number, waking the consumer
// only if it sleeps for good: a polling consumer picks v up within pollMax
// (see Queue), and any wait for v wakes it.
func (q *Queue[T]) PushLazy(v T) uint64 {
	q.mu.Lock()
	seq := q.appendLocked(v)
	if q.pollers == 0 {
		q.wakeLocked()
	}
	q.mu.Unlock()
	return seq
}

// Kick wakes the consumer if it sleeps with items queued: a goroutine about
// to wait for the consumer's progress by other means (a staging page, a
// budget) calls it. It reports whether the consumer was asleep (woken now,
// or by a token already waiting): the Go scheduler runs a goroutine
// readied by a wake next on the waker's P, so a waker that then spins
// instead of parking holds it off (see Pages.ClaimSpin).
func (q *Queue[T]) Kick() bool {
	q.mu.Lock()
	woke := q.kickLocked()
	q.mu.Unlock()
	return woke
}

func (q *Queue[T]) kickLocked() bool {
	return q.n > 0 && q.wakeLocked()
}

// wakeLocked wakes a sleeping consumer and reports whether one sleeps.
func (q *Queue[T]) wakeLocked() bool {
	if q.sleepers > 0 && !q.closed.Load() {
		select {
		case q.wake <- struct{}{}:
		default: // a token is already waiting
		}
		return true
	}
	return false
}

func (q *Queue[T]) appendLocked(v T) uint64 {
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
	q.pushes.Store(q.pushed)
	return q.pushed
}

// Pop returns the oldest item, blocking while the queue is empty; ok is
// false once the queue is closed and empty.
func (q *Queue[T]) Pop() (v T, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 && !q.closed.Load() {
		q.sleepLocked()
	}
	if q.n == 0 {
		return v, false // closed
	}
	v = q.buf[q.head]
	var zero T
	q.buf[q.head] = zero
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	return v, true
}

// sleepLocked waits, spinning, then polling, then sleeping (see Queue),
// until an item is queued or the queue is closed. Called and returns with
// q.mu held.
func (q *Queue[T]) sleepLocked() {
	if seen := q.pushed; consumerSpin > 0 {
		q.mu.Unlock()
		spin.Until(consumerSpin, func() bool { return q.pushes.Load() != seen || q.closed.Load() }) // no spin on one P
		q.mu.Lock()
	}
	poll, slept := pollMin, time.Duration(0)
	for q.n == 0 && !q.closed.Load() {
		polling := slept < pollIdle && q.pollers == 0 // one timer: one poller
		q.sleepers++
		if polling {
			q.pollers++
		}
		q.mu.Unlock()
		if polling {
			if q.timer == nil {
				q.timer = time.NewTimer(poll)
			} else {
				q.timer.Reset(poll)
			}
			select {
			case <-q.wake:
				q.timer.Stop()
			case <-q.timer.C:
			}
			slept += poll
			poll = min(2*poll, pollMax)
		} else {
			<-q.wake
		}
		q.mu.Lock()
		q.sleepers--
		if polling {
			q.pollers--
		}
	}
}

// Done marks one popped item as processed.
func (q *Queue[T]) Done() {
	q.mu.Lock()
	q.done.Add(1)
	q.idle.Broadcast()
	q.mu.Unlock()
}

// Wait blocks until the item with sequence number seq (from Push) and every
// item before it has been processed, or the queue closed.
func (q *Queue[T]) Wait(seq uint64) {
	q.mu.Lock()
	if !q.reached(seq) {
		q.kickLocked()
	}
	for !q.reached(seq) {
		q.idle.Wait()
	}
	q.mu.Unlock()
}

// WaitFor is Wait bounded by timeout; it reports whether the wait ended
// before the timeout (timeout < 0: no bound).
func (q *Queue[T]) WaitFor(seq uint64, timeout time.Duration) bool {
	return q.WaitForSpin(seq, timeout, waitSpin)
}

// WaitForSpin is WaitFor spinning up to spinFor (within the bound) before
// it parks, where WaitFor spins waitSpin.
func (q *Queue[T]) WaitForSpin(seq uint64, timeout, spinFor time.Duration) bool {
	if timeout < 0 {
		q.Wait(seq)
		return true
	}
	q.mu.Lock()
	if q.reached(seq) {
		q.mu.Unlock()
		return true
	}
	q.kickLocked()
	q.mu.Unlock()
	deadline := time.Now().Add(timeout) // the spin counts against the bound
	if q.spinDone(seq, min(spinFor, timeout)) {
		return true
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	t := time.AfterFunc(time.Until(deadline), func() {
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

// spinDone waits up to bound for item seq to be processed, without the
// lock and without parking (with more than one P): a read-ahead the
// consumer is finishing is waited for without a timer and without the
// wake, whose latency is several µs. It reports whether seq was reached;
// a closed queue ends the spin (the locked wait decides).
func (q *Queue[T]) spinDone(seq uint64, bound time.Duration) bool {
	spin.Until(bound, func() bool { return q.closed.Load() || q.done.Load() >= seq }) // no spin on one P
	return q.done.Load() >= seq
}

func (q *Queue[T]) reached(seq uint64) bool {
	done := q.done.Load()
	return done >= seq || (q.closed.Load() && q.n == 0 && done == q.pushed)
}

// Drain blocks until everything pushed so far has been processed.
func (q *Queue[T]) Drain() {
	q.mu.Lock()
	seq := q.pushed
	q.mu.Unlock()
	q.Wait(seq)
}

// Since calls fn for every queued item with a sequence number above seq,
// oldest first, until fn returns false, and returns the sequence number of
// the last item fn accepted (seq when none; items already popped count as
// accepted). Items are copied out under the queue's lock a few at a time
// and fn runs outside it, so a long walk never holds up Push (the engine
// goroutine's hand-over). fn may call back into the queue.
func (q *Queue[T]) Since(seq uint64, fn func(v T) bool) uint64 {
	const chunk = 16
	var batch [chunk]T // on the stack, gone with the call: not cleared
	last := seq
	for {
		q.mu.Lock()
		first := q.pushed - uint64(q.n) + 1 // sequence number of the head
		last = max(last, first-1)
		from, n := last+1, 0
		for s := from; s <= q.pushed && n < chunk; s++ {
			batch[n] = q.buf[(q.head+int(s-first))%len(q.buf)]
			n++
		}
		q.mu.Unlock()
		for i := 0; i < n; i++ {
			if !fn(batch[i]) {
				return last
			}
			last = from + uint64(i)
		}
		if n < chunk {
			return last
		}
	}
}

// Asleep reports whether a consumer sleeps in Pop (polling or for good;
// not spinning): an item pushed now waits for a poll or a wake.
func (q *Queue[T]) Asleep() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.sleepers > 0
}

// Reached reports, without the lock, whether item seq was processed (a
// false answer may be stale: the caller waits then).
func (q *Queue[T]) Reached(seq uint64) bool { return q.done.Load() >= seq }

// DoneSeq is the sequence number up to which every item was processed.
func (q *Queue[T]) DoneSeq() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.done.Load()
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
	return int(q.pushed - q.done.Load())
}

// Close makes Pop return false once the queue is empty.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	if !q.closed.Load() {
		q.closed.Store(true)
		close(q.wake) // every sleeping consumer wakes, and none sleeps again
	}
	q.idle.Broadcast()
	q.mu.Unlock()
}
