package omnicache_test

// Sparse keys (issue 15, part 4): a step may omit an optional key (a zero
// Tensor{}); its rows of that key read back as exact zeros, in the step's
// own Materialize and in every later hit over those slots until a later
// step supplies the key there again, and nothing is staged, cloned, copied
// or charged for it. A zero tensor for a required key is ErrOutputs and
// changes nothing.

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
)

// keyCodesOpt is an optional deferred key (codes a model emits only on some
// steps).
var keyCodesOpt = omnicache.Key{Name: "codes", RowBytes: 12, Deferred: true, Optional: true}

// countDevice counts the bytes every device call moves or allocates.
type countDevice struct {
	gpu.Device
	dtod, dtoh, htod, alloc atomic.Int64
}

func newCountDevice() *countDevice { return &countDevice{Device: gpu.NewHost()} }

func (d *countDevice) Alloc(n int) (gpu.Buffer, error) {
	d.alloc.Add(int64(n))
	return d.Device.Alloc(n)
}

func (d *countDevice) CopyDtoD(dst gpu.Buffer, dstOff int, src gpu.Buffer, srcOff int, n int) error {
	d.dtod.Add(int64(n))
	return d.Device.CopyDtoD(dst, dstOff, src, srcOff, n)
}

func (d *countDevice) CopyDtoH(dst []byte, src gpu.Buffer, srcOff int) error {
	d.dtoh.Add(int64(len(dst)))
	return d.Device.CopyDtoH(dst, src, srcOff)
}

func (d *countDevice) CopyHtoD(dst gpu.Buffer, dstOff int, src []byte) error {
	d.htod.Add(int64(len(src)))
	return d.Device.CopyHtoD(dst, dstOff, src)
}

// traffic is what a run moved: device bytes per direction, allocations,
// defensive clones, the budget peak and the rows and bytes written.
type traffic struct {
	dtod, dtoh, htod, alloc             int64
	cloned, budgetPeak, rows, bytes, dw int64
}

func trafficOf(h *harness, d *countDevice) traffic {
	h.t.Helper()
	h.sync()
	st := h.stats()
	return traffic{d.dtod.Load(), d.dtoh.Load(), d.htod.Load(), d.alloc.Load(),
		st.ClonedBytes, st.BudgetPeak, st.RowsWritten, st.BytesWritten, st.DeferredWrites}
}

// wantRows checks result i's rows of key k against tags (0: zeros), row by
// row: an explicit check next to the harness's model.
func wantRows(t testing.TB, res *omnicache.Result, i, k, rb int, tags ...tag) {
	t.Helper()
	rows := res.Rows(i, k)
	require.Len(t, rows, len(tags)*rb, "request %d key %d: bytes", res.ID(i), k)
	for j, g := range tags {
		got := rows[j*rb : (j+1)*rb]
		require.True(t, bytes.Equal(got, rowOf(g, rb)), "request %d key %d row %d: got %s, want %s", res.ID(i), k, j, describe(got), g)
	}
}

func tags(k int, id int64, pos0, n, ver int) []tag {
	out := make([]tag, n)
	for j := range out {
		out[j] = mkTag(k, id, pos0+j, ver)
	}
	return out
}

func zeros(n int) []tag { return make([]tag, n) }

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
	kHidden = 0 // keyHidden in every config of this file
	kSecond = 1 // keyAux or keyCodesOpt
)

// prefillTraffic runs request 1's 8-token prefill (blocks 0 and 1) on a
// new cache of keys, omitting the keys omit names, and materializes it;
// finish also finishes the request (its deferred rows land). It returns
// the harness and the traffic up to the Materialize.
func prefillTraffic(t *testing.T, dev, owned bool, keys []omnicache.Key, omit []bool, finish bool) (*harness, traffic) {
	const a = 1
	cd := newCountDevice()
	cfg := testConfig(keys...)
	cfg.Device = cd
	h := newHarness(t, cfg)
	h.device, h.owned = dev, owned
	h.omitKeys = omit
	h.assign(a, 0, 1)
	id := h.step(step{Sched: []S{{a, 0, 8}}, Arrive: []A{{ID: a}}})
	if finish {
		h.discard(h.step(step{Finished: []int64{a}}))
	}
	tr := trafficOf(h, cd)
	h.mat(id)
	return h, tr
}

