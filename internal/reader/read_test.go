package reader

// The read path's own behaviour, driven against a fake write path
// (fakeWrites: the semantics the read relies on, over the write path's
// tables) the way the cache drives them: a step's record is made, its hits
// charged and planned at Begin (prefetch) or at Save, its rows handed to
// the write path, and it is consumed by Read and Release, or given up by
// Cancel.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache/internal/errs"
	"github.com/omnicache/omnicache/internal/writer"
)

const (
	testBS     = 4 // tokens per block
	testBlocks = 16
	waitBound  = 10 * time.Second // a deadlock detector, not a threshold
)

// The keys: a required hidden state and an optional per-token tensor.
var testKeys = []writer.KeySpec{{Name: "hidden", RowBytes: 16}, {Name: "aux", RowBytes: 8, Optional: true}}

// rowOf is the content of a row of rb bytes of key k at position pos of
// request id: distinct for every (id, k, pos).
func rowOf(rb int, id int64, k, pos int) []byte {
	b := make([]byte, rb)
	for i := range b {
		b[i] = byte(int(id)*53 + k*29 + pos*7 + i + 1)
	}
	return b
}

// rowsOf are rowOf's rows of key k (of keys) of positions [pos, pos+n).
func rowsOf(keys []writer.KeySpec, id int64, k, pos, n int) []byte {
	var b []byte
	for p := pos; p < pos+n; p++ {
		b = append(b, rowOf(keys[k].RowBytes, id, k, p)...)
	}
	return b
}

// world is a write path and its read path, and a block table.
type world struct {
	t      *testing.T
	f      *fakeWrites
	rd     *Reader
	nextID uint64
	blocks map[int64][]int32 // per request: its blocks, in position order
	into   bool              // read into destinations that take no buffers (Dest.Adopts false)
	// sized: read sizes the destination of a whole prefetched step too
	// (a Result that held as many rows before).
	sized bool
	keys  []writer.KeySpec
	omit  map[int]bool // keys the next steps omit (optional keys only)
}

func newWorld(t *testing.T, opt Options) *world {
	return newWorldOf(t, testKeys, opt)
}

// newWorldOf is newWorld with other keys (rowOf's key indices are theirs).
func newWorldOf(t *testing.T, keys []writer.KeySpec, opt Options) *world {
	t.Helper()
	f := newFakeWrites(t, testBlocks, testBS, keys)
	return &world{t: t, f: f, rd: New(f, &f.parts, opt), blocks: map[int64][]int32{}, keys: keys}
}

// sched is a request of a step: tokens [start, start+n) of request id.
type sched struct {
	id       int64
	start, n int
}

// step makes the record of a step of reqs with hits (Hit.Index in reqs),
// plans its hit read as the cache does (at "Begin" when the read-ahead
// budget takes it, else after Save), and saves its rows (every key but
// those w.omit names).
func (w *world) step(reqs []sched, hits ...Hit) *Step {
	w.t.Helper()
	s := &Step{}
	s.Reset(len(w.keys))
	w.nextID++
	s.ID = w.nextID
	var slots []int32
	rows := make([][]byte, len(w.keys))
	for _, r := range reqs {
		s.IDs = append(s.IDs, r.id)
		s.Start = append(s.Start, int32(r.start))
		s.Count = append(s.Count, int32(r.n))
		for pos := r.start; pos < r.start+r.n; pos++ {
			bl := w.blocks[r.id]
			require.Less(w.t, pos/testBS, len(bl), "request %d has no block for position %d", r.id, pos)
			slots = append(slots, bl[pos/testBS]*testBS+int32(pos%testBS))
		}
		for k := range w.keys {
			if !w.omit[k] {
				rows[k] = append(rows[k], rowsOf(w.keys, r.id, k, r.start, r.n)...)
			}
		}
	}
	planned := false
	if len(hits) > 0 && w.rd.Charge(s, hits, nil) {
		w.rd.Plan(s, hits) // Begin: behind the writes handed over so far
		planned = true
	}
	w.f.save(slots, rows, &s.Refs)
	if len(hits) > 0 && !planned {
		w.rd.Plan(s, hits) // behind the step's own rows
	}
	return s
}

