package writer

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type popResult struct {
	v  int
	ok bool
}

func popAsync(q *Queue[int]) <-chan popResult {
	return async(func() popResult {
		v, ok := q.Pop()
		return popResult{v, ok}
	})
}

func mustPop(t *testing.T, q *Queue[int]) int {
	t.Helper()
	r := recv(t, popAsync(q), "Pop of a non-empty queue")
	require.True(t, r.ok, "Pop of a non-empty queue")
	return r.v
}

func signal(f func()) <-chan struct{} {
	return async(func() struct{} { f(); return struct{}{} })
}

func TestQueueFIFOAcrossGrowth(t *testing.T) {
	for _, capHint := range []int{-3, 0, 1, 2, 5} {
		q := NewQueue[int](capHint)
		next, want := 0, 0
		push := func(n int) {
			for i := 0; i < n; i++ {
				next++
				require.EqualValues(t, next, q.Push(next), "sequence number of push %d", next)
			}
		}
		pop := func(n int) {
			for i := 0; i < n; i++ {
				want++
				require.Equal(t, want, mustPop(t, q), "capHint %d: FIFO order", capHint)
			}
		}
		// Interleave so that the ring wraps before it grows (head ≠ 0 at
		// growth), several times over.
		for round := 1; round <= 6; round++ {
			push(3 * round)
			pop(2 * round)
		}
		require.Equal(t, next, q.Pending(), "popped items stay pending until Done")
		pop(next - want)
		assert.EqualValues(t, next, q.Pushed())
	}
}

func TestQueuePopBlocksUntilPush(t *testing.T) {
	q := NewQueue[int](1)
	ch := popAsync(q)
	require.True(t, blocked(ch), "Pop returned from an empty queue")
	q.Push(42)
	r := recv(t, ch, "Pop after Push")
	require.True(t, r.ok)
	assert.Equal(t, 42, r.v)
}

func TestQueueWaitAndDrain(t *testing.T) {
	q := NewQueue[int](2)
	s1, s2, s3 := q.Push(1), q.Push(2), q.Push(3)
	require.Equal(t, []uint64{1, 2, 3}, []uint64{s1, s2, s3})
	assert.Equal(t, 3, q.Pending())

	recv(t, signal(func() { q.Wait(0) }), "Wait(0)")

	w2 := signal(func() { q.Wait(s2) })
	drained := signal(q.Drain)
	require.True(t, blocked(w2), "Wait(2) returned before anything was done")

	assert.Equal(t, 1, mustPop(t, q))
	require.True(t, blocked(w2), "Wait(2) returned after an item was only popped")
	q.Done()
	require.True(t, blocked(w2), "Wait(2) returned with only item 1 done")
	assert.Equal(t, 2, q.Pending())

	assert.Equal(t, 2, mustPop(t, q))
	q.Done()
	recv(t, w2, "Wait(2) once items 1 and 2 are done")
	require.True(t, blocked(drained), "Drain returned with item 3 pending")

	// Drain waits for what was pushed when it was called, not for later
	// pushes.
	q.Push(4)
	assert.Equal(t, 3, mustPop(t, q))
	q.Done()
	recv(t, drained, "Drain once items 1-3 are done")
	assert.Equal(t, 1, q.Pending())

	assert.Equal(t, 4, mustPop(t, q))
	q.Done()
	assert.Zero(t, q.Pending())
	recv(t, signal(q.Drain), "Drain of an idle queue")
}

