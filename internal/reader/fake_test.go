package reader

// fakeWrites is the write path the read path's tests run against: a model
// of what the reader relies on (Writes), built on the write path's own
// tables and queue but none of its machinery (no staging pages, budget,
// decode buffer or device). It keeps the semantics a read depends on:
//
//   - writes land in queue order on a committer goroutine of its own, in
//     order with the reads queued between them (PushRead); a queued write's
//     rows are readable from the write itself (ReadRows) until it lands;
//   - an immediate write publishes its rows in the mirror and its id as
//     its blocks' owner (soa.Tenancy), the scatter epoch odd meanwhile
//     (writer.Progress), so a read that overlapped it checks again;
//   - a deferred key's rows stay in a clone, their slots in transit for it
//     (soa.Occupancy), until the test lands them (landDeferred): committed
//     then, or passed over for slots a newer clone claimed;
//   - Pin snapshots the newest write id, the newest queued write touching
//     the hit blocks and every deferred slot's word, pinning the clones of
//     rows in transit; a write is released once it landed and nothing pins
//     it;
//   - a failure is sticky (fail): the committer passes every task after it
//     on as failed and lands nothing more, and every wait returns it.
//
// Unlike the write path it never skips a slot a newer queued write claims
// (the tenancy's stale bit stays clear): a reassigned block is told by its
// owner alone, which the read checks first.

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/omnicache/omnicache/internal/errs"
	"github.com/omnicache/omnicache/internal/writer"
	"github.com/omnicache/omnicache/mirror"
	"github.com/omnicache/omnicache/soa"
)

type fakeWrites struct {
	t     *testing.T
	lay   writer.Layout
	st    writer.Counters
	parts writer.Parts
	q     *writer.Queue[writer.Task]
	done  chan struct{}

	// engine goroutine (save, Pin, PushRead)
	nextID uint64
	queued []queuedWrite // immediate writes handed over, oldest first

	mu     sync.Mutex               // Owners and releases, clones, live
	clones map[uint64]*writer.Write // deferred clones in transit, by id
	live   map[*writer.Write]bool   // writes not released
	failed atomic.Pointer[error]
}

type queuedWrite struct {
	seq    uint64
	blocks []int32
}

var _ Writes = (*fakeWrites)(nil)

// newFakeWrites starts a fake write path of nblocks blocks of bs slots for
// keys; it stops (and checks that nothing is left pinned) when the test
// ends.
func newFakeWrites(t *testing.T, nblocks, bs int, keys []writer.KeySpec) *fakeWrites {
	t.Helper()
	f := &fakeWrites{t: t, q: writer.NewQueue[writer.Task](16), done: make(chan struct{}),
		clones: map[uint64]*writer.Write{}, live: map[*writer.Write]bool{}}
	l := &f.lay
	l.BlockSize, l.NumSlots, l.Keys = bs, nblocks*bs, keys
	var opt []bool
	for k, key := range keys {
		l.RowBytes = append(l.RowBytes, key.RowBytes)
		if key.Deferred {
			l.ImmIdx, l.DefIdx, l.Def = append(l.ImmIdx, -1), append(l.DefIdx, len(l.Def)), append(l.Def, k)
			continue
		}
		l.ImmIdx, l.DefIdx, l.Imm = append(l.ImmIdx, len(l.Imm)), append(l.DefIdx, -1), append(l.Imm, k)
		opt = append(opt, key.Optional)
	}
	p := &f.parts
	p.Layout, p.Counters = &f.lay, &f.st
	p.Mirrors = writer.NewMirrors(l.NumSlots, l.RowBytes, nil)
	p.Occ = make([]*soa.Occupancy, len(keys))
	var err error
	for _, k := range l.Def {
		if p.Occ[k], err = soa.NewOccupancy(l.NumSlots); err != nil {
			t.Fatal(err)
		}
	}
	if len(l.Imm) > 0 {
		if p.Tenancy, err = soa.NewTenancy(nblocks, bs, opt...); err != nil {
			t.Fatal(err)
		}
	}
	p.Workers = mirror.NewWorkers(2, 64) // gathers of 64 bytes and more are split: the split path runs too
	p.Progress = writer.NewProgress(f.q)
	go f.run()
	t.Cleanup(f.close)
	return f
}

// run is the committer: every task in queue order.
func (f *fakeWrites) run() {
	defer close(f.done)
	for {
		t, ok := f.q.Pop()
		if !ok {
			return
		}
		failed := f.failed.Load() != nil
		switch {
		case t.R != nil:
			t.R.RunInOrder(failed)
		case failed && t.W != nil: // after a failure writes are dropped, not landed
			f.unref(t.W, 0, 1)
		case failed:
			f.unref(t.Segs[0].W, 0, 1)
		case t.W != nil:
			f.land(t.W)
		default:
			f.commitDeferred(t.Segs[0].W)
		}
		f.q.Done()
	}
}

