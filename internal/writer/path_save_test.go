package writer

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache/soa"
)

// Save of immediate keys: after Sync every slot a step wrote holds its
// rows, whatever the tensors were (host or device, lent or handed over),
// over several steps that rewrite each other's slots; slots nothing wrote
// stay unwritten. Three writes are queued behind a device that holds the
// committer back, so the older ones skip the slots a newer one replaces.
// Each step's refs name its write for every immediate key.
func TestPathSaveImmediateLandsAtSlots(t *testing.T) {
	f := newFixture(t, true, nil)
	check := func(i int, r *Refs) {
		t.Helper()
		w := r.Src[keyK]
		require.NotNil(t, w, "step %d: refs name no write", i)
		require.Same(t, w, r.Src[keyOpt], "step %d: one write holds every immediate key", i)
		require.Zero(t, r.SrcOff[keyK])
		require.Contains(t, r.Pins, w, "step %d pins its write", i)
	}
	var refs []*Refs
	for i, s := range []*Step{
		f.step([]kind{kHost, kHost, kOmit}, req{h: 0, slots: slotRange(0, 6)}, req{h: 1, slots: []int32{8, 9}}),
		f.step([]kind{kDev, kDev, kOmit}, req{h: 0, slots: []int32{6, 7}}, req{h: 1, slots: []int32{10}}),
	} {
		r := f.mustSave(s)
		check(i, r)
		refs = append(refs, r)
	}
	f.sync()
	f.check()

	f.fault.Hang() // the committer waits at the first write below
	for i, s := range []*Step{
		f.step([]kind{kOwnHost, kOwnHost, kOmit}, req{h: 2, slots: []int32{20, 3, 21}}), // rewrites slot 3
		f.step([]kind{kOwnDev, kOwnDev, kOmit}, req{h: 3, slots: slotRange(2, 4)}),      // rewrites 2..5
		f.step([]kind{kOwnDev, kOwnHost, kOmit}, req{h: 1, slots: []int32{9, 10, 30, 4}}),
	} {
		r := f.mustSave(s)
		check(2+i, r)
		refs = append(refs, r)
	}
	f.fault.Release()
	f.sync()
	f.check()
	st := (&f.p.st)
	require.EqualValues(t, 5, st.Tasks.Load(), "one task per step")
	require.EqualValues(t, 2*2, st.Skipped.Load(), "the first write's row of slot 3 and the second's of slot 4 skipped, both keys")
	f.unpin(refs...)
	// Slots rewritten again after the first writes were released.
	f.mustSave(f.step([]kind{kDev, kDev, kOmit}, req{h: 0, slots: slotRange(0, 16)}))
	f.sync()
	f.check()
}

// A step that omits an optional immediate key records its slots absent
// (the mirror's older row no longer counts), and a later step that
// supplies it clears them; a deferred key omitted turns its slots absent
// at once. Refs mark the omitted keys.
func TestPathOptionalKeysOmittedReadAbsent(t *testing.T) {
	f := newFixture(t, false, nil)
	f.mustSave(f.step(nil, req{h: 0, slots: slotRange(0, 8)}))
	f.finish(0)
	f.p.flushFinished()
	f.sync()
	f.check()
	ten := f.p.ten
	ki := (&f.p.lay).ImmIdx[keyOpt]
	require.False(t, ten.Absent(ki, 2))

	r := f.mustSave(f.step([]kind{kHost, kOmit, kOmit}, req{h: 1, slots: slotRange(2, 4)}))
	require.True(t, r.Omit[keyOpt], "refs mark the omitted optional key")
	require.False(t, r.Omit[keyK])
	require.True(t, r.Omit[keyDef], "refs mark the omitted deferred key")
	for s := int32(2); s < 6; s++ {
		st, _ := f.p.occ[keyDef].Load(s)
		require.Equal(t, soa.Absent, st, "deferred slot %d turns absent at Save", s)
	}
	f.sync()
	f.check()
	for s := int32(2); s < 6; s++ {
		require.True(t, ten.Absent(ki, s), "slot %d", s)
		require.True(t, ten.Written(s), "slot %d: the required key's row is there", s)
	}
	require.False(t, ten.Absent(ki, 1))
	require.False(t, ten.Absent(ki, 6))

	// Supplied again over half of them: those are present again.
	f.mustSave(f.step([]kind{kDev, kDev, kOmit}, req{h: 1, slots: slotRange(4, 2)}))
	f.sync()
	f.check()
	require.True(t, ten.Absent(ki, 3))
	require.False(t, ten.Absent(ki, 4))
}

