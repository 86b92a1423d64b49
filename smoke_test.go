package omnicache

import (
	"bytes"
	"testing"
)

func rowOf(key, req, pos, rb int) []byte {
	b := make([]byte, rb)
	for i := range b {
		b[i] = byte(key*31 + req*7 + pos*3 + i)
	}
	return b
}

func TestSmokeHitMerge(t *testing.T) {
	for _, buffer := range []bool{true, false} {
		c, err := New(Config{NumBlocks: 16, BlockSize: 4, Keys: []Key{{Name: "h", RowBytes: 8}, {Name: "o", RowBytes: 16, Optional: true}, {Name: "d", RowBytes: 8, Deferred: true}}, DisableDecodeBuffer: !buffer})
		if err != nil {
			t.Fatal(err)
		}
		table := []int32{0, 1, 2, 3, 0, 1, 5, 6}
		rbs := []int{8, 16, 8}
		outs := func(req int, start, n int) *Outputs {
			o := &Outputs{Tokens: n}
			for k, rb := range rbs {
				var buf []byte
				for p := start; p < start+n; p++ {
					buf = append(buf, rowOf(k, req, p, rb)...)
				}
				o.Tensors = append(o.Tensors, Tensor{Host: buf, Rows: n})
			}
			return o
		}
		// A prefills 8 tokens.
		if err := c.Begin(&Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{8}, Table: table, Stride: 4, Arrivals: []int64{1}, HitTokens: []int32{0}}); err != nil {
			t.Fatal(err)
		}
		id, err := c.Save(outs(1, 0, 8))
		if err != nil {
			t.Fatal(err)
		}
		// three decode steps
		for s := 8; s < 11; s++ {
			if err := c.Begin(&Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{int32(s)}, Count: []int32{1}, Table: table, Stride: 4}); err != nil {
				t.Fatal(err)
			}
			if err := c.Discard(id); err != nil {
				t.Fatal(err)
			}
			if id, err = c.Save(outs(1, s, 1)); err != nil {
				t.Fatal(err)
			}
		}
		var res Result
		if err := c.Materialize(id, nil, &res); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(res.Rows(0, 0), rowOf(0, 1, 10, 8)) {
			t.Fatalf("buffered step rows wrong")
		}
		// A finishes; B arrives hitting blocks 0,1 (8 tokens) and computes 4 more into block 5.
		if err := c.Begin(&Plan{IDs: []int64{2}, Rows: []int32{1}, Start: []int32{8}, Count: []int32{4}, Table: table, Stride: 4, Arrivals: []int64{2}, HitTokens: []int32{8}, HitBlocks: []int32{0, 1}, Finished: []int64{1}}); err != nil {
			t.Fatal(err)
		}
		id, err = c.Save(outs(2, 8, 4))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Materialize(id, []int64{2}, &res); err != nil {
			t.Fatal(err)
		}
		if res.Tokens(0) != 12 || res.Prefix(0) != 8 {
			t.Fatalf("tokens %d prefix %d", res.Tokens(0), res.Prefix(0))
		}
		for k, rb := range rbs {
			got := res.Rows(0, k)
			for p := 0; p < 12; p++ {
				req := 1
				if p >= 8 {
					req = 2
				}
				if !bytes.Equal(got[p*rb:(p+1)*rb], rowOf(k, req, p, rb)) {
					t.Fatalf("buffer=%v key %d pos %d: got %v want %v", buffer, k, p, got[p*rb:(p+1)*rb], rowOf(k, req, p, rb))
				}
			}
		}
		if err := c.Sync(); err != nil {
			t.Fatal(err)
		}
		st := c.Stats()
		t.Logf("buffer=%v stats %+v", buffer, st)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if st := c.Stats(); st.PagesInUse != 0 || st.BudgetCharged != 0 {
			t.Fatalf("leak after close: %+v", st)
		}
	}
}
