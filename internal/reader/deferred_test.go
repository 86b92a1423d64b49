package reader

// Reads of deferred keys, of omitted optional keys, and after a write
// failure, against the fake write path: a deferred row is read from its
// clone while in transit and from the mirror once committed, never once a
// newer write claimed its slot (unless read in order); an omitted optional
// key's hit rows are zeros; a write failure fails the read whole.

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache/internal/errs"
	"github.com/omnicache/omnicache/internal/writer"
)

// Deferred keys: a required one and an optional one.
var deferredKeys = []writer.KeySpec{{Name: "dhidden", RowBytes: 12, Deferred: true}, {Name: "daux", RowBytes: 4, Deferred: true, Optional: true}}

// A hit over deferred rows still in transit reads them from the clone
// that holds them; once committed, from the mirror; either way they are
// the rows the owner wrote.
func TestReadDeferredRowsInTransitAndCommitted(t *testing.T) {
	for _, prefetch := range []bool{true, false} {
		t.Run(fmt.Sprintf("prefetch=%v", prefetch), func(t *testing.T) {
			w := newWorldOf(t, deferredKeys, Options{Prefetch: prefetch, Budget: 1 << 20})
			w.blocks[1] = []int32{1}
			w.blocks[2] = []int32{1, 2}
			w.blocks[3] = []int32{1, 3}
			d, err := w.read(w.step([]sched{{1, 0, 4}}))
			require.NoError(t, err)
			wantRows(t, d, 0, 1, 0, 1, 0) // its own rows, from its clones

			s2 := w.step([]sched{{2, 4, 1}}, Hit{Index: 0, Tokens: 4, Blocks: []int32{1}})
			require.Equal(t, srcClone, int(s2.pKind[0]), "planned while request 1's rows are in transit")
			d, err = w.read(s2)
			require.NoError(t, err)
			wantRows(t, d, 0, 1, 4, 2, 0)

			w.f.landDeferred()
			require.NoError(t, w.f.sync())
			s3 := w.step([]sched{{3, 4, 1}}, Hit{Index: 0, Tokens: 4, Blocks: []int32{1}})
			require.Equal(t, srcMirror, int(s3.pKind[0]), "planned once they were committed")
			d, err = w.read(s3)
			require.NoError(t, err)
			wantRows(t, d, 0, 1, 4, 3, 0)
			w.f.landDeferred() // requests 2 and 3's own rows
			require.NoError(t, w.f.sync())
			require.Zero(t, w.f.liveWrites(), "every clone released once landed and unpinned")
		})
	}
}

// A committed deferred row that a newer write claimed after the plan is
// refused at Read (ErrReassigned, that request alone): its occupancy word
// moved. Read in order by the committer (prefetch), the same late read
// serves the planned rows: the newer rows land after it.
func TestReadRefusesAReplacedDeferredRow(t *testing.T) {
	for _, prefetch := range []bool{true, false} {
		t.Run(fmt.Sprintf("prefetch=%v", prefetch), func(t *testing.T) {
			w := newWorldOf(t, deferredKeys, Options{Prefetch: prefetch, Budget: 1 << 20})
			w.blocks[1] = []int32{5}
			w.blocks[2] = []int32{5, 6}
			w.blocks[3] = []int32{5} // block 5's next tenant
			w.blocks[4] = []int32{9}
			_, err := w.read(w.step([]sched{{1, 0, 4}}))
			require.NoError(t, err)
			w.f.landDeferred()
			require.NoError(t, w.f.sync())
			s2 := w.step([]sched{{2, 4, 1}, {4, 0, 2}}, Hit{Index: 0, Tokens: 4, Blocks: []int32{5}})
			w.step([]sched{{3, 0, 4}}) // claims block 5; never consumed here
			w.f.landDeferred()
			require.NoError(t, w.f.sync())

			d, err := w.read(s2)
			require.NoError(t, err, "a request that cannot be served fails alone")
			wantRows(t, d, 1, 4, 0, 4, 0)
			if prefetch {
				wantRows(t, d, 0, 1, 4, 2, 0)
				return
			}
			require.ErrorIs(t, d.errs[0], errs.Reassigned)
			for k := range deferredKeys {
				require.Equal(t, make([]byte, d.n[0]*deferredKeys[k].RowBytes), d.Rows(0, k), "a refused request's rows are zeros")
			}
		})
	}
}

