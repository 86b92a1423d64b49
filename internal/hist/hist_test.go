package hist

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBuckets(t *testing.T) {
	h := New(1000, 4) // bounds 1000, 2000, 4000, 8000
	for _, c := range []struct {
		v int64
		b int
	}{{-5, 0}, {0, 0}, {1000, 0}, {1001, 1}, {2000, 1}, {2001, 2}, {4000, 2}, {4001, 3}, {8000, 3}, {8001, 4}, {1 << 62, 4}} {
		require.Equal(t, c.b, h.Bucket(max(c.v, 0)), "value %d", c.v)
	}
	for _, v := range []int64{1, 1500, 1500, 9000} {
		h.Observe(v)
	}
	s := h.Snapshot()
	require.Equal(t, []int64{1000, 2000, 4000, 8000}, s.Bounds)
	require.Equal(t, []uint64{1, 2, 0, 0}, s.Counts)
	require.Equal(t, uint64(1), s.Inf)
	require.Equal(t, uint64(4), s.Count)
	require.Equal(t, int64(12001), s.Sum)
}

func TestNilAndLayouts(t *testing.T) {
	var h *H
	h.Observe(3)
	require.Zero(t, h.Snapshot().Count)
	d := NewDur().Snapshot()
	require.Equal(t, int64(1000), d.Bounds[0])
	require.Greater(t, d.Bounds[len(d.Bounds)-1], int64(8e9))
	s := NewSize().Snapshot()
	require.Equal(t, int64(1<<30), s.Bounds[len(s.Bounds)-1])
	require.Panics(t, func() { New(0, 3) })
	require.Panics(t, func() { New(1, MaxBuckets+1) })
}

func TestConcurrent(t *testing.T) {
	h := NewDur()
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				h.Observe(int64(i) * 1000)
			}
		}()
	}
	wg.Wait()
	s := h.Snapshot()
	require.Equal(t, uint64(4000), s.Count)
	require.Equal(t, int64(4*999*1000*1000/2), s.Sum)
}

func BenchmarkObserve(b *testing.B) {
	h := NewDur()
	for i := 0; i < b.N; i++ {
		h.Observe(int64(i & 0xfffff))
	}
}