func TestQueueSince(t *testing.T) {
	q := NewQueue[int](2)
	since := func(seq uint64) ([]int, uint64) {
		var got []int
		last := q.Since(seq, func(v int) bool { got = append(got, v); return true })
		return got, last
	}

	got, last := since(0)
	assert.Empty(t, got, "empty queue")
	assert.Zero(t, last)

	for v := 1; v <= 5; v++ {
		q.Push(10 * v)
	}
	got, last = since(0)
	assert.Equal(t, []int{10, 20, 30, 40, 50}, got)
	assert.EqualValues(t, 5, last)

	// Popped items are no longer queued: Since starts at the head.
	assert.Equal(t, 10, mustPop(t, q))
	assert.Equal(t, 20, mustPop(t, q))
	got, last = since(0)
	assert.Equal(t, []int{30, 40, 50}, got, "from 0 after two pops")
	assert.EqualValues(t, 5, last)
	got, _ = since(1)
	assert.Equal(t, []int{30, 40, 50}, got, "from a popped sequence number")
	got, _ = since(3)
	assert.Equal(t, []int{40, 50}, got, "after sequence 3")
	got, last = since(5)
	assert.Empty(t, got, "after the last pushed")
	assert.EqualValues(t, 5, last)
	got, last = since(9)
	assert.Empty(t, got, "after a sequence number not pushed yet")
	assert.EqualValues(t, 9, last, "Since returns seq when it saw nothing")

	// Wrap the ring and grow it with the head in the middle.
	for v := 6; v <= 12; v++ {
		q.Push(10 * v)
		if v%2 == 0 {
			mustPop(t, q)
		}
	}
	// Pushed 12, popped 2+4 = 6: queued are 7..12.
	got, last = since(4)
	assert.Equal(t, []int{70, 80, 90, 100, 110, 120}, got)
	assert.EqualValues(t, 12, last)
	got, _ = since(10)
	assert.Equal(t, []int{110, 120}, got)

	// The incremental use the committer makes of it: each item seen once.
	var seen []int
	mark := uint64(0)
	for v := 13; v <= 16; v++ {
		q.Push(10 * v)
		mark = q.Since(mark, func(x int) bool { seen = append(seen, x); return true })
	}
	assert.Equal(t, []int{70, 80, 90, 100, 110, 120, 130, 140, 150, 160}, seen)

	// fn stops the walk (the committer's barrier at in-order work): the
	// item it refused is not counted, and the next walk starts at it.
	q.Push(170)
	q.Push(-1) // barrier
	q.Push(190)
	seen = seen[:0]
	stop := func(x int) bool {
		if x < 0 {
			return false
		}
		seen = append(seen, x)
		return true
	}
	mark = q.Since(mark, stop)
	assert.Equal(t, []int{170}, seen)
	assert.EqualValues(t, 17, mark, "stops before the barrier's sequence 18")
	assert.EqualValues(t, 17, q.Since(mark, stop), "the barrier still stops it")
	seen = seen[:0]
	mark = q.Since(18, stop) // past the barrier (the committer ran it)
	assert.Equal(t, []int{190}, seen)
	assert.EqualValues(t, 19, mark)
}

func TestQueueClose(t *testing.T) {
	q := NewQueue[int](1)
	q.Push(1)
	q.Push(2)
	q.Close()
	assert.Equal(t, 1, mustPop(t, q), "Close keeps queued items")
	assert.Equal(t, 2, mustPop(t, q))
	r := recv(t, popAsync(q), "Pop of a closed, drained queue")
	assert.False(t, r.ok)
	assert.Zero(t, r.v)
	q.Done()
	q.Done()
	recv(t, signal(q.Drain), "Drain of a closed queue")
}

func TestQueueCloseWakesWaiters(t *testing.T) {
	q := NewQueue[int](1)
	pops := []<-chan popResult{popAsync(q), popAsync(q)}
	for _, ch := range pops {
		require.True(t, blocked(ch), "Pop returned from an empty queue")
	}
	// Wait for a sequence number that is never pushed: only Close (with
	// everything processed) ends it.
	w := signal(func() { q.Wait(7) })
	require.True(t, blocked(w))

	q.Close()
	for _, ch := range pops {
		r := recv(t, ch, "a blocked Pop after Close")
		assert.False(t, r.ok)
	}
	recv(t, w, "Wait after Close of a drained queue")
}

// Wait on a closed queue still waits for items that were popped but not
// done.
func TestQueueWaitAfterCloseWaitsForDone(t *testing.T) {
	q := NewQueue[int](1)
	seq := q.Push(1)
	q.Close()
	assert.Equal(t, 1, mustPop(t, q))
	w := signal(func() { q.Wait(seq) })
	require.True(t, blocked(w), "Wait returned before the popped item was done")
	q.Done()
	recv(t, w, "Wait once the item is done")
}

// Producers push concurrently, one consumer pops and marks done (the
// committer's pattern), producers Wait for their own items: every item
// arrives once, each producer's items in order, and Wait(seq) returns only
// once the consumer processed that item.
func TestQueueConcurrentProducersConsumer(t *testing.T) {
	const producers, items = 4, 500
	type item struct{ p, i int }
	q := NewQueue[item](1)

	var processed sync.Map // seq → struct{}
	consumer := async(func() [producers][]int {
		var got [producers][]int
		var seq uint64
		for {
			v, ok := q.Pop()
			if !ok {
				return got
			}
			seq++
			got[v.p] = append(got[v.p], v.i)
			processed.Store(seq, struct{}{})
			q.Done()
		}
	})

	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < items; i++ {
				seq := q.Push(item{p, i})
				if i%50 == 0 {
					q.Wait(seq)
					if _, ok := processed.Load(seq); !ok {
						t.Errorf("Wait(%d) returned before item %d was processed", seq, seq)
					}
				}
			}
		}()
	}
	recv(t, signal(wg.Wait), "the producers")
	recv(t, signal(q.Drain), "Drain")
	assert.Zero(t, q.Pending())
	assert.EqualValues(t, producers*items, q.Pushed())
	q.Close()
	got := recv(t, consumer, "the consumer")
	for p := range got {
		require.Len(t, got[p], items, "producer %d", p)
		for i, v := range got[p] {
			require.Equal(t, i, v, "producer %d: items out of order", p)
		}
	}
}

