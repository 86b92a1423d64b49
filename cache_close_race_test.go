package omnicache_test

import (
	"errors"
	"runtime"
	"sync"
	"testing"

	"github.com/omnicache/omnicache"
)

// TestCloseDuringDecodeSteps races Close against an engine goroutine in
// steady decode (steps parked by the decode buffer, whose Begin stays off
// the call gate), a change of batch, and a finish. Every call either
// succeeds or returns ErrClosed; under -race no read of the write path's
// state by Begin may race with Close releasing it.
func TestCloseDuringDecodeSteps(t *testing.T) {
	const bs, rb = 4, 8
	iters := 60
	if testing.Short() {
		iters = 10
	}
	for it := range iters {
		c, err := omnicache.New(omnicache.Config{NumBlocks: 64, BlockSize: bs, Keys: []omnicache.Key{{Name: "h", RowBytes: rb}}})
		if err != nil {
			t.Fatal(err)
		}
		table := make([]int32, 4*16)
		for i := range table {
			table[i] = int32(i)
		}
		host := make([]byte, 64*rb)
		var wg sync.WaitGroup
		wg.Add(1)
		var engineErr error
		go func() { // the engine goroutine
			defer wg.Done()
			fail := func(what string, err error) bool {
				if err == nil {
					return false
				}
				if !errors.Is(err, omnicache.ErrClosed) {
					engineErr = errors.Join(errors.New(what), err)
				}
				return true
			}
			ids := []int64{1, 2}
			p := &omnicache.Plan{IDs: ids, Rows: []int32{0, 1}, Start: []int32{0, 0}, Count: []int32{4, 4},
				Table: table, Stride: 16, Arrivals: ids, HitTokens: []int32{0, 0}}
			for pos := int32(0); pos < 40; pos++ {
				if fail("Begin", c.Begin(p)) {
					return
				}
				n := 0
				for _, k := range p.Count {
					n += int(k)
				}
				id, err := c.Save(&omnicache.Outputs{Tokens: n, Padded: n, Tensors: []omnicache.Tensor{{Host: host[:n*rb], Rows: n}}})
				if fail("Save", err) {
					return
				}
				if fail("Discard", c.Discard(id)) {
					return
				}
				// Decode steps from here on; every tenth one changes the
				// batch (one request finishes, then the other decodes on).
				start := p.Start[0] + p.Count[0]
				p = &omnicache.Plan{IDs: ids, Rows: []int32{0, 1}[:len(ids)], Start: []int32{start, start}[:len(ids)],
					Count: []int32{1, 1}[:len(ids)], Table: table, Stride: 16}
				if pos == 20 {
					ids = []int64{2}
					p = &omnicache.Plan{IDs: ids, Rows: []int32{1}, Start: []int32{start}, Count: []int32{1},
						Table: table, Stride: 16, Finished: []int64{1}}
				}
			}
		}()
		for range it % 16 {
			runtime.Gosched()
		}
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		wg.Wait()
		if engineErr != nil {
			t.Fatalf("iteration %d: %v", it, engineErr)
		}
	}
}
