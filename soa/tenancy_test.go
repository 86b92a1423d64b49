package soa

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTenancy(t *testing.T) {
	for _, bs := range []int{1, 3, 4, 16} {
		tn := must(NewTenancy(10, bs))
		n := int32(10 * bs)
		for s := int32(0); s < n; s++ {
			require.False(t, tn.Written(s))
			require.Zero(t, tn.Owner(s))
		}
		tn.Publish([]int32{0, -1, int32(bs)}, []int32{0, -1, int32(bs)}, 5)
		require.True(t, tn.Written(0))
		require.True(t, tn.Written(int32(bs)))
		if bs > 1 {
			require.False(t, tn.Written(1), "bs=%d", bs)
			require.Equal(t, uint64(5), tn.Owner(1), "the block's owner covers its slots")
		}
		require.Equal(t, uint64(5), tn.Owner(int32(bs)))
		require.Zero(t, tn.Owner(int32(2*bs)))
		tn.Publish([]int32{int32(bs)}, []int32{int32(bs)}, 9)
		require.Equal(t, uint64(9), tn.Owner(int32(bs)))
		require.Equal(t, uint64(5), tn.Owner(0))
		// Write 11 skips slot bs (a newer write replaces it): the slot turns
		// stale, its block's owner stays 9; write 12 puts its row there and
		// clears it. A skipped slot never written before is stale, not
		// written.
		s2 := int32(2 * bs)
		tn.Publish([]int32{int32(bs), s2}, []int32{-1, -1}, 11)
		require.True(t, tn.Stale(int32(bs)))
		require.True(t, tn.Stale(s2))
		require.False(t, tn.Written(s2))
		require.Equal(t, uint64(9), tn.Owner(int32(bs)), "a skipped slot does not change its block's owner")
		require.Zero(t, tn.Owner(s2))
		require.False(t, tn.Stale(0))
		tn.Publish([]int32{int32(bs)}, []int32{int32(bs)}, 12)
		require.False(t, tn.Stale(int32(bs)))
		require.Equal(t, uint64(12), tn.Owner(int32(bs)))
		require.True(t, tn.Stale(s2))
		tn.Free()
	}
}

// TestTenancyModel checks Publish, fast path (nothing stale, nothing
// skipped) and slow path alike, against a plain model of the three
// columns over random writes, including slots repeated within one write.
func TestTenancyModel(t *testing.T) {
	const nb, bs = 8, 4
	rng := rand.New(rand.NewPCG(1, 2))
	tn := must(NewTenancy(nb, bs))
	defer tn.Free()
	owner := make([]uint64, nb)
	written := make([]bool, nb*bs)
	stale := make([]bool, nb*bs)
	for id := uint64(1); id < 3000; id++ {
		sl := make([]int32, rng.IntN(6))
		for i := range sl {
			sl[i] = int32(rng.IntN(nb*bs+1)) - 1 // -1: an unused entry
		}
		mask := sl
		if rng.IntN(3) == 0 { // some rows skipped
			mask = make([]int32, len(sl))
			for i, s := range sl {
				mask[i] = s
				if rng.IntN(2) == 0 {
					mask[i] = -1
				}
			}
		}
		tn.Publish(sl, mask, id)
		for i, s := range sl {
			switch {
			case s < 0:
			case mask[i] < 0:
				stale[s] = true
			default:
				owner[int(s)/bs] = id
				written[s] = true
				stale[s] = false
			}
		}
		n := 0
		for s := int32(0); s < nb*bs; s++ {
			require.Equal(t, owner[int(s)/bs], tn.Owner(s), "write %d slot %d", id, s)
			require.Equal(t, written[s], tn.Written(s), "write %d slot %d", id, s)
			require.Equal(t, stale[s], tn.Stale(s), "write %d slot %d", id, s)
			if stale[s] {
				n++
			}
		}
		require.Equal(t, n, tn.nstale, "write %d", id)
	}
}

func TestTenancyConcurrentReaders(t *testing.T) {
	tn := must(NewTenancy(64, 16))
	defer tn.Free()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last uint64
			for {
				select {
				case <-stop:
					return
				default:
				}
				o := tn.Owner(17)
				if o < last {
					t.Errorf("owner went back from %d to %d", last, o)
					return
				}
				last = o
				_ = tn.Written(17)
			}
		}()
	}
	sl := make([]int32, 64)
	for id := uint64(1); id < 2000; id++ {
		for i := range sl {
			sl[i] = int32((int(id)*7 + i*16) % (64 * 16))
		}
		tn.Publish(sl, sl, id)
	}
	close(stop)
	wg.Wait()
}