// dest is a Result-like Dest: per asked request its prefix and step rows,
// one buffer per key, requests in the order asked.
type dest struct {
	spec   []writer.KeySpec
	off, n []int // per asked request: its first row, its rows
	keys   [][]byte
	errs   []error
	into   bool // the buffers are the caller's: nothing adopted
}

func newDest(s *Step, keys []writer.KeySpec, asked []int) *dest {
	d := &dest{spec: keys, keys: make([][]byte, len(keys)), errs: make([]error, len(asked))}
	rows := 0
	for _, i := range asked {
		n := int(s.Prefix(i) + s.Count[i])
		d.off, d.n = append(d.off, rows), append(d.n, n)
		rows += n
	}
	return d
}

func (d *dest) Rows(qi, k int) []byte {
	rb := d.spec[k].RowBytes
	return d.keys[k][d.off[qi]*rb : (d.off[qi]+d.n[qi])*rb]
}

func (d *dest) Size() {
	rows := 0
	if n := len(d.off); n > 0 {
		rows = d.off[n-1] + d.n[n-1]
	}
	for k := range d.keys {
		d.keys[k] = make([]byte, rows*d.spec[k].RowBytes)
	}
}

func (d *dest) Adopts() bool { return !d.into }
func (d *dest) Fits() bool {
	rows := 0
	if n := len(d.off); n > 0 {
		rows = d.off[n-1] + d.n[n-1]
	}
	for k := range d.keys {
		if cap(d.keys[k]) < rows*d.spec[k].RowBytes {
			return false
		}
	}
	return true
}

func (d *dest) Adopt(k int, buf []byte) []byte {
	if d.into {
		panic("Adopt of a destination that takes no buffers")
	}
	old := d.keys[k]
	d.keys[k] = buf
	return old
}

func (d *dest) Fail(qi int, err error) {
	d.errs[qi] = err
	for k := range d.keys {
		clear(d.Rows(qi, k))
	}
}

// read consumes s as Materialize does: the asked requests (step indices;
// none: every request), then the consumer's Release.
func (w *world) read(s *Step, asked ...int) (*dest, error) {
	w.t.Helper()
	all := len(asked) == 0
	if all {
		for i := range s.IDs {
			asked = append(asked, i)
		}
	}
	s.Qidx = s.Qidx[:0]
	for _, i := range asked {
		s.Qidx = append(s.Qidx, int32(i))
	}
	d := newDest(s, w.keys, asked)
	d.into = w.into
	if !all || !s.Prefetched() || d.into || w.sized {
		d.Size() // else the read adopts the prefetched buffers
	}
	done := make(chan error, 1)
	go func() { done <- w.rd.Read(s, all, len(asked), d) }()
	select {
	case err := <-done:
		w.rd.Release(s)
		return d, err
	case <-time.After(waitBound):
		w.t.Fatalf("Read of step %d did not return within %v", s.ID, waitBound)
		return nil, nil
	}
}

// wantRows checks asked request qi's rows of every key against request
// id's rows from position from (owner: whose rows the first pre are).
func wantRows(t *testing.T, d *dest, qi int, owner int64, pre int, id int64, from int) {
	t.Helper()
	require.NoError(t, d.errs[qi], "request %d failed", id)
	for k := range d.keys {
		want := append(rowsOf(d.spec, owner, k, from, pre), rowsOf(d.spec, id, k, from+pre, d.n[qi]-pre)...)
		require.Equal(t, want, d.Rows(qi, k), "key %q of request %d", d.spec[k].Name, id)
	}
}

