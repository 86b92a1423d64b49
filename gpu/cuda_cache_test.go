//go:build cuda

package gpu_test

// The real cache on the CUDA device, end to end: device output tensors
// (cloned, or owned), prefill and pure-decode steps through the decode
// buffer, Materialize a step late from another goroutine, a hit that reads
// back the rows written (immediate keys and a deferred key), deferred rows
// landing at finish. The root package imports gpu; this external test
// package may import the root package.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
)

const (
	e2eBlock  = 16
	e2eBlocks = 64
	e2eStride = 8
)

var e2eKeys = []omnicache.Key{
	{Name: "hidden", RowBytes: 256},
	{Name: "aux", RowBytes: 64, Optional: true},
	{Name: "codes", RowBytes: 48, Deferred: true},
}

// rowOf is the content of (key, request, position): a tag, then a stream.
func rowOf(k int, req int64, pos, rb int) []byte {
	b := make([]byte, rb)
	x := uint64(k+1)<<56 ^ uint64(req)<<32 ^ uint64(pos)
	for i := 0; i < rb; i += 8 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(b[i:], z^z>>31)
	}
	copy(b, fmt.Sprintf("k%dr%dp%d;", k, req, pos))
	return b
}

type e2eEngine struct {
	t      *testing.T
	d      *gpu.CUDA
	c      *omnicache.Cache
	owned  bool
	table  []int32
	engBuf []gpu.Buffer // non-owned mode: the engine's reused output buffers
}

// batch is one step: request ids, first positions and counts.
type batch struct {
	ids   []int64
	start []int32
	count []int32
}

// outputs uploads the step's rows to device tensors.
func (e *e2eEngine) outputs(b batch) *omnicache.Outputs {
	n := 0
	for _, c := range b.count {
		n += int(c)
	}
	o := &omnicache.Outputs{Tokens: n}
	for k, key := range e2eKeys {
		var host []byte
		for i, id := range b.ids {
			for p := b.start[i]; p < b.start[i]+b.count[i]; p++ {
				host = append(host, rowOf(k, id, int(p), key.RowBytes)...)
			}
		}
		t := omnicache.Tensor{Rows: n}
		// Owned immediate tensors are handed over (the cache frees them);
		// deferred ones stay engine buffers (the cache clones them).
		if e.owned && !key.Deferred {
			buf, err := e.d.Alloc(max(len(host), 1))
			must(e.t, err)
			t.Dev, t.Owned = buf, true
		} else {
			t.Dev = e.engBuf[k]
		}
		must(e.t, e.d.CopyHtoD(t.Dev, 0, host))
		o.Tensors = append(o.Tensors, t)
	}
	return o
}

// scribble overwrites the engine's reused buffers, as the next forward
// would: the cache must have cloned what it keeps.
func (e *e2eEngine) scribble() {
	for _, b := range e.engBuf {
		must(e.t, e.d.CopyHtoD(b, 0, bytes.Repeat([]byte{0xEE}, b.Size)))
	}
}

// hit describes the expected prefix of a request: hitReq's rows 0..n-1.
type hit struct {
	req int64
	n   int
}

func (e *e2eEngine) check(res *omnicache.Result, b batch, hits map[int64]hit) error {
	if res.Len() != len(b.ids) {
		return fmt.Errorf("%d requests in the result, want %d", res.Len(), len(b.ids))
	}
	for i, id := range b.ids {
		h := hits[id]
		if res.ID(i) != id || res.Prefix(i) != h.n || res.Tokens(i) != h.n+int(b.count[i]) {
			return fmt.Errorf("request %d: id %d prefix %d tokens %d, want prefix %d tokens %d",
				id, res.ID(i), res.Prefix(i), res.Tokens(i), h.n, h.n+int(b.count[i]))
		}
		for k, key := range e2eKeys {
			rb := key.RowBytes
			got := res.Rows(i, k)
			for p := 0; p < res.Tokens(i); p++ {
				want := rowOf(k, h.req, p, rb)
				if p >= h.n {
					want = rowOf(k, id, int(b.start[i])+p-h.n, rb)
				}
				if g := got[p*rb : (p+1)*rb]; !bytes.Equal(g, want) {
					return fmt.Errorf("request %d key %s row %d: got %q..., want %q...", id, key.Name, p, g[:12], want[:12])
				}
			}
		}
	}
	return nil
}