// An immediate optional key omitted by a prefill step: the step's own rows
// and a later hit over its blocks read zeros for it (the hidden rows are
// exact), and the step moves exactly what a cache without the key moves.
func TestSparseImmediatePrefill(t *testing.T) {
	const a, b = 1, 2
	hb, ab := keyHidden.RowBytes, keyAux.RowBytes
	for _, m := range sparseModes {
		t.Run(m.name, func(t *testing.T) {
			_, alone := prefillTraffic(t, m.dev, m.owned, []omnicache.Key{keyHidden}, nil, false)
			h, sparse := prefillTraffic(t, m.dev, m.owned, []omnicache.Key{keyHidden, keyAux}, []bool{false, true}, false)
			require.Equal(t, alone, sparse, "a step omitting aux moves, clones, charges and writes exactly what a cache without aux does")
			wantRows(t, &h.res, 0, kHidden, hb, tags(kHidden, a, 0, 8, 0)...)
			wantRows(t, &h.res, 0, kSecond, ab, zeros(8)...)

			// B hits A's two blocks and supplies aux for its own row.
			h.omitKeys = nil
			h.assign(b, 0, 1, 2)
			id := h.step(step{Sched: []S{{b, 8, 1}}, Arrive: []A{{ID: b, Hit: 8}}, Finished: []int64{a}})
			h.mat(id)
			wantRows(t, &h.res, 0, kHidden, hb, append(tags(kHidden, a, 0, 8, 0), mkTag(kHidden, b, 8, 0))...)
			wantRows(t, &h.res, 0, kSecond, ab, append(zeros(8), mkTag(kSecond, b, 8, 0))...)
			h.checkMirror()
			h.drain(b)
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
	hb, ab := keyHidden.RowBytes, keyAux.RowBytes
	omitAt := []bool{false, true, true, false} // decode positions 4..7
	for _, m := range sparseModes {
		t.Run(m.name, func(t *testing.T) {
			runBufferOnOff(t, testConfig(keyHidden, keyAux), func(h *harness, buffered bool) {
				h.device, h.owned = m.dev, m.owned
				h.assign(a, 0, 1)
				h.assign(b, 2, 3)
				h.mat(h.step(step{Sched: []S{{a, 0, 4}, {b, 0, 4}}, Arrive: []A{{ID: a}, {ID: b}}}))
				before := h.stats()
				for j, om := range omitAt {
					h.omitKeys = []bool{false, om}
					id := h.step(step{Sched: []S{{a, 4 + j, 1}, {b, 4 + j, 1}}})
					h.mat(id)
					want := []tag{mkTag(kSecond, a, 4+j, 0), mkTag(kSecond, b, 4+j, 0)}
					if om {
						want = zeros(2)
					}
					wantRows(t, &h.res, 0, kSecond, ab, want[0])
					wantRows(t, &h.res, 1, kSecond, ab, want[1])
					wantRows(t, &h.res, 1, kHidden, hb, mkTag(kHidden, b, 4+j, 0))
				}
				h.omitKeys = nil
				st := h.stats()
				if buffered {
					require.EqualValues(t, len(omitAt), st.BufferedSteps-before.BufferedSteps, "the decode steps were parked")
					require.EqualValues(t, 1, st.BufferFlushes-before.BufferFlushes, "one flush wrote the four parked steps")
				}
				// C hits A's two blocks after A finished.
				h.assign(c, 0, 1, 4)
				id := h.step(step{Sched: []S{{c, 8, 1}}, Arrive: []A{{ID: c, Hit: 8}}, Finished: []int64{a}})
				h.mat(id)
				aux := append(tags(kSecond, a, 0, 4, 0), mkTag(kSecond, a, 4, 0), 0, 0, mkTag(kSecond, a, 7, 0), mkTag(kSecond, c, 8, 0))
				wantRows(t, &h.res, 0, kSecond, ab, aux...)
				wantRows(t, &h.res, 0, kHidden, hb, append(tags(kHidden, a, 0, 8, 0), mkTag(kHidden, c, 8, 0))...)
				h.checkMirror()
				h.drain(b, c)
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
	hb, cb := keyHidden.RowBytes, keyCodesOpt.RowBytes
	for _, m := range sparseModes {
		t.Run(m.name, func(t *testing.T) {
			_, alone := prefillTraffic(t, m.dev, m.owned, []omnicache.Key{keyHidden}, nil, true)
			h, sparse := prefillTraffic(t, m.dev, m.owned, []omnicache.Key{keyHidden, keyCodesOpt}, []bool{false, true}, true)
			require.Equal(t, alone, sparse, "a step omitting the deferred key moves, clones, charges and writes exactly what a cache without it does")
			wantRows(t, &h.res, 0, kSecond, cb, zeros(8)...)

			// B hits A's blocks: zeros for codes.
			h.omitKeys = nil
			h.assign(b, 0, 1, 2)
			id := h.step(step{Sched: []S{{b, 8, 1}}, Arrive: []A{{ID: b, Hit: 8}}})
			h.mat(id)
			wantRows(t, &h.res, 0, kSecond, cb, append(zeros(8), mkTag(kSecond, b, 8, 0))...)
			wantRows(t, &h.res, 0, kHidden, hb, append(tags(kHidden, a, 0, 8, 0), mkTag(kHidden, b, 8, 0))...)
			h.discard(h.step(step{Finished: []int64{b}}))

			// C takes block 0 and supplies codes; D hits it after C finished.
			h.unassign(b)
			h.assign(c, 0)
			h.mat(h.step(step{Sched: []S{{c, 0, 4}}, Arrive: []A{{ID: c}}}))
			h.assign(d, 0, 5)
			id = h.step(step{Sched: []S{{d, 4, 1}}, Arrive: []A{{ID: d, Hit: 4}}, Finished: []int64{c}})
			h.mat(id)
			wantRows(t, &h.res, 0, kSecond, cb, append(tags(kSecond, c, 0, 4, 0), mkTag(kSecond, d, 4, 0))...)
			h.drain(d)
			h.checkMirror(kHidden, kSecond)
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
	hb := keyHidden.RowBytes
	t.Run("deferred", func(t *testing.T) {
		cb := keyCodesOpt.RowBytes
		h := newHarness(t, testConfig(keyHidden, keyCodesOpt))
		h.assign(a, 0, 1)
		h.mat(h.step(step{Sched: []S{{a, 0, 4}}, Arrive: []A{{ID: a}}}))
		h.discard(h.step(step{Preempted: []int64{a}}))
		h.unassign(a)
		h.assign(b, 0)
		h.omitKeys = []bool{false, true}
		h.mat(h.step(step{Sched: []S{{b, 0, 4}}, Arrive: []A{{ID: b}}}))
		h.omitKeys = nil
		// Both steps' immediate writes landed before the window: A's, if
		// still queued when B's was, skips the hidden rows B replaces
		// (counted too), which must not fall inside it.
		h.sync()
		before := h.stats()
		h.discard(h.step(step{Finished: []int64{a}})) // A's pending codes land now
		h.sync()
		require.EqualValues(t, 4, h.stats().RowsSkipped-before.RowsSkipped, "A's four pending codes rows lost block 0 to B's omission")
		h.assign(c, 0, 2)
		id := h.step(step{Sched: []S{{c, 4, 1}}, Arrive: []A{{ID: c, Hit: 4}}, Finished: []int64{b}})
		h.mat(id)
		wantRows(t, &h.res, 0, kHidden, hb, append(tags(kHidden, b, 0, 4, 0), mkTag(kHidden, c, 4, 0))...)
		wantRows(t, &h.res, 0, kSecond, cb, append(zeros(4), mkTag(kSecond, c, 4, 0))...)
		h.drain(c)
		h.checkMirror(kHidden, kSecond)
	})
	t.Run("immediate, older write in transit", func(t *testing.T) {
		ab := keyAux.RowBytes
		dev := newLagDevice()
		cfg := testConfig(keyHidden, keyAux)
		cfg.Device = dev
		h := newHarness(t, cfg)
		const old = 9 // block 0's first tenant: the mirror holds its aux rows
		h.assign(old, 0)
		h.mat(h.step(step{Sched: []S{{old, 0, 4}}, Arrive: []A{{ID: old}}}))
		h.sync()
		h.unassign(old)
		h.assign(a, 0)
		stop := dev.hold()
		sa := h.step(step{Sched: []S{{a, 0, 4}}, Arrive: []A{{ID: a}}, Finished: []int64{old}})
		wa := stop()
		h.unassign(a)
		h.assign(b, 0)
		h.omitKeys = []bool{false, true}
		sb := h.step(step{Sched: []S{{b, 0, 4}}, Arrive: []A{{ID: b}}, Finished: []int64{a}})
		h.omitKeys = nil
		dev.release(wa) // A's write lands after B's was queued: it skips block 0
		h.mat(sa)
		h.mat(sb)
		h.assign(c, 0, 2)
		id := h.step(step{Sched: []S{{c, 4, 1}}, Arrive: []A{{ID: c, Hit: 4}}, Finished: []int64{b}})
		h.mat(id)
		wantRows(t, &h.res, 0, kHidden, hb, append(tags(kHidden, b, 0, 4, 0), mkTag(kHidden, c, 4, 0))...)
		wantRows(t, &h.res, 0, kSecond, ab, append(zeros(4), mkTag(kSecond, c, 4, 0))...)
		h.drain(c)
		h.checkMirror()
	})
}

// A slot whose previous tenant wrote the key and whose new tenant omitted
// it: a hit reads zeros (never the old tenant's row); a delayed read
// planned before the omission reads the old rows or fails with
// ErrReassigned, never zeros; a later tenant supplying the key makes the
// row present again.
func TestSparseNewTenantOmits(t *testing.T) {
	const a, b, c, d, e = 1, 2, 3, 4, 5
	hb, ab := keyHidden.RowBytes, keyAux.RowBytes
	for _, split := range []bool{false, true} {
		for _, m := range sparseModes {
			name := m.name
			if split {
				name += ", split reads"
			}
			t.Run(name, func(t *testing.T) {
				dev := newLagDevice()
				cfg := testConfig(keyHidden, keyAux)
				cfg.Device = dev
				if split {
					// Hit reads take the split path (allWritten) when they can.
					defer omnicache.SetSplitBytes(1)()
					cfg.CopyWorkers = 2
				}
				h := newHarness(t, cfg)
				h.device, h.owned = m.dev, m.owned
				h.assign(a, 0)
				h.mat(h.step(step{Sched: []S{{a, 0, 4}}, Arrive: []A{{ID: a}}}))
				// C hits A's block (planned now, read late).
				h.assign(c, 0, 3)
				sc := h.step(step{Sched: []S{{c, 4, 1}}, Arrive: []A{{ID: c, Hit: 4}}, Finished: []int64{a}})
				h.sync()
				// B, the new tenant of block 0, omits aux; its write is held in
				// transit while C's delayed read runs: C reads A's rows.
				h.assign(b, 0)
				h.omitKeys = []bool{false, true}
				stop := dev.hold()
				sb := h.step(step{Sched: []S{{b, 0, 4}}, Arrive: []A{{ID: b}}})
				wb := stop()
				h.omitKeys = nil
				h.mat(sc)
				wantRows(t, &h.res, 0, kSecond, ab, append(tags(kSecond, a, 0, 4, 0), mkTag(kSecond, c, 4, 0))...)
				dev.release(wb)
				h.mat(sb)
				wantRows(t, &h.res, 0, kSecond, ab, zeros(4)...)
				// D hits block 0 after B finished: B's hidden rows, zeros for aux.
				h.assign(d, 0, 4)
				sd := h.step(step{Sched: []S{{d, 4, 1}}, Arrive: []A{{ID: d, Hit: 4}}, Finished: []int64{b, c}})
				h.mat(sd)
				wantRows(t, &h.res, 0, kHidden, hb, append(tags(kHidden, b, 0, 4, 0), mkTag(kHidden, d, 4, 0))...)
				wantRows(t, &h.res, 0, kSecond, ab, append(zeros(4), mkTag(kSecond, d, 4, 0))...)
				h.checkMirror()
				require.True(t, bytes.Equal(h.peek(kSecond, []int32{0, 1, 2, 3}), make([]byte, 4*ab)), "Peek of the omitted rows: zeros, not A's rows")
				// E re-supplies aux for two slots of block 0 (a recompute of
				// positions 0-1 in a new life of block 0), omits it for two.
				h.drain(d)
				h.unassign(b)
				h.assign(e, 0, 5)
				h.mat(h.step(step{Sched: []S{{e, 0, 2}}, Arrive: []A{{ID: e}}}))
				h.omitKeys = []bool{false, true}
				h.mat(h.step(step{Sched: []S{{e, 2, 2}}}))
				h.omitKeys = nil
				const f = 6
				h.assign(f, 0, 6)
				sf := h.step(step{Sched: []S{{f, 4, 1}}, Arrive: []A{{ID: f, Hit: 4}}, Finished: []int64{e}})
				h.mat(sf)
				wantRows(t, &h.res, 0, kSecond, ab, mkTag(kSecond, e, 0, 0), mkTag(kSecond, e, 1, 0), 0, 0, mkTag(kSecond, f, 4, 0))
				wantRows(t, &h.res, 0, kHidden, hb, append(tags(kHidden, e, 0, 4, 0), mkTag(kHidden, f, 4, 0))...)
				h.drain(f)
				h.checkMirror()
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
		{"immediate", []omnicache.Key{keyHidden, keyAux}, kHidden},
		{"deferred", []omnicache.Key{keyHidden, keyAux, keyCodes}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, testConfig(tc.keys...))
			h.assign(a, 0, 1)
			h.mat(h.step(step{Sched: []S{{a, 0, 4}}, Arrive: []A{{ID: a}}}))
			h.mat(h.step(step{Sched: []S{{a, 4, 1}}})) // parked in the decode buffer
			h.sync()
			before := h.stats()
			require.EqualValues(t, 1, before.BufferedSteps)
			decode := step{Sched: []S{{a, 5, 1}}}
			h.begin(decode)
			o := h.outs()
			o.Tensors[tc.k] = omnicache.Tensor{}
			_, err := h.trySave(o)
			require.ErrorIs(t, err, omnicache.ErrOutputs, "a zero tensor for required key %q", tc.keys[tc.k].Name)
			require.ErrorContains(t, err, fmt.Sprintf("%q", tc.keys[tc.k].Name))
			require.Equal(t, before, h.stats(), "the failed Save changed nothing")
			// The step again, correctly: it joins the parked step.
			h.mat(h.step(decode))
			require.EqualValues(t, 2, h.stats().BufferedSteps)
			h.assign(b, 0, 2)
			id := h.step(step{Sched: []S{{b, 4, 1}}, Arrive: []A{{ID: b, Hit: 4}}, Finished: []int64{a}})
			h.mat(id)
			wantRows(t, &h.res, 0, kHidden, keyHidden.RowBytes, append(tags(kHidden, a, 0, 4, 0), mkTag(kHidden, b, 4, 0))...)
			h.drain(b)
			h.checkMirror(allKeys(h)...)
			usable(h)
		})
	}
}
