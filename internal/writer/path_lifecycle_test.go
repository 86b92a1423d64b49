package writer

import (
	"bytes"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/errs"
	"github.com/omnicache/omnicache/internal/gputest"
	"github.com/omnicache/omnicache/soa"
)

// A write is released (its page, its clones' budget charge and device
// buffers, its owned host tensors) once it landed and every step and
// reader that pinned it unpinned it; not before.
func TestPathUnpinReleasesWrites(t *testing.T) {
	f := newFixture(t, true, nil)
	a := f.step([]kind{kOwnHost, kOwnHost, kDev}, req{h: 0, slots: slotRange(0, 4)})
	owned := a.Out[keyK].Host
	ra := f.mustSave(a)
	rb := f.mustSave(f.step([]kind{kHost, kHost, kDev}, req{h: 1, slots: slotRange(8, 2)}))
	f.finish(0, 1)
	f.p.flushFinished()
	f.sync()
	f.check()
	require.Equal(t, 2, f.p.pages.InUse(), "landed writes stay while pinned")
	require.Equal(t, int64(12*6), f.charged(), "landed clones stay charged while pinned")
	require.False(t, f.handedBack(owned))

	// A reader pins a's write too: the step's unpin releases nothing.
	var reader Refs
	f.p.mu.Lock()
	f.p.pinLocked(&reader, ra.Src[keyK])
	f.p.pinLocked(&reader, ra.Src[keyK]) // once per refs
	f.p.mu.Unlock()
	require.EqualValues(t, 2, ra.Src[keyK].Pins.Load())
	wa := ra.Src[keyK]
	f.unpin(ra)
	require.Equal(t, 2, f.p.pages.InUse(), "the reader still pins a's write")
	require.Equal(t, int64(12*2), f.charged(), "a's clone is released")
	require.False(t, f.handedBack(owned))
	f.p.Unpin(&reader)
	require.Equal(t, 1, f.p.pages.InUse())
	require.True(t, f.handedBack(owned), "a's owned host tensor handed back")
	require.Zero(t, wa.Pins.Load())
	f.unpin(rb)
	require.Zero(t, f.p.pages.InUse())
	require.Zero(t, f.charged())
	dev, _, _ := f.cd.live()
	require.Zero(t, dev, "every clone freed")

	// A step unpinned before its write landed: the write stays until the
	// committer lands it (the device holds its event back).
	f.fault.Hang()
	rc := f.mustSave(f.step(nil, req{h: 2, slots: slotRange(16, 2)}))
	f.unpin(rc)
	require.Equal(t, 1, f.p.pages.InUse(), "a write not landed keeps its page")
	f.fault.Release()
	f.sync()
	require.Zero(t, f.p.pages.InUse())
	f.check()
}

// Reset drops every row: immediate slots read as never written (and each
// block's owner is newer than any write before), deferred slots absent; a
// parked decode step is written out first (and dropped too). The mirror's
// memory is kept, and later Saves land exact.
func TestPathResetDropsRows(t *testing.T) {
	f := newFixture(t, false, nil)
	f.mustSave(f.step([]kind{kDev, kDev, kDev}, req{h: 0, slots: slotRange(0, 6)}, req{h: 1, slots: slotRange(12, 3)}))
	f.mustSave(f.decode(20, 24))
	require.Equal(t, 1, f.p.buf.K)
	f.finish(0, 1) // no deferred rows may be in transit at a Reset
	f.p.flushFinished()
	last := f.p.nextID
	require.NoError(t, f.p.Reset())
	require.Zero(t, f.p.buf.K, "Reset writes out the decode buffer")
	for k := range f.want {
		clear(f.want[k])
	}
	f.check()
	ten := f.p.ten
	for b := int32(0); b < int32(f.cfg.NumBlocks); b++ {
		require.Greater(t, ten.Owner(b*int32(f.cfg.BlockSize)), last, "block %d: a read planned before the Reset fails", b)
	}
	for k := range f.cfg.Keys {
		require.NotNil(t, f.p.mirrors.Get(k), "key %d's mirror is kept", k)
	}
	f.mustSave(f.step(nil, req{h: 0, slots: slotRange(2, 6)}))
	f.finish(0)
	f.p.flushFinished()
	f.sync()
	f.check()
}