// A hit read returns the rows the writes before its plan landed: request
// 2 hits request 1's two blocks and computes two more rows; its result is
// request 1's eight rows, then its own, for every key, read ahead by the
// committer (prefetch) or at Read, into buffers of the read path's
// (adopted) or of the destination's own (into, after the committer's read
// ahead ran). A subset read serves the asked request alone.
func TestReadServesTheRowsAWriteLanded(t *testing.T) {
	for _, tc := range []struct{ prefetch, into bool }{{true, false}, {true, true}, {false, false}, {false, true}} {
		prefetch := tc.prefetch
		t.Run(fmt.Sprintf("prefetch=%v/into=%v", prefetch, tc.into), func(t *testing.T) {
			w := newWorld(t, Options{Prefetch: prefetch, Budget: 1 << 20})
			w.into = tc.into
			w.blocks[1] = []int32{1, 2}
			w.blocks[2] = []int32{1, 2, 3}
			w.blocks[3] = []int32{7}
			s1 := w.step([]sched{{1, 0, 8}})
			d, err := w.read(s1)
			require.NoError(t, err)
			wantRows(t, d, 0, 1, 0, 1, 0)

			hits := (&w.f.st).HitRows.Load()
			s2 := w.step([]sched{{3, 0, 3}, {2, 8, 2}}, Hit{Index: 1, Tokens: 8, Blocks: []int32{1, 2}})
			require.Equal(t, prefetch, s2.Prefetched())
			require.True(t, s2.HasHits())
			if tc.into {
				// the committer's read ahead done: Read serves its buffers
				require.NoError(t, w.f.sync())
			}
			d, err = w.read(s2)
			require.NoError(t, err)
			wantRows(t, d, 0, 3, 0, 3, 0)
			wantRows(t, d, 1, 1, 8, 2, 0) // request 1's rows 0..7, then its own 8, 9
			require.Equal(t, hits+8, (&w.f.st).HitRows.Load(), "hit rows served")

			s3 := w.step([]sched{{3, 3, 1}, {2, 10, 1}})
			d, err = w.read(s3, 1)
			require.NoError(t, err)
			wantRows(t, d, 0, 2, 0, 2, 10)
		})
	}
}

// A hit whose block a newer write claimed before the read is refused with
// ErrReassigned for that request alone (its rows zeros, the step's other
// request served) when it is read at Read: without prefetch, or when the
// read-ahead budget could not hold the step (the error says so). Read
// ahead by the committer in queue order, the same late read serves the
// planned rows.
func TestReadRefusesAReassignedBlock(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opt      Options
		refused  bool
		noBudget bool
	}{
		{"prefetch", Options{Prefetch: true, Budget: 1 << 20}, false, false},
		{"no prefetch", Options{}, true, false},
		{"read-ahead budget exhausted", Options{Prefetch: true, Budget: 1}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, tc.opt)
			w.blocks[1] = []int32{5}
			w.blocks[2] = []int32{5, 6}
			w.blocks[3] = []int32{5} // block 5's next tenant
			w.blocks[4] = []int32{9}
			s1 := w.step([]sched{{1, 0, 4}})
			_, err := w.read(s1)
			require.NoError(t, err)
			s2 := w.step([]sched{{2, 4, 1}, {4, 0, 2}}, Hit{Index: 0, Tokens: 4, Blocks: []int32{5}})
			w.step([]sched{{3, 0, 4}}) // rewrites block 5; never consumed here
			require.NoError(t, w.f.sync())

			d, err := w.read(s2)
			require.NoError(t, err, "a request that cannot be served fails alone")
			wantRows(t, d, 1, 4, 0, 4, 0)
			if !tc.refused {
				wantRows(t, d, 0, 1, 4, 2, 0)
				return
			}
			require.ErrorIs(t, d.errs[0], errs.Reassigned)
			require.Equal(t, tc.noBudget, strings.Contains(d.errs[0].Error(), "read-ahead budget"), "the error names the read-ahead budget: %v", d.errs[0])
			for k := range testKeys {
				require.Equal(t, make([]byte, d.n[0]*testKeys[k].RowBytes), d.Rows(0, k), "a refused request's rows are zeros")
			}
		})
	}
}