// slotsOf maps positions [0,n) of table row r to slots.
func (e *e2eEngine) slotsOf(r, n int) []int32 {
	s := make([]int32, n)
	for p := range s {
		s[p] = e.table[r*e2eStride+p/e2eBlock]*e2eBlock + int32(p%e2eBlock)
	}
	return s
}

// peekEqual checks the committed mirror rows of key k at request req's
// slots (table row r, positions [0,n)).
func (e *e2eEngine) peekEqual(k int, req int64, r, n int, want bool) {
	e.t.Helper()
	rb := e2eKeys[k].RowBytes
	got := make([]byte, n*rb)
	must(e.t, e.c.Peek(k, e.slotsOf(r, n), got))
	for p := 0; p < n; p++ {
		g := got[p*rb : (p+1)*rb]
		if want && !bytes.Equal(g, rowOf(k, req, p, rb)) {
			e.t.Fatalf("mirror key %s request %d pos %d: got %q..., want its row", e2eKeys[k].Name, req, p, g[:12])
		}
		if !want && !bytes.Equal(g, make([]byte, rb)) {
			e.t.Fatalf("mirror key %s request %d pos %d: written before its request finished", e2eKeys[k].Name, req, p)
		}
	}
}

func TestCUDACacheEndToEnd(t *testing.T) {
	for _, tc := range []struct{ owned, direct bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		owned := tc.owned
		t.Run(fmt.Sprintf("owned=%v/direct=%v", owned, tc.direct), func(t *testing.T) {
			d := newCUDA(t, gpu.CUDAOptions{})
			cfg := omnicache.Config{
				NumBlocks:             e2eBlocks,
				BlockSize:             e2eBlock,
				Keys:                  e2eKeys,
				StagingCapacityTokens: 256,
				Device:                d,
			}
			if tc.direct {
				// Every step's device rows straight into the mirror.
				cfg.MirrorDirect, cfg.MirrorDirectMinBytes = true, 1
			}
			c, err := omnicache.New(cfg)
			must(t, err)
			e := &e2eEngine{t: t, d: d, c: c, owned: owned}
			for _, k := range e2eKeys {
				b, err := d.Alloc(256 * k.RowBytes)
				must(t, err)
				e.engBuf = append(e.engBuf, b)
			}
			defer func() {
				for _, b := range e.engBuf {
					d.Free(b)
				}
			}()
			// Table rows: A (id 1) blocks 8..15, B (id 2) 16..23, C (id 3)
			// hits A's first two blocks, then 24...
			e.table = make([]int32, 4*e2eStride)
			for r := 1; r <= 3; r++ {
				for j := 0; j < e2eStride; j++ {
					e.table[r*e2eStride+j] = int32(8*r + j)
				}
			}
			e.table[3*e2eStride], e.table[3*e2eStride+1] = 8, 9

			var res omnicache.Result
			save := func(p *omnicache.Plan, b batch) omnicache.StepID {
				t.Helper()
				p.IDs, p.Start, p.Count, p.Table, p.Stride = b.ids, b.start, b.count, e.table, e2eStride
				p.Rows = make([]int32, len(b.ids))
				for i, id := range b.ids {
					p.Rows[i] = int32(id)
				}
				must(t, c.Begin(p))
				id, err := c.Save(e.outputs(b))
				must(t, err)
				if !owned {
					e.scribble()
				}
				return id
			}

			// 1. A and B arrive and prefill 40 and 24 tokens.
			b1 := batch{ids: []int64{1, 2}, start: []int32{0, 0}, count: []int32{40, 24}}
			id := save(&omnicache.Plan{Arrivals: []int64{1, 2}, HitTokens: []int32{0, 0}}, b1)
			must(t, c.Materialize(id, nil, &res))
			must(t, e.check(&res, b1, nil))

			// 2. 20 pure decode steps (parked in the decode buffer, flushed
			// at 16), each materialized a step late on another goroutine.
			type pendingStep struct {
				id omnicache.StepID
				b  batch
			}
			var prev *pendingStep
			done := make(chan error, 1)
			done <- nil
			for s := int32(0); s < 20; s++ {
				b := batch{ids: []int64{1, 2}, start: []int32{40 + s, 24 + s}, count: []int32{1, 1}}
				id := save(&omnicache.Plan{}, b)
				must(t, <-done)
				go func(p *pendingStep) {
					if p == nil {
						done <- nil
						return
					}
					var r omnicache.Result
					err := c.Materialize(p.id, nil, &r)
					if err == nil {
						err = e.check(&r, p.b, nil)
					}
					done <- err
				}(prev)
				prev = &pendingStep{id: id, b: b}
			}
			must(t, <-done)
			must(t, c.Materialize(prev.id, []int64{2}, &res))
			must(t, e.check(&res, batch{ids: []int64{2}, start: []int32{43}, count: []int32{1}}, nil))
			st := c.Stats()
			if st.BufferedSteps != 20 || st.BufferFlushes < 1 {
				t.Fatalf("decode buffer not used: %+v", st)
			}

			// 3. A finishes; C arrives with a hit on A's first two blocks
			// (32 tokens) and prefills 8 more; B decodes.
			b3 := batch{ids: []int64{2, 3}, start: []int32{44, 32}, count: []int32{1, 8}}
			id = save(&omnicache.Plan{Arrivals: []int64{3}, HitTokens: []int32{32}, HitBlocks: []int32{8, 9}, Finished: []int64{1}}, b3)
			must(t, c.Materialize(id, nil, &res))
			must(t, e.check(&res, b3, map[int64]hit{3: {req: 1, n: 32}}))

			// 4. A's deferred rows landed at its finish; B's (live) did not.
			must(t, c.Sync())
			e.peekEqual(0, 1, 1, 60, true) // hidden, A: prefill + 20 decode rows
			e.peekEqual(2, 1, 1, 60, true) // codes, A
			e.peekEqual(2, 2, 2, 45, false)

			// 5. B finishes (C decodes): B's deferred rows land.
			b5 := batch{ids: []int64{3}, start: []int32{40}, count: []int32{1}}
			id = save(&omnicache.Plan{Finished: []int64{2}}, b5)
			must(t, c.Discard(id))
			must(t, c.Sync())
			e.peekEqual(2, 2, 2, 45, true)
			e.peekEqual(1, 2, 2, 45, true)

			st = c.Stats()
			t.Logf("stats: %+v", st)
			if st.DeferredWrites < 2 || st.HitRequests != 1 || st.HitRowsRead != 32 {
				t.Fatalf("unexpected stats: %+v", st)
			}
			must(t, c.Close())
			if st := c.Stats(); st.PagesInUse != 0 || st.BudgetCharged != 0 {
				t.Fatalf("leak after Close: %+v", st)
			}
		})
	}
}

