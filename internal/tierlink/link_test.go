package tierlink_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/tierlink"
	"github.com/omnicache/omnicache/internal/writer"
	"github.com/omnicache/omnicache/soa"
	"github.com/omnicache/omnicache/tier"
)

const (
	bs, rb, nblocks = 4, 8, 8
)

// pathOver makes a write path whose rider and gather are l's.
func pathOver(t *testing.T, l *tierlink.Link) *writer.Path {
	t.Helper()
	p, err := writer.NewPath(writer.Config{
		Dev: gpu.NewHost(), NumBlocks: nblocks, BlockSize: bs,
		Keys: []writer.KeySpec{{Name: "h", RowBytes: rb}}, StagingDepth: 2, Capacity: 64,
		ClaimTimeout: time.Second, Budget: 1 << 30, WaitTimeout: 10 * time.Second,
		Rider: l.Rider(), Gather: l.Gather(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(time.Now().Add(10*time.Second), nil) })
	return p
}

func newLink(t *testing.T, store tierlink.Store) *tierlink.Link {
	t.Helper()
	l := tierlink.New(store, tierlink.Config{NKeys: 1, ImportTimeout: time.Second,
		PublishQueue: 64, PublishBatch: 8, Importers: 1, Publishers: 1})
	return l
}

func newTier(t *testing.T) *tier.Tier {
	t.Helper()
	e, err := tier.NewEmbedded(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := tier.New(e, tier.Namespace{Model: "m", BlockSize: bs, Keys: []tier.Key{{Name: "h", RowBytes: rb}}}, tier.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// saveBlock writes block b's bs rows (rows) as one step of one request.
func saveBlock(t *testing.T, p *writer.Path, b int32, rows []byte) {
	t.Helper()
	sl := make([]int32, bs)
	for i := range sl {
		sl[i] = b*bs + int32(i)
	}
	s := &writer.Step{Slots: sl, IDs: []int64{1}, Handles: []soa.Handle{0}, Count: []int32{bs},
		Blocks: []int32{b}, Out: []writer.Src{{Host: rows}}}
	var refs writer.Refs
	refs.Reset(1)
	if err := p.Save(s, &refs); err != nil {
		t.Fatal(err)
	}
	p.Unpin(&refs)
}

func blockRows(seed byte) []byte {
	r := make([]byte, bs*rb)
	for i := range r {
		r[i] = seed + byte(i)
	}
	return r
}

// TestPublishThenImport: a block one link publishes once its rows landed
// is found by Lookup and imported by a second link into another path's
// mirror, row for row; a block the tier lacks fails its request.
func TestPublishThenImport(t *testing.T) {
	tr := newTier(t)
	src := newLink(t, tr)
	p := pathOver(t, src)
	rows := blockRows(7)
	src.Begin([]int32{2}, []uint64{0xabc})
	saveBlock(t, p, 2, rows)
	src.Saved(1)
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for src.Stats().Published == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("not published: %+v", src.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	src.Close()
	if n, err := tr.Lookup(context.Background(), []uint64{0xabc, 0xdef}); n != 1 || err != nil {
		t.Fatalf("Lookup = %d, %v; want the published block only", n, err)
	}

	dst := newLink(t, tr)
	defer dst.Close()
	q := pathOver(t, dst)
	// request 5 hits blocks 6 and 3; 3 from the tier (published as 0xabc),
	// request 6 hits block 4 from the tier under a hash the tier lacks
	dst.NoteImport(5, []int32{6, 3}, []uint64{0xabc}, []int32{1, 1})
	dst.NoteImport(6, []int32{4}, []uint64{0xdef}, []int32{1})
	dst.StartImport(q)
	dst.Saved(9)
	if dst.Take(8) != nil {
		t.Fatal("an import under a step id never saved")
	}
	j := dst.Take(9)
	if j == nil {
		t.Fatal("the saved step's import is missing")
	}
	fails := j.Failures(q.Parts().Progress, []int64{6, 5})
	if len(fails) != 1 || fails[0].QI != 0 || fails[0].Request != 6 || fails[0].Block != 4 || !errors.Is(fails[0].Err, tier.ErrMiss) {
		t.Fatalf("failures = %+v, want request 6's block 4 missed", fails)
	}
	if err := q.Sync(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, bs*rb)
	q.Parts().Mirrors.Get(0).Read(got, []int32{12, 13, 14, 15})
	if !bytes.Equal(got, rows) {
		t.Fatalf("imported rows differ:\n got %v\nwant %v", got, rows)
	}
	if st := dst.Stats(); st.Imported != 1 || st.ImportFailed != 1 || st.BytesImported != int64(bs*rb) {
		t.Fatalf("import counters %+v", st)
	}
}

// TestUnbeginDropsBlocks: an unbegun step's full blocks are never
// published; a Reset drops queued blocks and forgets the recent ones.
func TestUnbeginDropsBlocks(t *testing.T) {
	tr := newTier(t)
	l := newLink(t, tr)
	defer l.Close()
	p := pathOver(t, l)
	l.Begin([]int32{1}, []uint64{0x11})
	l.Unbegin()
	saveBlock(t, p, 1, blockRows(1)) // a write with no step begun: nothing rides on it
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := l.Reset(time.Second); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Published != 0 || st.Pending != 0 {
		t.Fatalf("an unbegun block was published: %+v", st)
	}
	if n, _ := tr.Lookup(context.Background(), []uint64{0x11}); n != 0 {
		t.Fatal("the tier holds an unbegun block")
	}
}