// A hit over a block no write ever touched fails with ErrAbsentRequired
// (the hidden key is required), whether read ahead or at Read.
func TestReadRefusesAbsentRequiredRows(t *testing.T) {
	for _, prefetch := range []bool{true, false} {
		t.Run(fmt.Sprintf("prefetch=%v", prefetch), func(t *testing.T) {
			w := newWorld(t, Options{Prefetch: prefetch, Budget: 1 << 20})
			w.blocks[1] = []int32{3, 4}
			s := w.step([]sched{{1, 4, 1}}, Hit{Index: 0, Tokens: 4, Blocks: []int32{3}})
			require.NoError(t, w.f.sync())
			d, err := w.read(s)
			require.NoError(t, err)
			require.ErrorIs(t, d.errs[0], errs.AbsentRequired)
		})
	}
}

// A consumed step's record is handed back for reuse once the last
// reference is dropped: the consumer's Release of a step read at Read; the
// consumer's and the committer's (its read ahead done) of a prefetched
// one; Cancel of a step given up. Its pins go with it: its writes go
// back. Each record is handed over once, at most maxFreeSteps are kept,
// and NewStep takes them (reset) before it makes a new one.
func TestReleaseRecyclesRecords(t *testing.T) {
	w := newWorld(t, Options{Prefetch: true, Budget: 1 << 20})
	w.blocks[1] = []int32{1}
	w.blocks[2] = []int32{1, 2}
	s1 := w.step([]sched{{1, 0, 4}})
	require.Empty(t, w.rd.takeFreed(nil), "nothing released yet")
	_, err := w.read(s1)
	require.NoError(t, err)
	require.Equal(t, []*Step{s1}, w.rd.takeFreed(nil), "the consumer's Release was the last reference")

	s2 := w.step([]sched{{2, 4, 1}}, Hit{Index: 0, Tokens: 4, Blocks: []int32{1}})
	require.True(t, s2.Prefetched())
	require.NoError(t, w.f.sync()) // the committer's read ran and dropped its reference
	_, err = w.read(s2)
	require.NoError(t, err)
	s3 := w.step([]sched{{2, 5, 1}})
	w.rd.Cancel(s3)
	require.ElementsMatch(t, []*Step{s2, s3}, w.rd.takeFreed(nil))
	require.Empty(t, w.rd.takeFreed(nil), "each record is handed over once")
	require.NoError(t, w.f.sync())
	require.Zero(t, w.f.liveWrites(), "the released steps' writes went back")

	for i := 0; i < maxFreeSteps+6; i++ {
		s := &Step{}
		s.Reset(len(testKeys))
		w.rd.Cancel(s)
	}
	require.Len(t, w.rd.takeFreed(nil), maxFreeSteps, "records kept for reuse")

	s4 := w.step([]sched{{2, 6, 1}})
	w.rd.Cancel(s4)
	got := w.rd.NewStep(len(testKeys))
	require.Same(t, s4, got, "NewStep takes a freed record")
	require.Empty(t, got.IDs, "reset")
	require.Len(t, got.Src, len(testKeys), "reset for the keys")
	require.NotSame(t, s4, w.rd.NewStep(len(testKeys)), "a new record once none is free")
}