// TestCUDALargeClonedStep: a step above the lazy hand-over's size (6 MiB)
// from a non-owned device tensor, whose device→host copy Save issues
// itself behind the clone. The tensor is overwritten on the stream right
// after Save returns; the step's own rows, the mirror's and a later hit
// read the rows it held at Save, staged or copied straight into the
// mirror (MirrorDirect).
func TestCUDALargeClonedStep(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) { testCUDALargeClonedStep(t, direct) })
	}
}

func testCUDALargeClonedStep(t *testing.T, direct bool) {
	const rb, tok, bs = 128 << 10, 48, 16
	d := newCUDA(t, gpu.CUDAOptions{})
	c, err := omnicache.New(omnicache.Config{NumBlocks: 8, BlockSize: bs, StagingCapacityTokens: 64,
		Keys: []omnicache.Key{{Name: "hidden", RowBytes: rb}}, DisableDecodeBuffer: true, Device: d, MirrorDirect: direct})
	must(t, err)
	defer c.Close()
	src := pattern(tok*rb, 5)
	tensor, err := d.Alloc(tok * rb)
	must(t, err)
	defer d.Free(tensor)
	must(t, d.CopyHtoD(tensor, 0, src))
	table := []int32{0, 1, 2, 3, 4, 5, 6, 7}
	p := &omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{tok},
		Table: table, Stride: len(table), Arrivals: []int64{1}, HitTokens: []int32{0}}
	must(t, c.Begin(p))
	id, err := c.Save(&omnicache.Outputs{Tokens: tok, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: tok}}})
	must(t, err)
	must(t, d.CopyHtoD(tensor, 0, make([]byte, tok*rb))) // the engine reuses its tensor
	var res omnicache.Result
	must(t, c.Materialize(id, nil, &res))
	if !bytes.Equal(res.Rows(0, 0), src) {
		t.Fatal("the step's own rows differ")
	}
	must(t, c.Sync())
	sl := make([]int32, tok)
	for i := range sl {
		sl[i] = int32(i)
	}
	got := make([]byte, tok*rb)
	must(t, c.Peek(0, sl, got))
	if !bytes.Equal(got, src) {
		t.Fatal("the mirror's rows differ")
	}
	// A new request hits the first 32 rows and computes 16 more.
	p = &omnicache.Plan{IDs: []int64{2}, Rows: []int32{0}, Start: []int32{32}, Count: []int32{16},
		Table: table, Stride: len(table), Arrivals: []int64{2}, HitTokens: []int32{32}, HitBlocks: []int32{0, 1},
		Finished: []int64{1}}
	must(t, c.Begin(p))
	id, err = c.Save(&omnicache.Outputs{Tokens: 16, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: 16}}})
	must(t, err)
	must(t, c.Materialize(id, nil, &res))
	if !bytes.Equal(res.Rows(0, 0)[:32*rb], src[:32*rb]) {
		t.Fatal("hit rows differ")
	}
}