// Rejected draft tokens (Step.Accepted) are written nowhere: their
// immediate slots turn stale and their deferred slots absent; the accepted
// rows land as usual.
func TestPathRejectedTokensWrittenNowhere(t *testing.T) {
	f := newFixture(t, false, nil)
	f.mustSave(f.step(nil, req{h: 0, slots: slotRange(0, 4)}, req{h: 1, slots: slotRange(8, 4)}))
	f.finish(0, 1)
	f.p.flushFinished()
	f.sync()
	s := f.step(nil, req{h: 0, slots: slotRange(4, 4)}, req{h: 1, slots: slotRange(12, 4)})
	s.Accepted = []int32{1, 4} // request 0 keeps one of its four tokens
	f.mustSave(s)
	f.finish(0, 1)
	f.p.flushFinished()
	f.sync()
	f.check()
	ten := f.p.ten
	require.False(t, ten.Stale(4))
	for sl := int32(5); sl < 8; sl++ {
		require.True(t, ten.Stale(sl), "rejected slot %d", sl)
		st, _ := f.p.occ[keyDef].Load(sl)
		require.Equal(t, soa.Absent, st, "rejected deferred slot %d", sl)
	}
}

// A step too large to be handed over lazily, whose device rows Save
// clones, has its device→host copies issued by Save itself; its scatter is
// split across copy workers. Its rows land exact all the same.
func TestPathLargeStepSplitAcrossWorkers(t *testing.T) {
	f := newFixture(t, false, func(c *Config) {
		c.Keys = []KeySpec{{Name: "big", RowBytes: 32 << 10}, {Name: "opt", RowBytes: 32 << 10, Optional: true}}
		c.NumBlocks, c.BlockSize, c.Capacity, c.StagingDepth = 8, 16, 100, 2
		c.Budget = 64 << 20
		c.CopyWorkers, c.SplitBytes = 3, 4096
		c.Hists = NewHists()
	})
	require.Less(t, f.p.lazyTokens, 100, "the step below is not handed over lazily")
	for i := 0; i < 3; i++ {
		r := f.mustSave(f.step([]kind{kDev, kDev}, req{h: 0, slots: slotRange(int32(i*7), 100)}))
		f.sync()
		f.check()
		f.unpin(r)
	}
	// Host rows too, and one write behind another.
	f.mustSave(f.step([]kind{kHost, kOwnDev}, req{h: 0, slots: slotRange(20, 100)}))
	f.mustSave(f.step([]kind{kOwnDev, kHost}, req{h: 0, slots: slotRange(0, 90)}))
	f.sync()
	f.check()
	_, _, cnt, _ := f.p.cfg.Hists.CopyBytes.Export(1)
	require.Positive(t, cnt, "copies observed")
}

