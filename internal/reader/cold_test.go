package reader

// Cold buffers (prefetch.go): the committer makes a prefetch read's
// buffers before it claims the read, and a consumer that comes meanwhile
// reads the rows itself when its destination needs no allocation, or waits
// and adopts the new buffers when it would; either way the rows are the
// planned ones, the read-ahead charge comes back, and the buffers end in
// the pool for the next hit.

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache/internal/errs"
)

// holdFresh holds the committer in its next allocation of a new prefetch
// buffer (bufPool.fresh) until release: entered is closed once it waits
// there. The hook is removed when the test ends.
func holdFresh(t *testing.T) (entered <-chan struct{}, release func()) {
	in, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	testHookFresh = func(int) {
		once.Do(func() { close(in) })
		<-gate
	}
	release = sync.OnceFunc(func() { close(gate) })
	t.Cleanup(func() {
		release()
		testHookFresh = nil
	})
	return in, release
}

func waitClosed(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(waitBound):
		t.Fatalf("%s: not within %v", what, waitBound)
	}
}

// poolBytes is the idle buffers' bytes in r's pool.
func (r *Reader) poolBytes() int64 {
	r.pool.mu.Lock()
	defer r.pool.mu.Unlock()
	return r.pool.bytes
}

// coldWorld is a world whose request 1 wrote block 1 (rows 0..3), and a
// hit step on it (request 2, from position 4, beside request 3 without a
// hit) begun while the committer is held making the step's new buffers.
func coldWorld(t *testing.T) (w *world, s *Step, release func()) {
	w = newWorld(t, Options{Prefetch: true, Budget: 1 << 20})
	w.blocks[1] = []int32{1}
	w.blocks[2] = []int32{1, 2}
	w.blocks[3] = []int32{3}
	_, err := w.read(w.step([]sched{{1, 0, 4}}))
	require.NoError(t, err)
	require.NoError(t, w.f.sync())
	w.rd.takeFreed(nil)
	entered, release := holdFresh(t)
	s = w.step([]sched{{3, 0, 2}, {2, 4, 2}}, Hit{Index: 1, Tokens: 4, Blocks: []int32{1}})
	require.True(t, s.Prefetched())
	waitClosed(t, entered, "the committer making the read's buffers")
	require.Equal(t, int32(pfAlloc), s.pfState.Load())
	return w, s, release
}

// A consumer whose destination holds the rows (a Result sized before, or
// a subset, sized by Materialize) reads them itself while the committer
// still makes the buffers: exact rows, the charge back at once. The
// buffers, once made, go to the pool, and the next hit step takes them
// from there (no new allocation) and is adopted.
func TestColdBuffersConsumerWithRoomReadsItself(t *testing.T) {
	for _, subset := range []bool{false, true} {
		t.Run(fmt.Sprintf("subset=%v", subset), func(t *testing.T) {
			w, s, release := coldWorld(t)
			ahead := (&w.f.st).ReadsAhead.Load()
			w.sized = true
			var d *dest
			var err error
			if subset {
				d, err = w.read(s, 1)
				require.NoError(t, err)
				wantRows(t, d, 0, 1, 4, 2, 0)
			} else {
				d, err = w.read(s)
				require.NoError(t, err)
				wantRows(t, d, 0, 3, 0, 3, 0)
				wantRows(t, d, 1, 1, 4, 2, 0)
			}
			require.Equal(t, ahead+1, (&w.f.st).ReadsAhead.Load(), "read by the consumer")
			require.Zero(t, w.rd.ReadAheadBytes(), "the charge is back once the consumer served the read")
			require.Zero(t, w.rd.poolBytes(), "the committer still holds the buffers it makes")
			release()
			require.NoError(t, w.f.sync())
			require.Equal(t, []*Step{s}, w.rd.takeFreed(nil), "released once the committer passed the read")
			require.Positive(t, w.rd.poolBytes(), "the new buffers wait in the pool")

			testHookFresh = func(int) { t.Error("a new buffer was made though the pool holds one") }
			w.blocks[4] = []int32{1, 6}
			w.blocks[5] = []int32{7}
			used := (&w.f.st).PrefetchUsed.Load()
			s2 := w.step([]sched{{5, 0, 2}, {4, 4, 2}}, Hit{Index: 1, Tokens: 4, Blocks: []int32{1}})
			require.NoError(t, w.f.sync()) // the committer read it
			w.sized = false
			d, err = w.read(s2)
			require.NoError(t, err)
			wantRows(t, d, 0, 5, 0, 5, 0)
			wantRows(t, d, 1, 1, 4, 4, 0)
			require.Equal(t, used+1, (&w.f.st).PrefetchUsed.Load(), "the committer's read, adopted")
		})
	}
}