// land scatters immediate write w's rows into the mirrors and makes it
// its blocks' owner, the epoch odd meanwhile.
func (f *fakeWrites) land(w *writer.Write) {
	prog := f.parts.Progress
	prog.BeginScatter()
	for ki, k := range f.lay.Imm {
		if w.Absent[ki] {
			f.parts.Tenancy.SetAbsent(ki, w.Slots) // omitted: reads as zeros
			continue
		}
		m := f.parts.Mirrors.Make(k)
		rb := f.lay.RowBytes[k]
		for i, sl := range w.Slots {
			m.WriteRow(sl, w.Host[ki][i*rb:(i+1)*rb])
		}
		f.parts.Tenancy.ClearAbsent(ki, w.Slots)
	}
	f.parts.Tenancy.Publish(w.Slots, w.Slots, w.ID)
	prog.EndScatter()
	f.unref(w, 0, 1)
}

// commitDeferred writes clone c's rows into its key's mirror where the
// slot is still in transit for it, and commits those slots.
func (f *fakeWrites) commitDeferred(c *writer.Write) {
	occ := f.parts.Occ[c.Key]
	m := f.parts.Mirrors.Make(c.Key)
	rb := f.lay.RowBytes[c.Key]
	for i, sl := range c.Slots {
		if occ.Owns(sl, c.ID) {
			m.WriteRow(sl, c.Host[0][i*rb:(i+1)*rb])
		}
	}
	occ.Commit(c.Slots, c.ID)
	f.unref(c, 0, 1)
}

// unref drops pins and owner references of w (releasing it when none is
// left).
func (f *fakeWrites) unref(w *writer.Write, pins, owners int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := w.Pins.Add(-pins)
	w.Owners -= owners
	if n < 0 || w.Owners < 0 {
		f.t.Errorf("write %d: %d pins, %d owners", w.ID, n, w.Owners)
	}
	if owners > 0 && w.Owners == 0 && w.Deferred {
		delete(f.clones, w.ID)
	}
	if n == 0 && w.Owners == 0 {
		delete(f.live, w)
	}
}

// pinLocked pins w for r once. Caller holds f.mu.
func pinLocked(r *writer.Refs, w *writer.Write) {
	if !slices.Contains(r.Pins, w) {
		w.Pins.Add(1)
		r.Pins = append(r.Pins, w)
	}
}

// save hands over one step's rows: rows[k] holds a row of key k per slot
// of slots (nil for an optional key the step omitted). The immediate keys
// form one write, queued at once; each deferred key a clone, its slots in
// transit until landDeferred. refs gets, as from writer.Path.Save, every
// key's source write and a pin on each. Engine goroutine.
func (f *fakeWrites) save(slots []int32, rows [][]byte, refs *writer.Refs) {
	refs.Reset(len(f.lay.Keys))
	if len(slots) == 0 {
		return
	}
	var w *writer.Write
	if len(f.lay.Imm) > 0 {
		f.nextID++
		w = &writer.Write{ID: f.nextID, N: len(slots), Steps: 1, Slots: slices.Clone(slots), Owners: 1}
		for _, k := range f.lay.Imm {
			w.Host = append(w.Host, slices.Clone(rows[k])) // staged: the caller's rows are borrowed
			w.Absent = append(w.Absent, rows[k] == nil)
		}
	}
	clones := make([]*writer.Write, len(f.lay.Def))
	for di, k := range f.lay.Def {
		if rows[k] == nil {
			f.parts.Occ[k].MarkAbsent(slots) // omitted: reads as zeros
			continue
		}
		f.nextID++
		c := &writer.Write{ID: f.nextID, Deferred: true, Key: k, N: len(slots), Steps: 1,
			Slots: slices.Clone(slots), Host: [][]byte{slices.Clone(rows[k])}, Owners: 1}
		f.parts.Occ[k].Claim(c.Slots, c.ID, 0)
		clones[di] = c
	}
	f.mu.Lock()
	for k := range f.lay.Keys {
		src := w
		if di := f.lay.DefIdx[k]; di >= 0 {
			src = clones[di]
		}
		if rows[k] == nil {
			if !f.lay.Keys[k].Optional {
				f.t.Fatalf("required key %q omitted", f.lay.Keys[k].Name)
			}
			refs.Omit[k] = true
			continue
		}
		if src.Deferred {
			f.clones[src.ID] = src
		}
		f.live[src] = true
		refs.Src[k], refs.SrcOff[k] = src, 0
		pinLocked(refs, src)
	}
	f.mu.Unlock()
	if w != nil {
		seq := f.q.Push(writer.Task{W: w})
		f.queued = append(f.queued, queuedWrite{seq: seq, blocks: f.blocksOf(w.Slots)})
	}
}

