package omnicache_test

import (
	"bytes"
	"testing"

	"github.com/omnicache/omnicache"
)

// TestFinishedRearrivesAtItsPosition: a request that finishes and arrives
// again under the same id, at the same batch position, is a new request
// (Begin looks it up again rather than keeping the position's handle from
// the step before): its hit is served, then its own rows.
func TestFinishedRearrivesAtItsPosition(t *testing.T) {
	const bs, rb, stride = 4, 8, 4
	c, err := omnicache.New(omnicache.Config{NumBlocks: 16, BlockSize: bs, Keys: []omnicache.Key{{Name: "hidden", RowBytes: rb}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	table := []int32{0, 1, 0, 0, 4, 5, 0, 0, 8, 9, 0, 0} // requests 1, 2, 3: blocks 0-1, 4-5, 8-9
	rows := func(tag byte, n int) []byte {
		b := make([]byte, n*rb)
		for t := 0; t < n; t++ {
			for j := 0; j < rb; j++ {
				b[t*rb+j] = tag + byte(t)
			}
		}
		return b
	}
	var res omnicache.Result
	step := func(p *omnicache.Plan, out []byte, n int, read []int64) []byte {
		t.Helper()
		if err := c.Begin(p); err != nil {
			t.Fatal(err)
		}
		sid, err := c.Save(&omnicache.Outputs{Tokens: n, Padded: n, Tensors: []omnicache.Tensor{{Host: out, Rows: n}}})
		if err != nil {
			t.Fatal(err)
		}
		if read == nil {
			if err := c.Discard(sid); err != nil {
				t.Fatal(err)
			}
			return nil
		}
		if err := c.Materialize(sid, read, &res); err != nil {
			t.Fatal(err)
		}
		return append([]byte(nil), res.Rows(0, 0)...)
	}
	// Both prefill 4 tokens (a full block each), then decode one.
	pre := append(rows(10, 4), rows(50, 4)...)
	step(&omnicache.Plan{IDs: []int64{1, 2}, Rows: []int32{0, 1}, Start: []int32{0, 0}, Count: []int32{4, 4},
		Table: table, Stride: stride, Arrivals: []int64{1, 2}, HitTokens: []int32{0, 0}}, pre, 8, nil)
	step(&omnicache.Plan{IDs: []int64{1, 2}, Rows: []int32{0, 1}, Start: []int32{4, 4}, Count: []int32{1, 1},
		Table: table, Stride: stride}, append(rows(14, 1), rows(54, 1)...), 2, nil)
	// Request 2 finishes and arrives again at position 1 with a hit on its
	// first block; it computes token 4 anew. Request 3 arrives first (and
	// may be given the handle request 2 had).
	got := step(&omnicache.Plan{IDs: []int64{1, 2, 3}, Rows: []int32{0, 1, 2}, Start: []int32{5, 4, 0}, Count: []int32{1, 1, 1},
		Table: table, Stride: stride, Finished: []int64{2}, Arrivals: []int64{3, 2}, HitTokens: []int32{0, 4}, HitBlocks: []int32{4}},
		append(append(rows(15, 1), rows(90, 1)...), rows(120, 1)...), 3, []int64{2})
	want := append(rows(50, 4), rows(90, 1)...)
	if !bytes.Equal(got, want) {
		t.Fatalf("request 2 after it arrived again: %v, want its hit block's rows then its own: %v", got, want)
	}
}