func TestQueueWaitFor(t *testing.T) {
	q := NewQueue[int](2)
	seq := q.Push(1)
	// Nothing processes the item: the bounded wait gives up (the bound is
	// a deadline the test sets, not a performance threshold).
	require.False(t, q.WaitFor(seq, 10*time.Millisecond), "WaitFor returned true for an item nobody processed")
	_, ok := q.Pop()
	require.True(t, ok)
	q.Done()
	require.True(t, q.WaitFor(seq, 0), "WaitFor of a processed item")
	require.True(t, q.WaitFor(seq, -1))
	seq = q.Push(2)
	done := make(chan bool)
	go func() { done <- q.WaitFor(seq, deadlockTimeout) }()
	_, _ = q.Pop()
	q.Done()
	require.True(t, <-done, "WaitFor woken by Done")
}

// WaitForSpin spins within its bound: a spin longer than the timeout ends
// with it (an hour's spin would outlast the test's deadline), and an item
// done during the spin ends the wait.
func TestQueueWaitForSpin(t *testing.T) {
	if runtime.GOMAXPROCS(0) == 1 { // the spins below need a second P
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	}
	q := NewQueue[int](2)
	seq := q.Push(1)
	require.False(t, recv(t, async(func() bool { return q.WaitForSpin(seq, 10*time.Millisecond, time.Hour) }), "WaitForSpin past its timeout"),
		"WaitForSpin returned true for an item nobody processed")
	got := async(func() bool { return q.WaitForSpin(seq, deadlockTimeout, deadlockTimeout) })
	_, _ = q.Pop()
	q.Done()
	require.True(t, recv(t, got, "WaitForSpin once the item is done"), "WaitForSpin did not see Done")
}

// setPolling sets the consumer's polling for one test.
func setPolling(t *testing.T, min, max, idle time.Duration) {
	m0, x0, i0 := pollMin, pollMax, pollIdle
	pollMin, pollMax, pollIdle = min, max, idle
	t.Cleanup(func() { pollMin, pollMax, pollIdle = m0, x0, i0 })
}

// PushLazy leaves a polling consumer alone (it takes the item at its next
// poll); Push, Kick and every wait for progress wake it at once; a consumer
// that stopped polling (idle past pollIdle) is woken by PushLazy too.
func TestQueuePushLazy(t *testing.T) {
	t.Run("polling consumer", func(t *testing.T) {
		setPolling(t, time.Hour, time.Hour, 2*time.Hour) // its next poll: never, in this test
		q := NewQueue[int](1)
		pop := popAsync(q)
		require.True(t, blocked(pop))
		q.PushLazy(1)
		require.True(t, blocked(pop), "PushLazy woke a polling consumer")
		q.Kick()
		require.Equal(t, popResult{1, true}, recv(t, pop, "Pop after Kick"))
		q.Done()

		pop = popAsync(q)
		require.True(t, blocked(pop))
		seq := q.PushLazy(2)
		require.True(t, blocked(pop))
		waited := signal(func() { q.Wait(seq) })
		require.Equal(t, popResult{2, true}, recv(t, pop, "Pop once a Wait for the item began"))
		q.Done()
		recv(t, waited, "Wait once the item is done")

		pop = popAsync(q)
		require.True(t, blocked(pop))
		q.PushLazy(3)
		require.True(t, blocked(pop))
		q.Push(4) // wakes: the consumer takes both
		require.Equal(t, popResult{3, true}, recv(t, pop, "Pop after Push"))
		q.Done()
		require.Equal(t, 4, mustPop(t, q))
		q.Done()
	})
	t.Run("poll picks the item up", func(t *testing.T) {
		setPolling(t, time.Millisecond, 2*time.Millisecond, time.Hour)
		q := NewQueue[int](1)
		pop := popAsync(q)
		require.True(t, blocked(pop))
		q.PushLazy(5)
		require.Equal(t, popResult{5, true}, recv(t, pop, "Pop of a lazily pushed item, by polling"))
	})
	t.Run("consumer asleep for good", func(t *testing.T) {
		setPolling(t, time.Hour, time.Hour, 0) // no polling at all
		q := NewQueue[int](1)
		pop := popAsync(q)
		require.True(t, blocked(pop))
		q.PushLazy(6)
		require.Equal(t, popResult{6, true}, recv(t, pop, "Pop of a lazily pushed item, woken"))
		pop = popAsync(q)
		require.True(t, blocked(pop))
		q.Close()
		require.False(t, recv(t, pop, "Pop after Close").ok)
	})
}