// A consumer of the whole step whose destination holds nothing yet does
// not read the rows itself (it would allocate as much as the committer is
// making): it waits for the committer's read and adopts its buffers.
func TestColdBuffersConsumerWithoutRoomAdopts(t *testing.T) {
	w, s, release := coldWorld(t)
	ahead := (&w.f.st).ReadsAhead.Load()
	used := (&w.f.st).PrefetchUsed.Load()
	time.AfterFunc(10*time.Millisecond, release) // the consumer waits by then (or not yet: it adopts either way)
	d, err := w.read(s)
	require.NoError(t, err)
	wantRows(t, d, 0, 3, 0, 3, 0)
	wantRows(t, d, 1, 1, 4, 2, 0)
	require.Equal(t, ahead, (&w.f.st).ReadsAhead.Load(), "not read by the consumer")
	require.Equal(t, used+1, (&w.f.st).PrefetchUsed.Load(), "the committer's read, adopted")
	require.Zero(t, w.rd.ReadAheadBytes())
}

// A step given up (Discard, Abort) while the committer makes its buffers:
// the charge is back at once, the read is skipped, the record is freed
// once the committer passed it, and the buffers wait in the pool.
func TestColdBuffersOfACancelledStep(t *testing.T) {
	w, s, release := coldWorld(t)
	w.rd.Cancel(s)
	require.Zero(t, w.rd.ReadAheadBytes(), "Cancel gave the charge back at once")
	require.Empty(t, w.rd.takeFreed(nil), "the committer still holds the record")
	release()
	require.NoError(t, w.f.sync())
	require.Equal(t, []*Step{s}, w.rd.takeFreed(nil))
	require.Zero(t, (&w.f.st).PrefetchUsed.Load(), "the skipped read served nothing")
	require.Positive(t, w.rd.poolBytes(), "the new buffers wait in the pool")
}

// A consumer that takes the read while the committer makes the buffers
// and cannot serve it (a hit on rows never written) hands it back: the
// committer reads it in order into the buffers it made, and the request
// gets its error from there.
func TestColdBuffersHandedBack(t *testing.T) {
	w := newWorld(t, Options{Prefetch: true, Budget: 1 << 20})
	w.blocks[1] = []int32{3, 4}
	entered, release := holdFresh(t)
	s := w.step([]sched{{1, 4, 1}}, Hit{Index: 0, Tokens: 4, Blocks: []int32{3}}) // block 3: never written
	waitClosed(t, entered, "the committer making the read's buffers")
	handed := (&w.f.st).HandedBack.Load()
	go func() {
		deadline := time.Now().Add(waitBound)
		for (&w.f.st).HandedBack.Load() == handed && time.Now().Before(deadline) {
			time.Sleep(100 * time.Microsecond) // until the consumer handed the read back
		}
		release()
	}()
	w.sized = true
	d, err := w.read(s)
	require.NoError(t, err)
	require.Equal(t, handed+1, (&w.f.st).HandedBack.Load(), "the consumer took the read and handed it back")
	require.ErrorIs(t, d.errs[0], errs.AbsentRequired, "the committer read it and found block 3 absent")
	require.Equal(t, int64(1), (&w.f.st).PrefetchUsed.Load())
	require.Zero(t, w.rd.ReadAheadBytes())
}

// A new buffer from hostmem.Threshold on is faulted in at once and reads
// as zeros, like make's, and is the caller's to write.
func TestFreshBufferIsZeroAndWritable(t *testing.T) {
	for _, n := range []int{100, 3<<20 + 5} {
		p := bufPool{max: 1 << 30, workers: 2}
		b := p.fresh(n)
		require.Len(t, b, n)
		require.Equal(t, make([]byte, n), b)
		for i := range b {
			b[i] = byte(i)
		}
		require.Equal(t, byte(n-1), b[n-1])
	}
}
