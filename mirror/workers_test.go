package mirror

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// WriteSplit and ReadSplit agree with Write and Read row for row, the split
// forced on small copies (split size 1): random slots with repeats (the last
// row wins) and skipped (negative) slots, rows at and above the 512-byte
// floor, and below it (never split), for 1 to 5 goroutines.
func TestSplitMatchesSerial(t *testing.T) {
	for _, rb := range []int{64, 512, 4096, 3 << 10} {
		for _, n := range []int{1, 2, 3, 5} {
			t.Run(fmt.Sprintf("row=%d/workers=%d", rb, n), func(t *testing.T) {
				w := NewWorkers(n, 1)
				defer w.Stop()
				const numSlots = 4096
				got, err := New(numSlots, rb)
				require.NoError(t, err)
				want, err := New(numSlots, rb)
				require.NoError(t, err)
				defer got.Free()
				defer want.Free()
				rng := rand.New(rand.NewPCG(uint64(rb), uint64(n)))
				for round := range 20 {
					rows := 1 + rng.IntN(300)
					slots := make([]int32, rows)
					for i := range slots {
						switch rng.IntN(10) {
						case 0:
							slots[i] = -1
						case 1:
							if i > 0 {
								slots[i] = slots[rng.IntN(i)] // a repeat
								continue
							}
							fallthrough
						default:
							slots[i] = rng.Int32N(numSlots)
						}
					}
					buf := make([]byte, rows*rb)
					for i := range buf {
						buf[i] = byte(rng.Uint32())
					}
					got.WriteSplit(w, slots, buf)
					want.Write(slots, buf)
					require.Equal(t, want.ResidentBytes(), got.ResidentBytes(), "round %d", round)
					a, b := make([]byte, rows*rb), make([]byte, rows*rb)
					for i := range a {
						a[i] = 0xAA // ReadSplit must overwrite every byte
					}
					got.ReadSplit(w, a, slots)
					want.Read(b, slots)
					require.True(t, bytes.Equal(a, b), "round %d: rows differ", round)
				}
				all := make([]int32, numSlots)
				for i := range all {
					all[i] = int32(i)
				}
				a, b := make([]byte, numSlots*rb), make([]byte, numSlots*rb)
				got.Read(a, all)
				want.Read(b, all)
				require.True(t, bytes.Equal(a, b), "mirrors differ")
				if n > 1 && rb >= minSplitRow {
					require.Positive(t, w.Splits())
				}
			})
		}
	}
}

// Several goroutines split reads over one Workers while the writer splits
// writes over it: readers of committed slots see exact rows.
func TestSplitConcurrent(t *testing.T) {
	const numSlots, rb = 2048, 1024
	w := NewWorkers(3, 1)
	defer w.Stop()
	m, err := New(numSlots, rb)
	require.NoError(t, err)
	defer m.Free()
	row := func(s int32, dst []byte) { fillRow(dst, s, 7) }
	var committed atomic.Int32 // slots [0, committed) hold their rows
	var done atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for r := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 2))
			want := make([]byte, rb)
			for !done.Load() {
				n := committed.Load()
				if n == 0 {
					continue
				}
				k := 1 + rng.IntN(64)
				slots := make([]int32, k)
				for i := range slots {
					slots[i] = rng.Int32N(n)
				}
				dst := make([]byte, k*rb)
				m.ReadSplit(w, dst, slots)
				for i, s := range slots {
					row(s, want)
					if !bytes.Equal(dst[i*rb:(i+1)*rb], want) {
						errs <- fmt.Errorf("slot %d: wrong row", s)
						return
					}
				}
			}
		})
	}
	const step = 64
	buf := make([]byte, step*rb)
	slots := make([]int32, step)
	for s0 := int32(0); s0 < numSlots; s0 += step {
		for i := range slots {
			slots[i] = s0 + int32(i)
			row(slots[i], buf[i*rb:(i+1)*rb])
		}
		m.WriteSplit(w, slots, buf)
		committed.Store(s0 + step)
	}
	done.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// After Stop, copies run on their callers; a nil Workers copies serially.
func TestSplitStoppedAndNil(t *testing.T) {
	w := NewWorkers(4, 1)
	w.Stop()
	w.Stop()
	m, err := New(1024, 1024)
	require.NoError(t, err)
	defer m.Free()
	slots := []int32{5, 900, 3, 5}
	buf := make([]byte, len(slots)*1024)
	for i := range buf {
		buf[i] = byte(i / 1024)
	}
	m.WriteSplit(w, slots, buf)
	var nilw *Workers
	dst := make([]byte, len(buf))
	m.ReadSplit(nilw, dst, slots)
	require.Equal(t, byte(3), dst[0]) // slot 5: its last row wins
	require.Equal(t, byte(1), dst[1024])
	m.ReadSplit(w, dst, slots)
	require.Equal(t, byte(2), dst[2*1024])
}