// A prefill with Plan.ResultInto on the CUDA device, the engine's buffer
// pinned or pageable, staged or MirrorDirect: Materialize returns the
// step's rows in the engine's buffer although the engine overwrote its
// tensor after Save, the mirror holds them, and a later step that hits has
// its prefix read into its own buffer during the forward and its rows
// after it.
func TestCUDAResultIntoPrefill(t *testing.T) {
	for _, pinned := range []bool{false, true} {
		for _, direct := range []bool{false, true} {
			t.Run(fmt.Sprintf("pinned=%v/direct=%v", pinned, direct), func(t *testing.T) {
				testCUDAResultIntoPrefill(t, pinned, direct)
			})
		}
	}
}

// The prefill tests' cache: 128 KiB rows, a 64-token page (8 MiB), 16
// blocks of 16, the decode buffer off.
const prefillRB, prefillTok, prefillBS = 128 << 10, 64, 16

// prefillCache is a CUDA device and the prefill tests' cache on it
// (MirrorDirect when direct), closed when the test ends.
func prefillCache(t *testing.T, direct bool) (gpu.Device, *omnicache.Cache) {
	d := newCUDA(t, gpu.CUDAOptions{})
	c, err := omnicache.New(omnicache.Config{NumBlocks: 16, BlockSize: prefillBS, StagingCapacityTokens: prefillTok,
		Keys: []omnicache.Key{{Name: "hidden", RowBytes: prefillRB}}, DisableDecodeBuffer: true, Device: d,
		MirrorDirect: direct})
	must(t, err)
	t.Cleanup(func() { c.Close() })
	return d, c
}