// Pure decode steps are parked in the decode buffer: nothing of them
// reaches the mirror (even once the committer drained its queue) until
// FlushBuffer hands them over as one write, whose rows are then exact.
// Each step's refs point into the buffer's write at its own rows.
func TestPathDecodeBufferParksUntilFlush(t *testing.T) {
	f := newFixture(t, false, nil)
	slots := [][]int32{{0, 4, 8}, {1, 5, 9}, {2, 6, 10}}
	var refs []*Refs
	for j, sl := range slots {
		require.True(t, f.p.BufferContinues([]int64{100, 101, 102}))
		r := f.mustSave(f.decode(sl...))
		refs = append(refs, r)
		require.Equal(t, j+1, f.p.buf.K)
		require.Same(t, refs[0].Src[keyK], r.Src[keyK], "parked steps share the buffer's write")
		require.EqualValues(t, j*len(sl), r.SrcOff[keyK], "step %d's rows in the buffer's write", j)
	}
	require.False(t, f.p.BufferContinues([]int64{100, 101}), "other requests do not join the parked steps")
	require.NoError(t, f.p.WaitSeq(f.p.q.Pushed()))
	ten := f.p.ten
	for _, sl := range slots {
		for _, s := range sl {
			require.False(t, ten.Written(s), "slot %d written while parked", s)
		}
	}
	require.Equal(t, 1, f.p.pages.InUse(), "the parked steps share one page")
	f.p.flushBuffer(false)
	require.Zero(t, f.p.buf.K)
	require.EqualValues(t, 1, (&f.p.st).Flushes.Load())
	require.NoError(t, f.p.WaitSeq(f.p.q.Pushed()))
	f.check()
	f.p.flushBuffer(false) // an empty buffer: nothing to flush
	require.EqualValues(t, 1, (&f.p.st).Flushes.Load(), "an empty buffer writes nothing")
	f.unpin(refs...)
	require.Zero(t, f.p.pages.InUse())
	// Sync writes the buffer out too.
	f.mustSave(f.decode(12, 13, 14))
	f.mustSave(f.decode(0, 4, 8))
	f.sync()
	require.Zero(t, f.p.buf.K)
	f.check()
}

// The buffer writes itself out once it holds block_size steps, and before
// a step that would not fit its page; device rows parked in it count
// against the budget until written.
func TestPathDecodeBufferFlushesWhenFull(t *testing.T) {
	t.Run("block size", func(t *testing.T) {
		f := newFixture(t, false, nil)
		for j := int32(0); j < 4; j++ {
			f.mustSave(f.decode(j, 8+j))
		}
		require.Zero(t, f.p.buf.K, "block_size steps flush")
		require.EqualValues(t, 1, (&f.p.st).Flushes.Load())
		f.mustSave(f.decode(16, 20))
		require.Equal(t, 1, f.p.buf.K)
		f.sync()
		f.check()
	})
	t.Run("page", func(t *testing.T) {
		f := newFixture(t, false, func(c *Config) { c.Capacity, c.BlockSize, c.NumBlocks = 15, 8, 4 })
		for j := int32(0); j < 3; j++ { // 3×5 rows fill the page
			f.mustSave(f.decode(j, 8+j, 16+j, 24+j, 28+j))
		}
		require.Equal(t, 3, f.p.buf.K)
		require.Zero(t, (&f.p.st).Flushes.Load())
		f.mustSave(f.decode(3, 11, 19, 27, 31))
		require.Equal(t, 1, f.p.buf.K, "the full buffer was written before the step")
		require.EqualValues(t, 1, (&f.p.st).Flushes.Load())
		f.sync()
		f.check()
	})
	t.Run("device rows", func(t *testing.T) {
		f := newFixture(t, false, func(c *Config) { c.Keys = c.Keys[:2] })
		s := f.step([]kind{kDev, kDev}, req{h: 0, slots: []int32{0}}, req{h: 1, slots: []int32{4}})
		s.Pure = true
		r := f.mustSave(s)
		w := r.Src[keyK]
		require.Equal(t, int64(24*2), f.charged(), "the parked clones are charged")
		// A reader of the parked rows holds the device copies past the
		// write's landing; the last reader frees them.
		require.True(t, f.p.beginParkedRead(w), "parked rows are live on the device")
		f.p.flushBuffer(false)
		f.sync()
		f.check()
		require.False(t, f.p.beginParkedRead(w), "the rows are staged once the write landed")
		dev, _, _ := f.cd.live()
		require.Equal(t, 2, dev, "the clones stay for the reader")
		require.Equal(t, int64(48), f.charged())
		f.p.endParkedRead(w)
		dev, _, _ = f.cd.live()
		require.Zero(t, dev, "the last reader frees the clones")
		require.Zero(t, f.charged())
	})
}