// WaitFor's spin (spinDone) sees an item done without the lock, ends at
// its bound or when the queue closes, and never spins on one P (the
// consumer could not run).
func TestQueueWaitSpin(t *testing.T) {
	if runtime.GOMAXPROCS(0) == 1 { // the spins below need a second P
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	}
	q := NewQueue[int](1)
	seq := q.Push(1)
	require.False(t, q.spinDone(seq, time.Millisecond), "spin past its bound with nothing done")
	got := async(func() bool { return q.spinDone(seq, deadlockTimeout) })
	_, _ = q.Pop()
	q.Done()
	require.True(t, recv(t, got, "spin once the item is done"), "spin did not see Done")
	require.True(t, q.spinDone(seq, time.Nanosecond), "an item already done")

	seq = q.Push(2)
	got = async(func() bool { return q.spinDone(seq, deadlockTimeout) })
	q.Close()
	require.False(t, recv(t, got, "spin once the queue closed"), "Close ends the spin; the locked wait decides")

	// On one P no spin: an item not done is reported at once (a spin of an
	// hour would outlast the test's deadline), and WaitFor's locked wait
	// sees it done.
	q = NewQueue[int](1)
	seq = q.Push(3)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	require.False(t, recv(t, async(func() bool { return q.spinDone(seq, time.Hour) }), "spin with one P"), "spin with one P")
	_, _ = q.Pop()
	q.Done()
	require.True(t, q.WaitFor(seq, time.Hour), "WaitFor with one P: the locked wait")
}

// setConsumerSpin sets consumerSpin for the test.
func setConsumerSpin(t *testing.T, d time.Duration) {
	d0 := consumerSpin
	consumerSpin = d
	t.Cleanup(func() { consumerSpin = d0 })
}

// A consumer that ran out of work spins for more before it polls: an item
// pushed lazily during the spin is popped at once, with no wake (the
// consumer is not asleep) and no poll (an hour away here). Without the
// spin the same push waits for the poll, or a Kick.
func TestQueuePopSpinsForWork(t *testing.T) {
	if runtime.GOMAXPROCS(0) == 1 { // the spin needs a second P
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	}
	setPolling(t, time.Hour, time.Hour, 2*time.Hour)
	setConsumerSpin(t, time.Hour) // spins until the push (or Close)
	q := NewQueue[int](1)
	pop := popAsync(q)
	require.True(t, blocked(pop))
	require.False(t, q.Asleep(), "a spinning consumer is not asleep")
	q.PushLazy(1)
	require.Equal(t, popResult{1, true}, recv(t, pop, "Pop of an item pushed during its spin"))
	q.Done()

	setConsumerSpin(t, 0)
	pop = popAsync(q)
	require.True(t, blocked(pop))
	require.True(t, q.Asleep(), "a polling consumer is asleep")
	q.PushLazy(2)
	require.True(t, blocked(pop), "a lazy push leaves a polling consumer alone")
	require.True(t, q.Kick())
	require.Equal(t, popResult{2, true}, recv(t, pop, "Pop after Kick"))
	q.Done()

	// Close ends a spin.
	setConsumerSpin(t, time.Hour)
	pop = popAsync(q)
	require.True(t, blocked(pop))
	q.Close()
	require.Equal(t, popResult{0, false}, recv(t, pop, "Pop of a closed queue"))
}

// Kick reports whether the consumer was asleep with items queued (a
// claim that follows it then does not spin: see Pages.ClaimSpin).
func TestQueueKickReportsWake(t *testing.T) {
	setPolling(t, time.Hour, time.Hour, 2*time.Hour) // a polling consumer is asleep until kicked
	q := NewQueue[int](1)
	require.False(t, q.Kick(), "Kick with no consumer and nothing queued")
	pop := popAsync(q)
	require.True(t, blocked(pop))
	require.False(t, q.Kick(), "Kick of a sleeping consumer with nothing queued")
	q.PushLazy(1)
	require.True(t, blocked(pop))
	require.True(t, q.Kick(), "Kick of a sleeping consumer with an item queued")
	require.Equal(t, popResult{1, true}, recv(t, pop, "Pop after Kick"))
	q.Done()
	q.PushLazy(2) // queued, no consumer in Pop: nobody to wake
	require.False(t, q.Kick(), "Kick with an item queued and the consumer not in Pop")
	require.Equal(t, 2, mustPop(t, q))
	q.Done()
}