// landDeferred queues the commit of every deferred clone in transit, as a
// finished request's rows are (waits for none). Engine goroutine.
func (f *fakeWrites) landDeferred() {
	f.mu.Lock()
	var cs []*writer.Write
	for _, c := range f.clones {
		cs = append(cs, c)
	}
	f.mu.Unlock()
	slices.SortFunc(cs, func(a, b *writer.Write) int { return int(a.ID) - int(b.ID) })
	for _, c := range cs {
		f.q.Push(writer.Task{Segs: []writer.Seg{{W: c, N: int32(c.N)}}})
	}
}

func (f *fakeWrites) blocksOf(slots []int32) []int32 {
	var bl []int32
	for _, s := range slots {
		if b := s / int32(f.lay.BlockSize); !slices.Contains(bl, b) {
			bl = append(bl, b)
		}
	}
	return bl
}

// ---- Writes ----

func (f *fakeWrites) Pin(hits [][]int32, pins *writer.Refs, s *writer.Snapshot) {
	s.Reset()
	s.LastID = f.nextID
	for i := len(f.queued) - 1; i >= 0 && s.JoinSeq == 0; i-- {
		for _, bl := range hits {
			if slices.ContainsFunc(bl, func(b int32) bool { return slices.Contains(f.queued[i].blocks, b) }) {
				s.JoinSeq = f.queued[i].seq
				break
			}
		}
	}
	bs := int32(f.lay.BlockSize)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, bl := range hits {
		for _, k := range f.lay.Def {
			occ := f.parts.Occ[k]
			for _, b := range bl {
				for sl := b * bs; sl < (b+1)*bs; sl++ {
					w := occ.Word(sl)
					var c *writer.Write
					var row uint32
					if st, owner := soa.Unpack(w); st == soa.InTransit {
						if c = f.clones[owner]; c != nil {
							row = occ.Row(sl)
							pinLocked(pins, c)
						}
					}
					s.Words, s.Clones, s.Rows = append(s.Words, w), append(s.Clones, c), append(s.Rows, row)
				}
			}
		}
	}
}

func (f *fakeWrites) PushRead(r writer.InOrder) uint64 { return f.q.PushLazy(writer.Task{R: r}) }

func (f *fakeWrites) WaitSeq(seq uint64) error {
	if !f.q.WaitFor(seq, waitBound) {
		return f.fail(fmt.Errorf("%w: queue item %d not reached within %v", errs.DeviceTimeout, seq, waitBound))
	}
	return f.Err()
}

func (f *fakeWrites) ReadRows(w *writer.Write, k, r0, cnt int, out []byte, _ *writer.ReadBatch) error {
	if w.Pins.Load() <= 0 {
		f.t.Errorf("ReadRows of write %d, which nothing pins", w.ID)
	}
	rb := f.lay.RowBytes[k]
	src := w.Host[0]
	if !w.Deferred {
		src = w.Host[f.lay.ImmIdx[k]]
	}
	copy(out[:cnt*rb], src[r0*rb:(r0+cnt)*rb])
	return nil
}

func (f *fakeWrites) Unpin(r *writer.Refs) {
	for _, w := range r.Pins {
		f.unref(w, 1, 0)
	}
	clear(r.Pins)
	r.Pins = r.Pins[:0]
	clear(r.Src)
}

func (f *fakeWrites) Err() error {
	if e := f.failed.Load(); e != nil {
		return *e
	}
	return nil
}

// fail makes err the sticky failure (the first wins) and returns it.
func (f *fakeWrites) fail(err error) error {
	e := fmt.Errorf("%w: %w", errs.WriteFailed, err)
	f.failed.CompareAndSwap(nil, &e)
	return *f.failed.Load()
}

// ---- the tests' side ----

// sync waits until everything handed over was processed.
func (f *fakeWrites) sync() error { return f.WaitSeq(f.q.Pushed()) }

// hold queues in-order work that holds the committer until the returned
// func is called: nothing queued after it runs meanwhile.
func (f *fakeWrites) hold() (release func()) {
	g := make(gate)
	f.q.Push(writer.Task{R: g})
	return sync.OnceFunc(func() { close(g) })
}

type gate chan struct{}

func (g gate) RunInOrder(bool) { <-g }

