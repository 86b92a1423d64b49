package omnicache_test

// Sparse keys: a step may omit an optional key (a zero Tensor{}); its rows
// of that key read back as exact zeros, in the step's own Materialize and
// in every later hit over those slots until a later step supplies the key
// there again, and nothing is staged, cloned, copied
// or charged for it. A zero tensor for a required key is ErrOutputs and
// changes nothing.

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/cachetest"
)

// traffic is what a run moved: device bytes per direction, allocations,
// defensive clones, the budget peak and the rows and bytes written.
type traffic struct {
	dtod, dtoh, htod, alloc             int64
	cloned, budgetPeak, rows, bytes, dw int64
}

func trafficOf(h *cachetest.Harness, d *cachetest.CountDevice) traffic {
	h.T.Helper()
	h.Sync()
	st := h.Stats()
	return traffic{d.DtoDBytes.Load(), d.DtoHBytes.Load(), d.HtoDBytes.Load(), d.AllocBytes.Load(),
		st.ClonedBytes, st.BudgetPeak, st.RowsWritten, st.BytesWritten, st.DeferredWrites}
}

// sparseModes: every way a tensor reaches the cache.
var sparseModes = []struct {
	name       string
	dev, owned bool
}{
	{"host", false, false},
	{"device", true, false},
	{"host owned", false, true},
	{"device owned", true, true},
}

const (
	kHidden = 0 // cachetest.KeyHidden in every config of this file
	kSecond = 1 // cachetest.KeyAux or cachetest.KeyCodesOpt
)

// prefillTraffic runs request 1's 8-token prefill (blocks 0 and 1) on a
// new cache of keys, omitting the keys omit names, and materializes it;
// finish also finishes the request (its deferred rows land). It returns
// the harness and the traffic up to the Materialize.
func prefillTraffic(t *testing.T, dev, owned bool, keys []omnicache.Key, omit []bool, finish bool) (*cachetest.Harness, traffic) {
	const a = 1
	cd := cachetest.NewCountDevice()
	cfg := cachetest.Config(keys...)
	cfg.Device = cd
	h := cachetest.New(t, cfg)
	h.Device, h.Owned = dev, owned
	h.OmitKeys = omit
	h.Assign(a, 0, 1)
	id := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 8}}, Arrive: []cachetest.A{{ID: a}}})
	if finish {
		h.Discard(h.Step(cachetest.Step{Finished: []int64{a}}))
	}
	tr := trafficOf(h, cd)
	h.Mat(id)
	return h, tr
}

// An immediate optional key omitted by a prefill step: the step's own rows
// and a later hit over its blocks read zeros for it (the hidden rows are
// exact), and the step moves exactly what a cache without the key moves.
func TestSparseImmediatePrefill(t *testing.T) {
	const a, b = 1, 2
	hb, ab := cachetest.KeyHidden.RowBytes, cachetest.KeyAux.RowBytes
	for _, m := range sparseModes {
		t.Run(m.name, func(t *testing.T) {
			_, alone := prefillTraffic(t, m.dev, m.owned, []omnicache.Key{cachetest.KeyHidden}, nil, false)
			h, sparse := prefillTraffic(t, m.dev, m.owned, []omnicache.Key{cachetest.KeyHidden, cachetest.KeyAux}, []bool{false, true}, false)
			require.Equal(t, alone, sparse, "a step omitting aux moves, clones, charges and writes exactly what a cache without aux does")
			cachetest.WantRows(t, &h.Res, 0, kHidden, hb, cachetest.Tags(kHidden, a, 0, 8, 0)...)
			cachetest.WantRows(t, &h.Res, 0, kSecond, ab, cachetest.Zeros(8)...)

			// B hits A's two blocks and supplies aux for its own row.
			h.OmitKeys = nil
			h.Assign(b, 0, 1, 2)
			id := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 8, 1}}, Arrive: []cachetest.A{{ID: b, Hit: 8}}, Finished: []int64{a}})
			h.Mat(id)
			cachetest.WantRows(t, &h.Res, 0, kHidden, hb, append(cachetest.Tags(kHidden, a, 0, 8, 0), cachetest.MkTag(kHidden, b, 8, 0))...)
			cachetest.WantRows(t, &h.Res, 0, kSecond, ab, append(cachetest.Zeros(8), cachetest.MkTag(kSecond, b, 8, 0))...)
			h.CheckMirror()
			h.Drain(b)
		})
	}
}