func testCUDAResultIntoPrefill(t *testing.T, pinned, direct bool) {
	const rb, tok, bs, hit = prefillRB, prefillTok, prefillBS, 32 // 8 MiB, then 32 hit rows and 48 computed (6 MiB)
	d, c := prefillCache(t, direct)
	buf := func(n int) []byte {
		if !pinned {
			return make([]byte, n)
		}
		b, err := d.AllocHost(n)
		must(t, err)
		t.Cleanup(func() { d.FreeHost(b) })
		return b
	}
	src := pattern(tok*rb, 7)
	tensor, err := d.Alloc(tok * rb)
	must(t, err)
	defer d.Free(tensor)
	must(t, d.CopyHtoD(tensor, 0, src))
	table := []int32{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 8, 9, 10, 11, 12, 13}
	into := buf(tok * rb)
	must(t, c.Begin(&omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{tok},
		Table: table, Stride: 8, Arrivals: []int64{1}, HitTokens: []int32{0}, ResultInto: [][]byte{into}}))
	id, err := c.Save(&omnicache.Outputs{Tokens: tok, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: tok}}})
	must(t, err)
	next := pattern(tok*rb, 9)
	must(t, d.CopyHtoD(tensor, 0, next)) // the engine's next forward
	var res omnicache.Result
	res.Into([][]byte{into})
	must(t, c.Materialize(id, nil, &res))
	if &res.Rows(0, 0)[0] != &into[0] || !bytes.Equal(res.Rows(0, 0), src) {
		t.Fatal("the step's rows are not in the engine's buffer after Materialize")
	}
	// Request 2 hits request 1's first 32 rows and computes 48 more.
	const n2 = 48
	into2 := buf((hit + n2) * rb)
	must(t, c.Begin(&omnicache.Plan{IDs: []int64{2}, Rows: []int32{1}, Start: []int32{hit}, Count: []int32{n2},
		Table: table, Stride: 8, Arrivals: []int64{2}, HitTokens: []int32{hit}, HitBlocks: []int32{0, 1},
		Finished: []int64{1}, ResultInto: [][]byte{into2}}))
	id, err = c.Save(&omnicache.Outputs{Tokens: n2, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: n2}}})
	must(t, err)
	must(t, d.CopyHtoD(tensor, 0, src)) // the next forward again
	res.Into([][]byte{into2})
	must(t, c.Materialize(id, nil, &res))
	got := res.Rows(0, 0)
	if &got[0] != &into2[0] || !bytes.Equal(got[:hit*rb], src[:hit*rb]) || !bytes.Equal(got[hit*rb:], next[:n2*rb]) {
		t.Fatal("the hit step's prefix or rows differ")
	}
	must(t, c.Sync())
	sl := make([]int32, n2)
	for i := range sl {
		sl[i] = int32(8*bs + i)
	}
	peek := make([]byte, n2*rb)
	must(t, c.Peek(0, sl, peek))
	if !bytes.Equal(peek, next[:n2*rb]) {
		t.Fatal("the mirror's rows of the hit step differ")
	}
}

// Plan.ResultDev on the CUDA device: a prefill's rows put into the
// engine's device buffer by Save (device to device), a hit's prefix copied
// up by the committer during the "forward" (staged or MirrorDirect), and
// MaterializeDev into the same buffers finding every row there; into
// other device buffers every row is copied up.
func TestCUDAResultDev(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) { testCUDAResultDev(t, direct) })
	}
}