// Close releases everything the path holds: unconsumed steps' writes and
// their pages, parked decode steps, deferred rows never finished, their
// budget charge and device buffers, owned host tensors, staging memory and
// the mirrors. (The fixture checks the counts; here the owned tensors and
// mirrors.)
func TestPathCloseReleasesPagesAndBudget(t *testing.T) {
	for _, alloc := range []Alloc{AllocLazy, AllocAll, AllocAhead} {
		t.Run(allocName[alloc], func(t *testing.T) {
			f := newFixture(t, false, func(c *Config) { c.Alloc = alloc })
			if alloc == AllocAll {
				_, host, _ := f.cd.live()
				require.Equal(t, 1, host, "every page in one allocation")
			}
			var owned [][]byte
			for i := int32(0); i < 3; i++ {
				s := f.step([]kind{kOwnHost, kDev, []kind{kDev, kOwnDev, kOwnHost}[i]}, req{h: soa.Handle(i), slots: slotRange(4*i, 3)})
				owned = append(owned, s.Out[keyK].Host)
				if i == 2 {
					owned = append(owned, s.Out[keyDef].Host)
				}
				f.mustSave(s)
			}
			s := f.step([]kind{kOwnHost, kDev, kOwnDev}, req{h: 0, slots: []int32{20}}, req{h: 1, slots: []int32{24}})
			s.Pure = true
			owned = append(owned, s.Out[keyK].Host)
			f.mustSave(s)
			require.Equal(t, 1, f.p.buf.K)
			f.finish(0)
			f.p.flushFinished()
			f.sync()
			// Left parked, and consumed: only the buffer holds it.
			f.unpin(f.mustSave(f.decode(21, 25)))
			require.Equal(t, 1, f.p.buf.K)
			require.Positive(t, f.charged())
			require.Positive(t, f.p.pages.InUse())
			f.close() // unconsumed steps, request 1 and 2's deferred rows pending
			for i, b := range owned {
				require.True(t, f.handedBack(b), "owned host tensor %d", i)
			}
			for k := range f.cfg.Keys {
				require.Nil(t, f.p.mirrors.Get(k), "key %d's mirror freed", k)
			}
		})
	}
}

var allocName = map[Alloc]string{AllocLazy: "lazy", AllocAll: "all", AllocAhead: "ahead"}

// A staging allocation at NewPath that the device refuses fails NewPath
// with the device's error, holding nothing: no page, no device buffer, no
// committer left running (a path made afterwards on the healed device
// works).
func TestPathAllocPagesFailure(t *testing.T) {
	for _, alloc := range []Alloc{AllocAll, AllocAhead} {
		t.Run(allocName[alloc], func(t *testing.T) {
			cd := newCountDev()
			fault := gputest.NewFaulty(cd)
			fault.FailOpAfter(gputest.OpAllocHost, 0)
			cfg := defaultConfig()
			cfg.Dev, cfg.Alloc = fault, alloc
			p, err := NewPath(cfg)
			require.ErrorIs(t, err, gpu.ErrAlloc)
			require.Nil(t, p)
			dev, host, bad := cd.live()
			require.Zero(t, dev+host+bad, "nothing allocated, nothing freed twice")

			f := newFixture(t, false, func(c *Config) { c.Alloc = alloc })
			f.mustSave(f.step(nil, req{h: 0, slots: slotRange(0, 4)}))
			f.sync()
			f.check()
		})
	}
}

// fetch is an import's source: rows per block and key, or a reason a
// block could not be fetched.
type fetch struct {
	rows [][]byte
	why  []error
	gate chan struct{} // non-nil: Wait waits until it is closed

	mu      sync.Mutex
	applied [][]error
	failed  []bool
}

func (x *fetch) Wait() ([][]byte, []error) {
	if x.gate != nil {
		<-x.gate
	}
	return x.rows, x.why
}