// A hit over rows whose last write omitted an optional key reads that
// key's rows as zeros (its other keys' rows as written), for an immediate
// key (the tenancy's absent bit) and a deferred one (an absent word); a
// hit over deferred rows never written fails for the required key.
func TestReadOmittedAndAbsentRows(t *testing.T) {
	keys := append(append([]writer.KeySpec(nil), testKeys...), deferredKeys...)
	for _, prefetch := range []bool{true, false} {
		t.Run(fmt.Sprintf("prefetch=%v", prefetch), func(t *testing.T) {
			w := newWorldOf(t, keys, Options{Prefetch: prefetch, Budget: 1 << 20})
			w.blocks[1] = []int32{2}
			w.blocks[2] = []int32{2, 4}
			w.blocks[3] = []int32{7, 8}             // block 7: never written
			w.omit = map[int]bool{1: true, 3: true} // aux and daux
			_, err := w.read(w.step([]sched{{1, 0, 4}}))
			require.NoError(t, err)
			w.omit = nil
			w.f.landDeferred()
			require.NoError(t, w.f.sync())

			d, err := w.read(w.step([]sched{{2, 4, 1}}, Hit{Index: 0, Tokens: 4, Blocks: []int32{2}}))
			require.NoError(t, err)
			require.NoError(t, d.errs[0])
			for k, key := range keys {
				var want []byte
				if key.Optional {
					want = make([]byte, 4*key.RowBytes) // omitted: zeros
				} else {
					want = rowsOf(keys, 1, k, 0, 4)
				}
				want = append(want, rowsOf(keys, 2, k, 4, 1)...)
				require.Equal(t, want, d.Rows(0, k), "key %q", key.Name)
			}

			d, err = w.read(w.step([]sched{{3, 4, 1}}, Hit{Index: 0, Tokens: 4, Blocks: []int32{7}}))
			require.NoError(t, err)
			require.ErrorIs(t, d.errs[0], errs.AbsentRequired)
		})
	}
}

// After a write failure a read that still needs the write path fails
// whole with the sticky failure: a hit read at Read joining the writes,
// one the committer skipped (prefetch), and a deferred row whose clone
// the committer dropped.
func TestReadAfterAWriteFailure(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name     string
		keys     []writer.KeySpec
		prefetch bool
	}{
		{"immediate/prefetch", testKeys, true},
		{"immediate/no prefetch", testKeys, false},
		{"deferred/no prefetch", deferredKeys, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorldOf(t, tc.keys, Options{Prefetch: tc.prefetch, Budget: 1 << 20})
			w.blocks[1] = []int32{1}
			w.blocks[2] = []int32{1, 2}
			_, err := w.read(w.step([]sched{{1, 0, 4}}))
			require.NoError(t, err)
			release := w.f.hold()
			var s *Step
			if tc.keys[0].Deferred {
				w.f.fail(boom)
				w.f.landDeferred() // dropped: the failure came first
				release()
				require.ErrorIs(t, w.f.sync(), boom)
				s = w.step([]sched{{2, 4, 1}}, Hit{Index: 0, Tokens: 4, Blocks: []int32{1}})
				require.Equal(t, srcFailed, int(s.pKind[0]), "in transit for a clone the committer dropped")
			} else {
				s = w.step([]sched{{2, 4, 1}}, Hit{Index: 0, Tokens: 4, Blocks: []int32{1}})
				w.f.fail(boom)
				release()
			}
			_, err = w.read(s)
			require.ErrorIs(t, err, errs.WriteFailed)
			require.ErrorIs(t, err, boom)
		})
	}
}