// Buffered decode steps, some supplying aux and some not, written by one
// decode-buffer flush: each step reads its own rows (zeros where it omitted
// aux), a later hit over the decoded block reads zeros exactly at the
// omitting steps' positions, and the mirrors and rows equal those of the
// same schedule with the buffer off.
func TestSparseBufferedDecode(t *testing.T) {
	const a, b, c = 1, 2, 3
	hb, ab := cachetest.KeyHidden.RowBytes, cachetest.KeyAux.RowBytes
	omitAt := []bool{false, true, true, false} // decode positions 4..7
	for _, m := range sparseModes {
		t.Run(m.name, func(t *testing.T) {
			cachetest.RunBufferOnOff(t, cachetest.Config(cachetest.KeyHidden, cachetest.KeyAux), func(h *cachetest.Harness, buffered bool) {
				h.Device, h.Owned = m.dev, m.owned
				h.Assign(a, 0, 1)
				h.Assign(b, 2, 3)
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}, {b, 0, 4}}, Arrive: []cachetest.A{{ID: a}, {ID: b}}}))
				before := h.Stats()
				for j, om := range omitAt {
					h.OmitKeys = []bool{false, om}
					id := h.Step(cachetest.Step{Sched: []cachetest.S{{a, int64(4 + j), 1}, {b, int64(4 + j), 1}}})
					h.Mat(id)
					want := []cachetest.Tag{cachetest.MkTag(kSecond, a, 4+j, 0), cachetest.MkTag(kSecond, b, 4+j, 0)}
					if om {
						want = cachetest.Zeros(2)
					}
					cachetest.WantRows(t, &h.Res, 0, kSecond, ab, want[0])
					cachetest.WantRows(t, &h.Res, 1, kSecond, ab, want[1])
					cachetest.WantRows(t, &h.Res, 1, kHidden, hb, cachetest.MkTag(kHidden, b, 4+j, 0))
				}
				h.OmitKeys = nil
				st := h.Stats()
				if buffered {
					require.EqualValues(t, len(omitAt), st.BufferedSteps-before.BufferedSteps, "the decode steps were parked")
					require.EqualValues(t, 1, st.BufferFlushes-before.BufferFlushes, "one flush wrote the four parked steps")
				}
				// C hits A's two blocks after A finished.
				h.Assign(c, 0, 1, 4)
				id := h.Step(cachetest.Step{Sched: []cachetest.S{{c, 8, 1}}, Arrive: []cachetest.A{{ID: c, Hit: 8}}, Finished: []int64{a}})
				h.Mat(id)
				aux := append(cachetest.Tags(kSecond, a, 0, 4, 0), cachetest.MkTag(kSecond, a, 4, 0), 0, 0, cachetest.MkTag(kSecond, a, 7, 0), cachetest.MkTag(kSecond, c, 8, 0))
				cachetest.WantRows(t, &h.Res, 0, kSecond, ab, aux...)
				cachetest.WantRows(t, &h.Res, 0, kHidden, hb, append(cachetest.Tags(kHidden, a, 0, 8, 0), cachetest.MkTag(kHidden, c, 8, 0))...)
				h.CheckMirror()
				h.Drain(b, c)
			})
		})
	}
}