// liveWrites is the number of writes not released (landed and unpinned).
func (f *fakeWrites) liveWrites() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live)
}

// close stops the committer and frees the tables.
func (f *fakeWrites) close() {
	f.q.Close()
	select {
	case <-f.done:
	case <-time.After(waitBound):
		f.t.Errorf("the fake committer did not stop within %v", waitBound)
		return
	}
	f.parts.Workers.Stop()
	f.parts.Mirrors.Free()
	for _, o := range f.parts.Occ {
		if o != nil {
			o.Free()
		}
	}
	if f.parts.Tenancy != nil {
		f.parts.Tenancy.Free()
	}
}

// The fake itself: writes land in order and publish their owner; a read
// queued between two writes runs between them; Pin joins the newest
// write on the blocks and pins the clones of rows in transit, which stay
// live until unpinned and landed; a failure is sticky and passed on.
func TestFakeWrites(t *testing.T) {
	keys := []writer.KeySpec{{Name: "h", RowBytes: 8}, {Name: "d", RowBytes: 4, Deferred: true}}
	f := newFakeWrites(t, 4, 2, keys)
	rows := func(b byte, n int) [][]byte {
		return [][]byte{slices.Repeat([]byte{b}, 8*n), slices.Repeat([]byte{b + 1}, 4*n)}
	}
	var r1, r2 writer.Refs
	release := f.hold()
	f.save([]int32{2, 3}, rows(10, 2), &r1)
	var seen []byte
	f.PushRead(readAt(func() { seen = f.mirrorRow(0, 2) }))
	f.save([]int32{3}, rows(20, 1), &r2)
	var snap writer.Snapshot
	var pins writer.Refs
	f.Pin([][]int32{{1}}, &pins, &snap)
	if snap.LastID != 4 || snap.JoinSeq != 4 { // writes 1..4 (two steps, a clone each); the second step is queue item 4
		t.Fatalf("snapshot: last write %d, join %d; want 4 and 4", snap.LastID, snap.JoinSeq)
	}
	if st, owner := soa.Unpack(snap.Words[1]); st != soa.InTransit || owner != 4 || snap.Clones[1] == nil || snap.Rows[1] != 0 {
		t.Fatalf("slot 3 of the deferred key: state %d owner %d clone %v row %d", st, owner, snap.Clones[1], snap.Rows[1])
	}
	release()
	if err := f.sync(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seen, slices.Repeat([]byte{10}, 8)) {
		t.Fatalf("the read between the writes saw %v", seen)
	}
	if got := f.mirrorRow(0, 3); got[0] != 20 || f.parts.Tenancy.Owner(3) != 3 {
		t.Fatalf("slot 3: row %v, block owner %d", got, f.parts.Tenancy.Owner(3))
	}
	f.landDeferred()
	f.Unpin(&r1)
	f.Unpin(&r2)
	if err := f.sync(); err != nil {
		t.Fatal(err)
	}
	if st, owner := f.parts.Occ[1].Load(3); st != soa.Committed || owner != 4 {
		t.Fatalf("deferred slot 3: state %d owner %d", st, owner)
	}
	if n := f.liveWrites(); n != 2 {
		t.Fatalf("%d writes live; want 2 (the clones the snapshot pins)", n)
	}
	f.Unpin(&pins)
	if n := f.liveWrites(); n != 0 {
		t.Fatalf("%d writes live after the last unpin", n)
	}
	boom := errors.New("boom")
	if err := f.fail(boom); !errors.Is(err, boom) || !errors.Is(err, errs.WriteFailed) {
		t.Fatalf("fail: %v", err)
	}
	var failed atomic.Bool
	seq := f.PushRead(readFailed(func(b bool) { failed.Store(b) }))
	if err := f.WaitSeq(seq); !errors.Is(err, boom) || !failed.Load() {
		t.Fatalf("after a failure: WaitSeq %v, the read told failed: %v", err, failed.Load())
	}
}

type readAt func()

func (r readAt) RunInOrder(bool) { r() }

type readFailed func(bool)

func (r readFailed) RunInOrder(failed bool) { r(failed) }

// mirrorRow is key k's mirror row at slot sl (nil before the key's first
// write). The committer's view: call it in order, or after a sync.
func (f *fakeWrites) mirrorRow(k int, sl int32) []byte {
	m := f.parts.Mirrors.Get(k)
	if m == nil {
		return nil
	}
	row := make([]byte, f.lay.RowBytes[k])
	m.ReadRow(row, sl)
	return row
}

// FinishReads: the fake copies at once (host rows), nothing to wait for.
func (f *fakeWrites) FinishReads(*writer.ReadBatch) error { return nil }
