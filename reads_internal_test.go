package omnicache

import "testing"

// Every prefetched hit read a step queues is counted until the committer
// ran it (writer.Path.ReadsQueued, which turns a staging claim's spin off):
// back to zero once the queue drained, whether Materialize read the rows
// itself before the committer got there or the committer read them first.
func TestReadsQueuedBalance(t *testing.T) {
	for _, syncFirst := range []bool{false, true} {
		c, err := New(Config{NumBlocks: 16, BlockSize: 4, Keys: []Key{{Name: "h", RowBytes: 8}}})
		if err != nil {
			t.Fatal(err)
		}
		table := []int32{0, 1, 2, 3, 0, 1, 5, 6}
		outs := func(req, start, n int) *Outputs {
			var buf []byte
			for p := start; p < start+n; p++ {
				buf = append(buf, rowOf(0, req, p, 8)...)
			}
			return &Outputs{Tokens: n, Tensors: []Tensor{{Host: buf, Rows: n}}}
		}
		if err := c.Begin(&Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{8}, Table: table, Stride: 4, Arrivals: []int64{1}, HitTokens: []int32{0}}); err != nil {
			t.Fatal(err)
		}
		id, err := c.Save(outs(1, 0, 8))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Discard(id); err != nil {
			t.Fatal(err)
		}
		if err := c.Sync(); err != nil {
			t.Fatal(err)
		}
		if n := c.path.ReadsQueued(); n != 0 {
			t.Fatalf("no hit yet: %d reads queued", n)
		}
		if err := c.Begin(&Plan{IDs: []int64{2}, Rows: []int32{1}, Start: []int32{8}, Count: []int32{4}, Table: table, Stride: 4, Arrivals: []int64{2}, HitTokens: []int32{8}, HitBlocks: []int32{0, 1}, Finished: []int64{1}}); err != nil {
			t.Fatal(err)
		}
		if n := c.path.ReadsQueued(); n < 0 || n > 1 { // the committer may have run it already
			t.Fatalf("one hit read: %d queued", n)
		}
		id, err = c.Save(outs(2, 8, 4))
		if err != nil {
			t.Fatal(err)
		}
		if syncFirst {
			if err := c.Sync(); err != nil {
				t.Fatal(err)
			}
			if n := c.path.ReadsQueued(); n != 0 {
				t.Fatalf("after Sync, before Materialize: %d reads queued", n)
			}
		}
		var res Result
		if err := c.Materialize(id, []int64{2}, &res); err != nil {
			t.Fatal(err)
		}
		if res.Prefix(0) != 8 || string(res.Rows(0, 0)[:8]) != string(rowOf(0, 1, 0, 8)) {
			t.Fatalf("hit rows wrong (prefix %d)", res.Prefix(0))
		}
		if err := c.Sync(); err != nil {
			t.Fatal(err)
		}
		if n := c.path.ReadsQueued(); n != 0 {
			t.Fatalf("syncFirst=%v: %d reads queued after Sync", syncFirst, n)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