func (x *fetch) Applied(why []error, failed bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.applied = append(x.applied, why)
	x.failed = append(x.failed, failed)
}

// An import lands the fetched blocks' rows as a write of its own id, in
// queue order with the steps around it; a block the fetch could not
// deliver turns stale. After a write failure the import is skipped and
// told so.
func TestPathImport(t *testing.T) {
	f := newFixture(t, false, func(c *Config) { c.Keys = c.Keys[:2] })
	bs := f.cfg.BlockSize
	f.mustSave(f.step(nil, req{h: 0, slots: slotRange(0, 12)}))
	x := &fetch{why: []error{nil, errors.New("not in the store"), nil}, gate: make(chan struct{})}
	blocks := []int32{1, 2, 5}
	for j, b := range blocks {
		for _, k := range (&f.p.lay).Imm {
			rows := rowsOf(k, f.cfg.Keys[k].RowBytes, 1000+j, bs)
			if x.why[j] != nil {
				rows = nil
			}
			x.rows = append(x.rows, rows)
			for i := 0; i < bs && rows != nil; i++ {
				sl := b*int32(bs) + int32(i)
				rb := f.cfg.Keys[k].RowBytes
				f.want[k][sl] = want{row: rows[i*rb : (i+1)*rb]}
			}
		}
		if x.why[j] != nil {
			for i := 0; i < bs; i++ {
				for k := range f.want {
					f.want[k][b*int32(bs)+int32(i)] = want{stale: true}
				}
			}
		}
	}
	id := f.p.PushImport(blocks, x)
	require.Equal(t, f.p.nextID, id)
	require.NotZero(t, f.p.joinSeq([][]int32{{5}}), "a hit on block 5 joins the import still fetching")
	require.Zero(t, f.p.joinSeq([][]int32{{6}}), "nothing lands in block 6")
	f.mustSave(f.step(nil, req{h: 0, slots: []int32{20, 21}})) // after the import: its rows win
	close(x.gate)
	f.sync()
	f.check()
	require.Equal(t, [][]error{x.why}, x.applied)
	require.Equal(t, []bool{false}, x.failed)

	f.p.fail(errors.New("injected"))
	y := &fetch{rows: x.rows, why: make([]error, 3)}
	f.p.PushImport(blocks, y)
	require.ErrorIs(t, f.p.Sync(), errs.WriteFailed)
	require.Equal(t, []bool{true}, y.failed, "an import after the failure is skipped")
	f.check()
}

// rider names the full blocks that ride on the next write handed over.
type rider struct {
	blocks []int32
	keys   []uint64
}

func (r *rider) Ride(blocks []int32, keys []uint64, own bool) ([]int32, []uint64) {
	blocks, keys = append(blocks, r.blocks...), append(keys, r.keys...)
	r.blocks, r.keys = nil, nil
	return blocks, keys
}

// gather collects the blocks' rows read on the committer.
type gather struct {
	bs   int
	rowB []int // per immediate key
	mu   sync.Mutex
	rows map[uint64][][]byte
	ok   map[uint64]bool
	done []bool
}

func (g *gather) Rows(key uint64, ki int) []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.rows[key] == nil {
		g.rows[key] = make([][]byte, len(g.rowB))
	}
	b := make([]byte, g.bs*g.rowB[ki])
	for i := range b {
		b[i] = 0xAB // stale bytes: the gather overwrites them
	}
	g.rows[key][ki] = b
	return b
}

func (g *gather) Block(key uint64, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ok[key] = ok
}

func (g *gather) Done(failed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.done = append(g.done, failed)
}