// A split copy allocates nothing in steady state.
func TestSplitNoAllocs(t *testing.T) {
	w := NewWorkers(2, 1)
	defer w.Stop()
	m, err := New(1024, 4096)
	require.NoError(t, err)
	defer m.Free()
	slots := make([]int32, 256)
	for i := range slots {
		slots[i] = int32(i * 3)
	}
	buf := make([]byte, len(slots)*4096)
	m.WriteSplit(w, slots, buf)
	allocs := testing.AllocsPerRun(50, func() {
		m.WriteSplit(w, slots, buf)
		m.ReadSplit(w, buf, slots)
	})
	require.Zero(t, allocs)
}

// Copy is copy, split or not, for every length around the part and split
// sizes, on stopped and nil workers too.
func TestWorkersCopy(t *testing.T) {
	run := func(w *Workers) {
		for _, n := range []int{0, 1, 63, 64, 65, 1000, 4095, 4096, 4097, 100003, 1 << 20} {
			src := make([]byte, n)
			for i := range src {
				src[i] = byte(i*7 + 3)
			}
			dst := make([]byte, n+5)
			for i := range dst {
				dst[i] = 0xee
			}
			w.Copy(dst, src)
			require.Equal(t, src, dst[:n], "n=%d", n)
			for _, b := range dst[n:] {
				require.Equal(t, byte(0xee), b, "n=%d: wrote past the copy", n)
			}
		}
	}
	w := NewWorkers(4, 4096)
	run(w)
	before := w.Splits()
	w.Copy(make([]byte, 1<<20), make([]byte, 1<<20))
	require.Greater(t, w.Splits(), before, "a large copy is split")
	w.Stop()
	run(w)
	run(nil)
}

// WriteSplitPoll calls poll on the calling goroutine between the parts it
// copies itself (the committer issues the next write's device copies from
// there), never from a worker, and writes the rows exactly as Write.
func TestWriteSplitPoll(t *testing.T) {
	const rb = 4096
	w := NewWorkers(4, 1)
	w.Stop() // every part on the caller: the count of polls is exact
	m, err := New(1024, rb)
	require.NoError(t, err)
	defer m.Free()
	slots := make([]int32, 4*partBytes/rb) // four parts
	for i := range slots {
		slots[i] = int32(1023 - i)
	}
	buf := make([]byte, len(slots)*rb)
	for i := range buf {
		buf[i] = byte(i/rb + 1)
	}
	polls := 0 // not atomic: a poll from another goroutine is a race
	m.WriteSplitPoll(w, slots, buf, func() { polls++ })
	require.Equal(t, 3, polls, "between the caller's four parts")
	dst := make([]byte, len(buf))
	m.Read(dst, slots)
	require.Equal(t, buf, dst)

	live := NewWorkers(4, 1) // with workers: polls only on this goroutine (-race checks)
	defer live.Stop()
	for range 20 {
		m.WriteSplitPoll(live, slots, buf, func() { polls++ })
	}
	m.Read(dst, slots)
	require.Equal(t, buf, dst)
}

// A split copy waits for its parts, not for its workers: with every worker
// asleep (here: none started yet, the jobs wait in the channel) the caller
// copies every part and returns. The workers that take the stale jobs up
// later find nothing left, drop them, and the jobs are reused for later
// copies, which are exact.
func TestSplitDoesNotWaitForIdleWorkers(t *testing.T) {
	const n = 4
	w := &Workers{n: n, splitB: 1, partB: 1, jobs: make(chan *job, 4*(n-1))}
	m, err := New(1024, 4096)
	require.NoError(t, err)
	defer m.Free()
	rows := make([]byte, 64*4096)
	slots := make([]int32, 64)
	for i := range slots {
		slots[i] = int32(3 * i)
	}
	for i := range rows {
		rows[i] = byte(i / 4096 * 7)
	}
	done := make(chan struct{})
	go func() {
		m.WriteSplit(w, slots, rows) // would wait forever for the sleeping workers
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second): // a deadlock guard, not a timing
		t.Fatal("the split write waits for workers that never wake")
	}
	require.Equal(t, n-1, len(w.jobs), "the job was handed to every worker")
	got := make([]byte, len(rows))
	m.Read(got, slots)
	require.Equal(t, rows, got)
	// The workers wake: the stale job is dropped by each and reused.
	w.running.Add(n - 1)
	for i := 1; i < n; i++ {
		go w.loop()
	}
	defer w.Stop()
	for len(w.jobs) > 0 { // drained
		runtime.Gosched()
	}
	for i := range rows {
		rows[i] = byte(i/4096*5 + 1)
	}
	for range 50 {
		m.WriteSplit(w, slots, rows)
		clear(got)
		m.ReadSplit(w, got, slots)
		require.Equal(t, rows, got)
	}
}