// Deferred rows stay on the device, their slots in transit, until their
// request finishes: Finish collects them, FlushFinished hands them over,
// and then they land (in pieces of ChunkBytes). A newer step's claim of a
// slot makes the older pending row skip it.
func TestPathDeferredLandAtFinish(t *testing.T) {
	f := newFixture(t, false, nil)
	kinds := []kind{kHost, kDev, kOwnHost, kOwnDev}
	var refs []*Refs
	for i, kd := range kinds {
		s := f.step([]kind{kHost, kHost, kd},
			req{h: 0, slots: slotRange(int32(i*3), 3)}, req{h: 1, slots: slotRange(int32(16+i*2), 2)})
		refs = append(refs, f.mustSave(s))
		require.NotNil(t, refs[i].Src[keyDef])
		require.True(t, refs[i].Src[keyDef].Deferred)
	}
	f.sync()
	f.check() // deferred slots in transit, immediate ones landed
	// Request 2 claims one of request 0's pending slots.
	r2 := f.mustSave(f.step(nil, req{h: 2, slots: []int32{4, 30}}))
	require.Zero(t, f.p.flushFinished(), "nothing finished yet")

	f.finish(0)
	seq := f.p.flushFinished()
	require.NotZero(t, seq)
	require.NoError(t, f.p.WaitSeq(seq))
	f.check() // request 0's rows committed, but slot 4's (request 2's, pending)
	st, owner := f.p.occ[keyDef].Load(4)
	require.Equal(t, soa.InTransit, st)
	require.Equal(t, r2.Src[keyDef].ID, owner, "slot 4 is request 2's")

	f.finish(1, 2)
	f.p.flushFinished()
	f.sync()
	f.check()
	require.EqualValues(t, 2, (&f.p.st).DeferredWrites.Load())
	require.Positive(t, (&f.p.st).Skipped.Load(), "request 0's row of slot 4 was skipped")
	// Clones are released once landed and unpinned: only the owned host
	// tensor goes back through ReleaseHost.
	owned := refs[2].Src[keyDef].Owned[0]
	require.False(t, f.handedBack(owned), "handed back while pinned")
	f.unpin(refs...)
	require.True(t, f.handedBack(owned), "owned host tensor handed back")
}

// Under budget pressure Save forces out what holds device bytes, oldest
// first: parked device rows, then the oldest open deferred write (whose
// rows land before their request finishes). The rows are exact.
func TestPathBudgetPressureForcesWritesOut(t *testing.T) {
	f := newFixture(t, false, func(c *Config) { c.Budget = 12 * 8 })
	var refs []*Refs
	for i := int32(0); i < 4; i++ { // 4 × 2 deferred rows: the budget is full
		refs = append(refs, f.mustSave(f.step(nil, req{h: soa.Handle(i), slots: []int32{i, 8 + i}})))
	}
	require.Equal(t, int64(96), f.charged())
	f.unpin(refs...) // unpinned: the clones may be forced out
	f.mustSave(f.step(nil, req{h: 4, slots: []int32{16, 17}}))
	require.EqualValues(t, 1, (&f.p.st).BudgetFlushes.Load())
	f.land(0) // request 0's rows were forced out
	f.sync()
	f.check()
	require.Equal(t, int64(96), f.charged())

	// Parked device rows of the immediate keys go first.
	g := newFixture(t, false, func(c *Config) { c.Keys, c.Budget = c.Keys[:2], 24 })
	s := g.step([]kind{kDev, kDev}, req{h: 0, slots: []int32{0}})
	s.Pure = true
	g.mustSave(s)
	require.Equal(t, 1, g.p.buf.K)
	s = g.step([]kind{kDev, kDev}, req{h: 0, slots: []int32{1}})
	s.Pure = true
	g.mustSave(s)
	require.EqualValues(t, 1, (&g.p.st).BudgetFlushes.Load())
	require.Equal(t, 1, g.p.buf.K, "the first step was written out, the second parked")
	g.sync()
	g.check()
}
