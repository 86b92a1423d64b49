package omnicache_test

import (
	"bytes"
	"sync"
	"testing"
	"unsafe"

	"github.com/omnicache/omnicache"
	"github.com/stretchr/testify/require"
)

// Owned host tensors come back through Config.ReleaseHost exactly once, and
// only when the cache no longer needs them: an engine that recycles them at
// once still gets the right rows from Materialize and in the mirror.
func TestReleaseHostRecycling(t *testing.T) {
	const bs, reqs, rb = 4, 4, 16
	const blocksPer = 8
	var mu sync.Mutex
	var free [][]byte
	out := map[unsafe.Pointer]bool{} // handed to the cache, not back yet
	release := func(b []byte) {
		mu.Lock()
		defer mu.Unlock()
		p := unsafe.Pointer(unsafe.SliceData(b))
		require.True(t, out[p], "a buffer came back that the cache did not hold (or came back twice)")
		delete(out, p)
		// Recycle at once, scribbling over it as an engine's next forward would.
		for i := range b {
			b[i] = 0xEE
		}
		free = append(free, b[:cap(b)])
	}
	get := func(n int) []byte {
		mu.Lock()
		defer mu.Unlock()
		var b []byte
		if k := len(free); k > 0 && cap(free[k-1]) >= n*rb {
			b, free = free[k-1][:n*rb], free[:k-1]
		} else {
			b = make([]byte, n*rb, reqs*blocksPer*bs*rb)
		}
		out[unsafe.Pointer(unsafe.SliceData(b))] = true
		return b
	}
	row := func(req, pos int) []byte {
		r := make([]byte, rb)
		for i := range r {
			r[i] = byte(req*31 + pos*7 + i)
		}
		return r
	}
	for _, buffer := range []bool{true, false} {
		c, err := omnicache.New(omnicache.Config{NumBlocks: reqs * blocksPer, BlockSize: bs,
			Keys:                []omnicache.Key{{Name: "hidden", RowBytes: rb}},
			DisableDecodeBuffer: !buffer, ReleaseHost: release})
		require.NoError(t, err)
		table := make([]int32, reqs*blocksPer)
		for i := range table {
			table[i] = int32(i)
		}
		plan := omnicache.Plan{Table: table, Stride: blocksPer}
		for r := 0; r < reqs; r++ {
			plan.IDs = append(plan.IDs, int64(r))
			plan.Rows = append(plan.Rows, int32(r))
			plan.Start = append(plan.Start, 0)
			plan.Count = append(plan.Count, 5)
			plan.Arrivals = append(plan.Arrivals, int64(r))
			plan.HitTokens = append(plan.HitTokens, 0)
		}
		var res omnicache.Result
		var prev omnicache.StepID
		var prevStart []int32
		prevCount := []int32(nil)
		for step := 0; plan.Start[0]+plan.Count[0] <= blocksPer*bs; step++ {
			require.NoError(t, c.Begin(&plan))
			n := 0
			for _, cnt := range plan.Count {
				n += int(cnt)
			}
			b := get(n)
			off := 0
			for r := range plan.IDs {
				for p := plan.Start[r]; p < plan.Start[r]+plan.Count[r]; p++ {
					copy(b[off*rb:], row(r, int(p)))
					off++
				}
			}
			id, err := c.Save(&omnicache.Outputs{Tokens: n, Tensors: []omnicache.Tensor{{Host: b, Rows: n, Owned: true}}})
			require.NoError(t, err)
			if prev != 0 {
				require.NoError(t, c.Materialize(prev, nil, &res))
				for r := 0; r < res.Len(); r++ {
					got := res.Rows(r, 0)
					for i := 0; i < int(prevCount[r]); i++ {
						require.True(t, bytes.Equal(got[i*rb:(i+1)*rb], row(r, int(prevStart[r])+i)),
							"buffer=%v step %d request %d row %d", buffer, step-1, r, i)
					}
				}
			}
			prev = id
			prevStart = append(prevStart[:0], plan.Start...)
			prevCount = append(prevCount[:0], plan.Count...)
			plan.Arrivals, plan.HitTokens = nil, nil
			for r := range plan.Start {
				plan.Start[r] += plan.Count[r]
				plan.Count[r] = 1
			}
		}
		require.NoError(t, c.Discard(prev))
		require.NoError(t, c.Sync())
		got := make([]byte, rb)
		for r := 0; r < reqs; r++ {
			for p := 0; p < int(plan.Start[r]); p++ {
				require.NoError(t, c.Peek(0, []int32{table[r*blocksPer+p/bs]*bs + int32(p%bs)}, got))
				require.True(t, bytes.Equal(got, row(r, p)), "buffer=%v mirror request %d position %d", buffer, r, p)
			}
		}
		require.NoError(t, c.Close())
		mu.Lock()
		require.Empty(t, out, "buffer=%v: owned buffers the cache never handed back", buffer)
		mu.Unlock()
	}
}