// A deferred optional key omitted by a step: nothing is cloned or charged
// (the traffic equals a cache without the key), the step reads zeros, and
// a hit over its slots reads zeros; a later tenant supplying the key makes
// the rows present again.
func TestSparseDeferred(t *testing.T) {
	const a, b, c, d = 1, 2, 3, 4
	hb, cb := cachetest.KeyHidden.RowBytes, cachetest.KeyCodesOpt.RowBytes
	for _, m := range sparseModes {
		t.Run(m.name, func(t *testing.T) {
			_, alone := prefillTraffic(t, m.dev, m.owned, []omnicache.Key{cachetest.KeyHidden}, nil, true)
			h, sparse := prefillTraffic(t, m.dev, m.owned, []omnicache.Key{cachetest.KeyHidden, cachetest.KeyCodesOpt}, []bool{false, true}, true)
			require.Equal(t, alone, sparse, "a step omitting the deferred key moves, clones, charges and writes exactly what a cache without it does")
			cachetest.WantRows(t, &h.Res, 0, kSecond, cb, cachetest.Zeros(8)...)

			// B hits A's blocks: zeros for codes.
			h.OmitKeys = nil
			h.Assign(b, 0, 1, 2)
			id := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 8, 1}}, Arrive: []cachetest.A{{ID: b, Hit: 8}}})
			h.Mat(id)
			cachetest.WantRows(t, &h.Res, 0, kSecond, cb, append(cachetest.Zeros(8), cachetest.MkTag(kSecond, b, 8, 0))...)
			cachetest.WantRows(t, &h.Res, 0, kHidden, hb, append(cachetest.Tags(kHidden, a, 0, 8, 0), cachetest.MkTag(kHidden, b, 8, 0))...)
			h.Discard(h.Step(cachetest.Step{Finished: []int64{b}}))

			// C takes block 0 and supplies codes; D hits it after C finished.
			h.Unassign(b)
			h.Assign(c, 0)
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{c, 0, 4}}, Arrive: []cachetest.A{{ID: c}}}))
			h.Assign(d, 0, 5)
			id = h.Step(cachetest.Step{Sched: []cachetest.S{{d, 4, 1}}, Arrive: []cachetest.A{{ID: d, Hit: 4}}, Finished: []int64{c}})
			h.Mat(id)
			cachetest.WantRows(t, &h.Res, 0, kSecond, cb, append(cachetest.Tags(kSecond, c, 0, 4, 0), cachetest.MkTag(kSecond, d, 4, 0))...)
			h.Drain(d)
			h.CheckMirror(kHidden, kSecond)
		})
	}
}

// A newer omission wins over an older deferred clone still in transit: A
// writes codes into block 0 and is preempted (its rows stay pending); B
// gets block 0 and omits codes; A is aborted, and its pending rows must
// skip block 0. A hit over block 0 reads B's hidden rows and zeros for
// codes, never A's codes. Then the same with an immediate optional key and
// a lagging committer: the older write skips the slots, the hit reads
// zeros.
func TestSparseOmissionWinsOverOlderWrite(t *testing.T) {
	const a, b, c = 1, 2, 3
	hb := cachetest.KeyHidden.RowBytes
	// C hits block 0 once B finished: B's hidden rows, zeros for the
	// second key (rb bytes a row), which B omitted.
	hitAfterB := func(t *testing.T, h *cachetest.Harness, rb int) {
		t.Helper()
		h.Assign(c, 0, 2)
		id := h.Step(cachetest.Step{Sched: []cachetest.S{{c, 4, 1}}, Arrive: []cachetest.A{{ID: c, Hit: 4}}, Finished: []int64{b}})
		h.Mat(id)
		cachetest.WantRows(t, &h.Res, 0, kHidden, hb, append(cachetest.Tags(kHidden, b, 0, 4, 0), cachetest.MkTag(kHidden, c, 4, 0))...)
		cachetest.WantRows(t, &h.Res, 0, kSecond, rb, append(cachetest.Zeros(4), cachetest.MkTag(kSecond, c, 4, 0))...)
		h.Drain(c)
	}
	t.Run("deferred", func(t *testing.T) {
		cb := cachetest.KeyCodesOpt.RowBytes
		h := cachetest.New(t, cachetest.Config(cachetest.KeyHidden, cachetest.KeyCodesOpt))
		h.Assign(a, 0, 1)
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}}))
		h.Discard(h.Step(cachetest.Step{Preempted: []int64{a}}))
		h.Unassign(a)
		h.Assign(b, 0)
		h.OmitKeys = []bool{false, true}
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{b, 0, 4}}, Arrive: []cachetest.A{{ID: b}}}))
		h.OmitKeys = nil
		// Both steps' immediate writes landed before the window: A's, if
		// still queued when B's was, skips the hidden rows B replaces
		// (counted too), which must not fall inside it.
		h.Sync()
		before := h.Stats()
		h.Discard(h.Step(cachetest.Step{Finished: []int64{a}})) // A's pending codes land now
		h.Sync()
		require.EqualValues(t, 4, h.Stats().RowsSkipped-before.RowsSkipped, "A's four pending codes rows lost block 0 to B's omission")
		hitAfterB(t, h, cb)
		h.CheckMirror(kHidden, kSecond)
	})
	t.Run("immediate, older write in transit", func(t *testing.T) {
		ab := cachetest.KeyAux.RowBytes
		dev := cachetest.NewGateDevice()
		cfg := cachetest.Config(cachetest.KeyHidden, cachetest.KeyAux)
		cfg.Device = dev
		h := cachetest.New(t, cfg)
		const old = 9 // block 0's first tenant: the mirror holds its aux rows
		h.Assign(old, 0)
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{old, 0, 4}}, Arrive: []cachetest.A{{ID: old}}}))
		h.Sync()
		h.Unassign(old)
		h.Assign(a, 0)
		stop := dev.Hold()
		sa := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}, Finished: []int64{old}})
		wa := stop()
		h.Unassign(a)
		h.Assign(b, 0)
		h.OmitKeys = []bool{false, true}
		sb := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 0, 4}}, Arrive: []cachetest.A{{ID: b}}, Finished: []int64{a}})
		h.OmitKeys = nil
		dev.Release(wa) // A's write lands after B's was queued: it skips block 0
		h.Mat(sa)
		h.Mat(sb)
		hitAfterB(t, h, ab)
		h.CheckMirror()
	})
}