func testCUDAResultDev(t *testing.T, direct bool) {
	const rb, tok, bs, hit, n2 = prefillRB, prefillTok, prefillBS, 32, 48
	d, c := prefillCache(t, direct)
	alloc := func(n int) gpu.Buffer {
		b, err := d.Alloc(n)
		must(t, err)
		t.Cleanup(func() { d.Free(b) })
		return b
	}
	read := func(b gpu.Buffer, n int) []byte {
		out := make([]byte, n)
		must(t, d.CopyDtoH(out, b, 0))
		ev, err := d.Record()
		must(t, err)
		must(t, d.Wait(ev))
		return out
	}
	src, next := pattern(tok*rb, 7), pattern(tok*rb, 9)
	tensor := alloc(tok * rb)
	must(t, d.CopyHtoD(tensor, 0, src))
	table := []int32{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 8, 9, 10, 11, 12, 13}
	dev := alloc(tok * rb)
	must(t, c.Begin(&omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{tok},
		Table: table, Stride: 8, Arrivals: []int64{1}, HitTokens: []int32{0}, ResultDev: []gpu.Buffer{dev}}))
	id, err := c.Save(&omnicache.Outputs{Tokens: tok, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: tok}}})
	must(t, err)
	must(t, d.CopyHtoD(tensor, 0, next)) // the engine's next forward
	if !bytes.Equal(read(dev, tok*rb), src) {
		t.Fatal("Save did not put the step's rows in the device buffer")
	}
	var res omnicache.Result
	must(t, c.MaterializeDev(id, []gpu.Buffer{dev}, &res, nil))
	if res.Len() != 1 || res.Tokens(0) != tok || res.Offset(0) != 0 || res.Rows(0, 0) != nil || !bytes.Equal(read(dev, tok*rb), src) {
		t.Fatal("MaterializeDev of the prefill")
	}
	// Request 2 hits request 1's first 32 rows and computes 48 more.
	dev2 := alloc((hit + n2) * rb)
	must(t, c.Begin(&omnicache.Plan{IDs: []int64{2}, Rows: []int32{1}, Start: []int32{hit}, Count: []int32{n2},
		Table: table, Stride: 8, Arrivals: []int64{2}, HitTokens: []int32{hit}, HitBlocks: []int32{0, 1},
		Finished: []int64{1}, ResultDev: []gpu.Buffer{dev2}}))
	must(t, c.Sync()) // the forward: the prefetch ran and its rows were copied up
	if !bytes.Equal(read(dev2, hit*rb), src[:hit*rb]) {
		t.Fatal("the hit's rows were not copied up during the forward")
	}
	id, err = c.Save(&omnicache.Outputs{Tokens: n2, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: n2}}})
	must(t, err)
	must(t, d.CopyHtoD(tensor, 0, src)) // the next forward again
	must(t, c.MaterializeDev(id, []gpu.Buffer{dev2}, &res, nil))
	got := read(dev2, (hit+n2)*rb)
	if res.Prefix(0) != hit || !bytes.Equal(got[:hit*rb], src[:hit*rb]) || !bytes.Equal(got[hit*rb:], next[:n2*rb]) {
		t.Fatal("the hit step's prefix or rows differ")
	}
	// Into other buffers: read, then copied up.
	must(t, c.Begin(&omnicache.Plan{IDs: []int64{3}, Rows: []int32{1}, Start: []int32{hit}, Count: []int32{n2},
		Table: table, Stride: 8, Arrivals: []int64{3}, HitTokens: []int32{hit}, HitBlocks: []int32{0, 1},
		Finished: []int64{2}, ResultDev: []gpu.Buffer{dev2}}))
	id, err = c.Save(&omnicache.Outputs{Tokens: n2, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: n2}}})
	must(t, err)
	other := alloc((hit + n2) * rb)
	must(t, c.MaterializeDev(id, []gpu.Buffer{other}, &res, nil))
	got = read(other, (hit+n2)*rb)
	if !bytes.Equal(got[:hit*rb], src[:hit*rb]) || !bytes.Equal(got[hit*rb:], src[:n2*rb]) {
		t.Fatal("MaterializeDev into other buffers")
	}
}