// Full blocks that ride on a write are read once it landed: exactly the
// rows the oracle holds (an omitted optional key's rows as zeros); a block
// not all written is reported not ok. After a write failure the gather is
// told so, every riding block reported not ok.
func TestPathGatherRidingBlocks(t *testing.T) {
	rd := &rider{}
	g := &gather{rows: map[uint64][][]byte{}, ok: map[uint64]bool{}}
	f := newFixture(t, true, func(c *Config) {
		c.Keys = c.Keys[:2]
		c.Rider, c.Gather = rd, g
	})
	g.bs, g.rowB = f.cfg.BlockSize, []int{16, 8}
	f.mustSave(f.step(nil, req{h: 0, slots: slotRange(4, 4)}))
	// Block 1 complete (rows of two steps, one omitting the optional key),
	// block 3 not.
	rd.blocks, rd.keys = []int32{1, 3}, []uint64{71, 73}
	f.mustSave(f.step([]kind{kHost, kOmit}, req{h: 0, slots: []int32{6, 7, 12}}))
	f.sync()
	f.check()
	g.mu.Lock()
	require.Equal(t, map[uint64]bool{71: true, 73: false}, g.ok)
	require.Equal(t, []bool{false}, g.done)
	for ki, k := range (&f.p.lay).Imm {
		rb := f.cfg.Keys[k].RowBytes
		for i := 0; i < g.bs; i++ {
			w := f.want[k][int32(4+i)]
			exp := w.row
			if w.absent {
				exp = make([]byte, rb)
			}
			require.True(t, bytes.Equal(exp, g.rows[71][ki][i*rb:(i+1)*rb]), "key %d row %d of block 1", k, i)
		}
	}
	g.mu.Unlock()

	// A riding write the committer reaches after a failure: the gather is
	// told. The device holds the committer at the write before it until
	// the path failed.
	f.fault.Hang()
	f.mustSave(f.step(nil, req{h: 0, slots: []int32{16}}))
	rd.blocks, rd.keys = []int32{1}, []uint64{81}
	f.mustSave(f.step(nil, req{h: 0, slots: []int32{17}}))
	f.p.fail(errors.New("injected"))
	f.fault.Release()
	require.ErrorIs(t, f.p.Sync(), errs.WriteFailed)
	g.mu.Lock()
	defer g.mu.Unlock()
	require.Equal(t, []bool{false, true}, g.done, "the gather after the failure")
	ok, told := g.ok[81]
	require.True(t, told && !ok, "the riding block reported not gathered")
}

// The accessors report the path's state: its device, layout, queue
// progress and histograms.
func TestPathAccessors(t *testing.T) {
	f := newFixture(t, false, func(c *Config) { c.Hists = NewHists() })
	require.Equal(t, f.cfg.Dev, f.p.dev)
	lay := (&f.p.lay)
	require.Equal(t, []int{keyK, keyOpt}, lay.Imm)
	require.Equal(t, []int{keyDef}, lay.Def)
	require.Equal(t, []int{-1, -1, 0}, lay.DefIdx)
	require.Nil(t, f.p.occ[keyK])
	require.NotNil(t, f.p.occ[keyDef])
	require.Zero(t, f.p.Usage().PagesAllocating)
	f.mustSave(f.step(nil, req{h: 0, slots: slotRange(0, 2)}))
	f.p.q.Kick()
	f.sync()
	seq := f.p.q.Pushed()
	require.True(t, f.p.q.Reached(seq))
	require.Equal(t, f.p.com.prog.EvenEpoch(), f.p.com.prog.Epoch(), "no scatter in progress after Sync")
	require.Positive(t, f.p.mirrors.ResidentBytes())
	_, _, n, _ := f.p.cfg.Hists.CommitterWait.Export(1)
	require.Positive(t, n, "Sync's wait observed")
	_, _, n, _ = f.p.cfg.Hists.PageWait.Export(1)
	require.Positive(t, n, "the page claim observed")
	u := f.p.Usage()
	require.Equal(t, int64(24), u.BudgetCharged)
	require.Equal(t, int64(24), u.BudgetPeak)
	require.Equal(t, f.cfg.Budget, u.BudgetLimit)
	require.Equal(t, f.p.mirrors.ResidentBytes(), u.MirrorBytes)
	require.Same(t, f.p.com.Workers(), f.p.Parts().Workers)
	// WaitDev bounds a wait on the device; a failure fails the path.
	require.NoError(t, f.p.waitDev(0))
	require.NotNil(t, f.p.com.Workers())
}