// A slot whose previous tenant wrote the key and whose new tenant omitted
// it: a hit reads zeros (never the old tenant's row); a delayed read
// planned before the omission reads the old rows or fails with
// ErrReassigned, never zeros; a later tenant supplying the key makes the
// row present again.
func TestSparseNewTenantOmits(t *testing.T) {
	const a, b, c, d, e = 1, 2, 3, 4, 5
	hb, ab := cachetest.KeyHidden.RowBytes, cachetest.KeyAux.RowBytes
	for _, split := range []bool{false, true} {
		for _, m := range sparseModes {
			name := m.name
			if split {
				name += ", split reads"
			}
			t.Run(name, func(t *testing.T) {
				dev := cachetest.NewGateDevice()
				cfg := cachetest.Config(cachetest.KeyHidden, cachetest.KeyAux)
				cfg.Device = dev
				if split {
					// Hit reads take the split path (allWritten) when they can.
					defer omnicache.SetSplitBytes(1)()
					cfg.CopyWorkers = 2
				}
				h := cachetest.New(t, cfg)
				h.Device, h.Owned = m.dev, m.owned
				h.Assign(a, 0)
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}}))
				// C hits A's block (planned now, read late).
				h.Assign(c, 0, 3)
				sc := h.Step(cachetest.Step{Sched: []cachetest.S{{c, 4, 1}}, Arrive: []cachetest.A{{ID: c, Hit: 4}}, Finished: []int64{a}})
				h.Sync()
				// B, the new tenant of block 0, omits aux; its write is held in
				// transit while C's delayed read runs: C reads A's rows.
				h.Assign(b, 0)
				h.OmitKeys = []bool{false, true}
				stop := dev.Hold()
				sb := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 0, 4}}, Arrive: []cachetest.A{{ID: b}}})
				wb := stop()
				h.OmitKeys = nil
				h.Mat(sc)
				cachetest.WantRows(t, &h.Res, 0, kSecond, ab, append(cachetest.Tags(kSecond, a, 0, 4, 0), cachetest.MkTag(kSecond, c, 4, 0))...)
				dev.Release(wb)
				h.Mat(sb)
				cachetest.WantRows(t, &h.Res, 0, kSecond, ab, cachetest.Zeros(4)...)
				// D hits block 0 after B finished: B's hidden rows, zeros for aux.
				h.Assign(d, 0, 4)
				sd := h.Step(cachetest.Step{Sched: []cachetest.S{{d, 4, 1}}, Arrive: []cachetest.A{{ID: d, Hit: 4}}, Finished: []int64{b, c}})
				h.Mat(sd)
				cachetest.WantRows(t, &h.Res, 0, kHidden, hb, append(cachetest.Tags(kHidden, b, 0, 4, 0), cachetest.MkTag(kHidden, d, 4, 0))...)
				cachetest.WantRows(t, &h.Res, 0, kSecond, ab, append(cachetest.Zeros(4), cachetest.MkTag(kSecond, d, 4, 0))...)
				h.CheckMirror()
				require.True(t, bytes.Equal(h.Peek(kSecond, []int32{0, 1, 2, 3}), make([]byte, 4*ab)), "Peek of the omitted rows: zeros, not A's rows")
				// E re-supplies aux for two slots of block 0 (a recompute of
				// positions 0-1 in a new life of block 0), omits it for two.
				h.Drain(d)
				h.Unassign(b)
				h.Assign(e, 0, 5)
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{e, 0, 2}}, Arrive: []cachetest.A{{ID: e}}}))
				h.OmitKeys = []bool{false, true}
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{e, 2, 2}}}))
				h.OmitKeys = nil
				const f = 6
				h.Assign(f, 0, 6)
				sf := h.Step(cachetest.Step{Sched: []cachetest.S{{f, 4, 1}}, Arrive: []cachetest.A{{ID: f, Hit: 4}}, Finished: []int64{e}})
				h.Mat(sf)
				cachetest.WantRows(t, &h.Res, 0, kSecond, ab, cachetest.MkTag(kSecond, e, 0, 0), cachetest.MkTag(kSecond, e, 1, 0), 0, 0, cachetest.MkTag(kSecond, f, 4, 0))
				cachetest.WantRows(t, &h.Res, 0, kHidden, hb, append(cachetest.Tags(kHidden, e, 0, 4, 0), cachetest.MkTag(kHidden, f, 4, 0))...)
				h.Drain(f)
				h.CheckMirror()
			})
		}
	}
}