func TestTenancyPublishAllocs(t *testing.T) {
	tn := must(NewTenancy(64, 16))
	defer tn.Free()
	sl := []int32{1, 17, 33, 1000}
	id := uint64(0)
	require.Zero(t, testing.AllocsPerRun(100, func() { id++; tn.Publish(sl, sl, id) }))
}

func BenchmarkTenancy(b *testing.B) {
	const blocks, bs = 1 << 16, 16
	tn := must(NewTenancy(blocks, bs))
	defer tn.Free()
	sl := make([]int32, 1024)
	for i := range sl {
		sl[i] = int32((i*7919)%blocks)*bs + int32(i%bs) // a decode-like spread over blocks
	}
	b.Run("op=publish/slots=1024", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			tn.Publish(sl, sl, uint64(i+1))
		}
	})
	b.Run("op=owner/slots=1024", func(b *testing.B) {
		b.ReportAllocs()
		var sum uint64
		for i := 0; i < b.N; i++ {
			for _, s := range sl {
				sum += tn.Owner(s)
			}
		}
		_ = sum
	})
}

// TestTenancyAbsent checks the absent columns against a plain model over
// random writes that omit or supply each key, with skipped slots: only
// optional keys have a column, a skipped slot keeps its bit, and the
// counter that lets ClearAbsent return at once stays exact.
func TestTenancyAbsent(t *testing.T) {
	const nb, bs, nkeys = 6, 4, 3
	optional := []bool{false, true, true}
	rng := rand.New(rand.NewPCG(3, 4))
	tn := must(NewTenancy(nb, bs, optional...))
	defer tn.Free()
	absent := make([][]bool, nkeys)
	for k := range absent {
		absent[k] = make([]bool, nb*bs)
	}
	require.Panics(t, func() { tn.SetAbsent(0, []int32{0}) }, "a required key cannot be recorded absent")
	tn.ClearAbsent(0, []int32{0}) // a required key: nothing to clear
	for i := 0; i < 2000; i++ {
		n := 1 + rng.IntN(6)
		mask := make([]int32, n)
		for j := range mask {
			mask[j] = int32(rng.IntN(nb * bs))
			if rng.IntN(4) == 0 {
				mask[j] = -1 // skipped
			}
		}
		for k := 1; k < nkeys; k++ {
			omit := rng.IntN(3) == 0
			if omit {
				tn.SetAbsent(k, mask)
			} else {
				tn.ClearAbsent(k, mask)
			}
			for _, s := range mask {
				if s >= 0 {
					absent[k][s] = omit
				}
			}
		}
		for k := 0; k < nkeys; k++ {
			set := 0
			for s := int32(0); s < nb*bs; s++ {
				require.Equal(t, absent[k][s], tn.Absent(k, s), "write %d key %d slot %d", i, k, s)
				if absent[k][s] {
					set++
				}
			}
			require.Equal(t, set, tn.nabsent[k], "write %d key %d: bits counted", i, k)
		}
	}
	require.False(t, tn.Absent(5, 0), "a key past the table has no column")
}

// RunEnd against a slot-by-slot scan: runs of every length around the
// four-slot stride, block sizes a power of two and not, slots outside the
// block on either side.
func TestRunEnd(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	for _, bs := range []int{1, 3, 4, 16, 100} {
		for it := 0; it < 2000; it++ {
			sl := make([]int32, rng.IntN(24))
			for i := range sl {
				sl[i] = int32(rng.IntN(4 * bs))
				if i > 0 && rng.IntN(4) > 0 {
					sl[i] = sl[i-1] + 1 // mostly runs
				}
			}
			lo := int32(rng.IntN(3) * bs)
			i := 0
			if len(sl) > 0 {
				i = rng.IntN(len(sl) + 1)
			}
			want := i
			for want < len(sl) && sl[want] >= lo && sl[want] < lo+int32(bs) {
				want++
			}
			if got := RunEnd(sl, i, lo, bs); got != want {
				t.Fatalf("bs %d: RunEnd(%v, %d, %d) = %d, want %d", bs, sl, i, lo, got, want)
			}
		}
	}
}