// Cancel of a prefetched step whose read the committer has not started
// (it is held up by earlier work) gives the step's read-ahead charge back
// at once and skips the read; the record comes back once the committer
// passed the skipped read.
func TestCancelGivesTheReadAheadBack(t *testing.T) {
	w := newWorld(t, Options{Prefetch: true, Budget: 1 << 20})
	w.blocks[1] = []int32{1}
	w.blocks[2] = []int32{1, 2}
	s1 := w.step([]sched{{1, 0, 4}})
	_, err := w.read(s1)
	require.NoError(t, err)
	require.NoError(t, w.f.sync())
	w.rd.takeFreed(nil)

	release := w.f.hold()
	defer release()
	s2 := w.step([]sched{{2, 4, 2}}, Hit{Index: 0, Tokens: 4, Blocks: []int32{1}})
	require.True(t, s2.Prefetched())
	want := int64(0)
	for _, k := range testKeys {
		want += int64(4+2) * int64(k.RowBytes) // prefix and step rows of every key
	}
	require.Equal(t, want, w.rd.ReadAheadBytes(), "the step's buffers are charged from Begin")
	dropped := (&w.f.st).PrefetchDropped.Load()
	w.rd.Cancel(s2)
	require.Zero(t, w.rd.ReadAheadBytes(), "Cancel gave the charge back at once")
	require.Equal(t, dropped+1, (&w.f.st).PrefetchDropped.Load())
	require.Empty(t, w.rd.takeFreed(nil), "the committer still holds the record")
	release()
	require.NoError(t, w.f.sync())
	require.Equal(t, []*Step{s2}, w.rd.takeFreed(nil), "freed once the committer passed the skipped read")
	require.Zero(t, w.rd.ReadAheadBytes())
	require.Zero(t, (&w.f.st).PrefetchUsed.Load(), "the skipped read served nothing")
}

// A read ahead the consumer hands back (a request it cannot serve) is run
// by the committer even when the committer reached it while the consumer
// was reading: it waits for the hand-back and then reads in order, so the
// request still gets its error. Here the committer finds the consumer
// reading (pfEngine) and the consumer hands the read back before the
// committer looks again: the read must not be taken as served.
func TestHandedBackReadRunsOnTheCommitter(t *testing.T) {
	w := newWorld(t, Options{Prefetch: true, Budget: 1 << 20})
	w.blocks[1] = []int32{3, 4}
	release := w.f.hold() // the committer reaches the read only once the consumer reads
	defer release()
	s := w.step([]sched{{1, 4, 1}}, Hit{Index: 0, Tokens: 4, Blocks: []int32{3}}) // block 3: never written
	require.True(t, s.Prefetched())
	w.rd.SetAheadWait(0) // the consumer reads ahead at once

	sawEngine := make(chan struct{})
	testHookReadingAhead = func(*Step) {
		release()
		select { // the committer tried to claim the read and found it taken
		case <-sawEngine:
		case <-time.After(waitBound):
			t.Error("the committer never reached the read")
		}
	}
	testHookSawEngine = func(s *Step) {
		testHookSawEngine = nil
		close(sawEngine)
		deadline := time.Now().Add(waitBound)
		for s.pfState.Load() == pfEngine && time.Now().Before(deadline) {
			time.Sleep(10 * time.Microsecond) // until the consumer handed the read back
		}
	}
	defer func() { testHookReadingAhead, testHookSawEngine = nil, nil }()

	handed := (&w.f.st).HandedBack.Load()
	d, err := w.read(s)
	require.NoError(t, err)
	require.Equal(t, handed+1, (&w.f.st).HandedBack.Load(), "the consumer handed the read back")
	require.ErrorIs(t, d.errs[0], errs.AbsentRequired, "the committer read it and found block 3 absent")
	require.Equal(t, int64(1), (&w.f.st).PrefetchUsed.Load())
}

// A prefetched step whose read the committer passed without running it
// (a state the protocol never leaves: here set by hand) is read at Read
// with every check of a late read, never served from empty buffers.
func TestUnrunPrefetchIsReadLate(t *testing.T) {
	w := newWorld(t, Options{Prefetch: true, Budget: 1 << 20})
	w.blocks[1] = []int32{3, 4}
	release := w.f.hold()
	s := w.step([]sched{{1, 4, 1}}, Hit{Index: 0, Tokens: 4, Blocks: []int32{3}}) // block 3: never written
	require.True(t, s.Prefetched())
	s.pfState.Store(pfTaken) // the committer will find the read taken and skip it
	release()
	require.NoError(t, w.f.sync())
	d, err := w.read(s)
	require.NoError(t, err)
	require.ErrorIs(t, d.errs[0], errs.AbsentRequired)
	for k := range testKeys {
		require.Equal(t, make([]byte, d.n[0]*testKeys[k].RowBytes), d.Rows(0, k), "a refused request's rows are zeros")
	}
}