// A zero tensor for a required key (immediate or deferred) fails Save with
// ErrOutputs and changes nothing: Stats are the same, the parked decode
// steps stay parked, and the step begun again saves, and every later row
// and hit is exact.
func TestSparseRequiredKeyOmitted(t *testing.T) {
	const a, b = 1, 2
	for _, tc := range []struct {
		name string
		keys []omnicache.Key
		k    int // the required key omitted
	}{
		{"immediate", []omnicache.Key{cachetest.KeyHidden, cachetest.KeyAux}, kHidden},
		{"deferred", []omnicache.Key{cachetest.KeyHidden, cachetest.KeyAux, cachetest.KeyCodes}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := cachetest.New(t, cachetest.Config(tc.keys...))
			h.Assign(a, 0, 1)
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}}))
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 4, 1}}})) // parked in the decode buffer
			h.Sync()
			before := h.Stats()
			require.EqualValues(t, 1, before.BufferedSteps)
			decode := cachetest.Step{Sched: []cachetest.S{{a, 5, 1}}}
			h.Begin(decode)
			o := h.Outs()
			o.Tensors[tc.k] = omnicache.Tensor{}
			_, err := h.TrySave(o)
			require.ErrorIs(t, err, omnicache.ErrOutputs, "a zero tensor for required key %q", tc.keys[tc.k].Name)
			require.ErrorContains(t, err, fmt.Sprintf("%q", tc.keys[tc.k].Name))
			require.Equal(t, before, h.Stats(), "the failed Save changed nothing")
			// The step again, correctly: it joins the parked step.
			h.Mat(h.Step(decode))
			require.EqualValues(t, 2, h.Stats().BufferedSteps)
			h.Assign(b, 0, 2)
			id := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 4, 1}}, Arrive: []cachetest.A{{ID: b, Hit: 4}}, Finished: []int64{a}})
			h.Mat(id)
			cachetest.WantRows(t, &h.Res, 0, kHidden, cachetest.KeyHidden.RowBytes, append(cachetest.Tags(kHidden, a, 0, 4, 0), cachetest.MkTag(kHidden, b, 4, 0))...)
			h.Drain(b)
			h.CheckMirror(h.AllKeys()...)
			h.Usable()
		})
	}
}
