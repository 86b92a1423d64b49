package main

import (
	"errors"
	"runtime"
	"testing"
	"weak"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/tier"
)

// TestCloseFreesTheCache: once a handle is closed, nothing of its cache
// stays reachable from the handle table (the cache, its block tables, the
// tier and its store's value pools are garbage), while the handle still
// answers ErrClosed, a second close returns nil, and the slot is reused.
func TestCloseFreesTheCache(t *testing.T) {
	const bs = 16
	keys := []omnicache.Key{{Name: "h", RowBytes: 64}}
	back, err := tier.NewEmbedded(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := tier.New(back, tier.Namespace{Model: "m", BlockSize: bs, Keys: []tier.Key{{Name: "h", RowBytes: 64}}}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := omnicache.New(omnicache.Config{NumBlocks: 1 << 16, BlockSize: bs, Keys: keys, Tier: &omnicache.TierConfig{Tier: tr}})
	if err != nil {
		t.Fatal(err)
	}
	e := &entry{c: c, keys: keys, tier: tr, back: back}
	e.outs.Tensors = make([]omnicache.Tensor, 1)
	if err := register(e); err != nil {
		t.Fatal(err)
	}
	h := e.h
	// Use it: a step over every block of a request, published to the tier.
	p := &omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{4 * bs}, Table: []int32{0, 1, 2, 3}, Stride: 4,
		Arrivals: []int64{1}, HitTokens: []int32{0}, FullBlocks: []int32{0, 1, 2, 3}, FullHashes: []uint64{11, 12, 13, 14}}
	if err := c.Begin(p); err != nil {
		t.Fatal(err)
	}
	id, err := c.Save(&omnicache.Outputs{Tokens: 4 * bs, Tensors: []omnicache.Tensor{{Host: make([]byte, 4*bs*64), Rows: 4 * bs}}})
	if err != nil {
		t.Fatal(err)
	}
	var res omnicache.Result
	if err := c.Materialize(id, nil, &res); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(); err != nil {
		t.Fatal(err)
	}
	wc, we, wb := weak.Make(c), weak.Make(e), weak.Make(back)
	c, e, tr, back, p, res = nil, nil, nil, nil, nil, omnicache.Result{}

	if err := closeHandle(h); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4 && (wc.Value() != nil || we.Value() != nil || wb.Value() != nil); i++ {
		runtime.GC()
	}
	if wc.Value() != nil || we.Value() != nil || wb.Value() != nil {
		t.Fatalf("after close: cache reachable %v, entry %v, tier store %v", wc.Value() != nil, we.Value() != nil, wb.Value() != nil)
	}
	if _, err := lookup(h); !errors.Is(err, omnicache.ErrClosed) {
		t.Fatalf("a closed handle: %v, want ErrClosed", err)
	}
	if err := closeHandle(h); err != nil {
		t.Fatalf("a second close: %v", err)
	}
	// The slot is reused: a new cache gets a handle of its own.
	c2, err := omnicache.New(omnicache.Config{NumBlocks: 4, BlockSize: bs, Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	e2 := &entry{c: c2, keys: keys}
	tableMu.Lock()
	nextIdx = int(h & (1<<tableBits - 1)) // register tries this slot first
	tableMu.Unlock()
	if err := register(e2); err != nil {
		t.Fatal(err)
	}
	if e2.h == h || e2.h&(1<<tableBits-1) != h&(1<<tableBits-1) {
		t.Fatalf("handle %#x, closed %#x: the slot was not reused", e2.h, h)
	}
	if _, err := lookup(h); !errors.Is(err, errBadHandle) {
		t.Fatalf("the closed handle once its slot was reused: %v, want errBadHandle", err)
	}
	if err := closeHandle(e2.h); err != nil {
		t.Fatal(err)
	}
}
