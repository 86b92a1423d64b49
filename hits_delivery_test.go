package omnicache_test

// Delivery: what Materialize delivers to a request over its steps is its
// rows with no gap and no repeat, whatever came between: rejected draft
// tokens (speculative decoding), a replaced prompt, a preemption and a
// resume with or without a hit. A raw-API world (dworld) whose rows the
// test recomputes.

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
)

// A delivery world: one key of 8-byte rows over blocks of 4 tokens; row
// (request, position, version) is content the test can recompute, so the
// rows delivered to each request can be checked against a run without
// rejection or replacement.
type dworld struct {
	t     *testing.T
	c     *omnicache.Cache
	table []int32
	got   map[int64][]byte // everything Materialize delivered, per request, in order
	from  map[int64]int    // the position delivery is at, per request
	res   omnicache.Result
}

const (
	dRow    = 8
	dStride = 8
)

func drow(id int64, pos, ver int) []byte {
	b := make([]byte, dRow)
	for i := range b {
		b[i] = byte(int(id)*41 + pos*7 + ver*101 + i)
	}
	return b
}

func newDWorld(t *testing.T, keys ...omnicache.Key) *dworld {
	if len(keys) == 0 {
		keys = []omnicache.Key{{Name: "hidden", RowBytes: dRow}}
	}
	c, err := omnicache.New(omnicache.Config{NumBlocks: 32, BlockSize: 4, Keys: keys})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	w := &dworld{t: t, c: c, table: make([]int32, 8*dStride), got: map[int64][]byte{}, from: map[int64]int{}}
	for r := 0; r < 8; r++ {
		for j := 0; j < dStride; j++ {
			w.table[r*dStride+j] = int32(r*4 + j%4) // request r+1 owns blocks 4r..4r+3
		}
	}
	return w
}

// dreq is one scheduled request: tokens [start, start+n) of content
// version ver, accepted of them (-1: all).
type dreq struct {
	id         int64
	start, n   int
	ver        int
	accepted   int
	arrive     bool
	hitBlocks  []int32
	rowsFromV1 bool
}

// step begins and saves one step; the returned id is unconsumed.
func (w *dworld) step(p *omnicache.Plan, reqs ...dreq) (omnicache.StepID, error) {
	p.Table, p.Stride = w.table, dStride
	var rows []byte
	var acc []int32
	anyAcc := false
	n := 0
	for _, r := range reqs {
		p.IDs = append(p.IDs, r.id)
		p.Rows = append(p.Rows, int32(r.id-1))
		p.Start = append(p.Start, int32(r.start))
		p.Count = append(p.Count, int32(r.n))
		if r.arrive {
			p.Arrivals = append(p.Arrivals, r.id)
			p.HitTokens = append(p.HitTokens, int32(4*len(r.hitBlocks)))
			p.HitBlocks = append(p.HitBlocks, r.hitBlocks...)
		}
		for pos := r.start; pos < r.start+r.n; pos++ {
			ver := r.ver
			if r.accepted >= 0 && pos >= r.start+r.accepted {
				ver = 99 // a rejected draft's row: must never be delivered or hit
			}
			rows = append(rows, drow(r.id, pos, ver)...)
		}
		a := r.n
		if r.accepted >= 0 {
			a, anyAcc = r.accepted, true
		}
		acc = append(acc, int32(a))
		n += r.n
	}
	if err := w.c.Begin(p); err != nil {
		return 0, err
	}
	o := &omnicache.Outputs{Tokens: n, Padded: n, Tensors: []omnicache.Tensor{{Host: rows, Rows: n}}}
	if anyAcc {
		o.Accepted = acc
	}
	return w.c.Save(o)
}

// mat materializes step id and appends what it delivered, checking that
// each request's rows start where its delivery is.
func (w *dworld) mat(id omnicache.StepID) {
	w.t.Helper()
	require.NoError(w.t, w.c.Materialize(id, nil, &w.res))
	for i := 0; i < w.res.Len(); i++ {
		rid := w.res.ID(i)
		if w.res.Tokens(i) == 0 {
			continue
		}
		require.Equal(w.t, w.from[rid], w.res.From(i), "request %d: delivered from position %d, delivery is at %d", rid, w.res.From(i), w.from[rid])
		w.got[rid] = append(w.got[rid], w.res.Rows(i, 0)...)
		w.from[rid] += w.res.Tokens(i)
	}
}

// want is request id's rows over [0, n), position p of content version
// ver(p).
func want(id int64, n int, ver func(pos int) int) []byte {
	var b []byte
	for pos := 0; pos < n; pos++ {
		b = append(b, drow(id, pos, ver(pos))...)
	}
	return b
}

func v1(int) int { return 1 }

// Speculative decoding: the rows of rejected drafts are never delivered,
// the accepted ones are, and what each request received is its rows with
// no gap and no repeat; a hit over a block holding a rejected draft's slot
// before it is written again fails instead of serving that row.
func TestSpecDecodeRejectedRows(t *testing.T) {
	w := newDWorld(t)
	a := int64(1)
	id, err := w.step(&omnicache.Plan{}, dreq{id: a, start: 0, n: 4, ver: 1, accepted: -1, arrive: true})
	require.NoError(t, err)
	w.mat(id)
	// Positions 4..6 scheduled (one token and two drafts), two accepted.
	id, err = w.step(&omnicache.Plan{}, dreq{id: a, start: 4, n: 3, ver: 1, accepted: 2})
	require.NoError(t, err)
	w.mat(id)
	require.Equal(t, 2, w.res.Tokens(0), "two accepted rows delivered")
	// Request 2 hits block 1 (positions 4..7 of request 1: 4, 5 written,
	// 6 a rejected draft's, 7 never written): no row of it is served.
	id, err = w.step(&omnicache.Plan{}, dreq{id: 2, start: 8, n: 1, ver: 1, accepted: -1, arrive: true, hitBlocks: []int32{0, 1}})
	require.NoError(t, err)
	err = w.c.Materialize(id, nil, &w.res)
	require.Error(t, err, "a hit over a rejected draft's slot")
	require.False(t, bytes.Contains(w.res.Rows(0, 0), drow(a, 6, 99)), "the rejected row was served")
	// Request 1 goes on from position 6: 6 and 7 (both accepted), then a
	// draft step rejecting everything but its first token.
	id, err = w.step(&omnicache.Plan{}, dreq{id: a, start: 6, n: 2, ver: 1, accepted: 2})
	require.NoError(t, err)
	w.mat(id)
	id, err = w.step(&omnicache.Plan{}, dreq{id: a, start: 8, n: 4, ver: 1, accepted: 1})
	require.NoError(t, err)
	w.mat(id)
	id, err = w.step(&omnicache.Plan{}, dreq{id: a, start: 9, n: 3, ver: 1, accepted: 0})
	require.NoError(t, err)
	w.mat(id)
	require.Equal(t, want(a, 9, v1), w.got[a], "delivered rows of request 1")
	// Now block 1 is written whole with accepted rows: a hit serves them.
	id, err = w.step(&omnicache.Plan{}, dreq{id: 3, start: 8, n: 1, ver: 1, accepted: -1, arrive: true, hitBlocks: []int32{0, 1}})
	require.NoError(t, err)
	require.NoError(t, w.c.Materialize(id, nil, &w.res))
	require.Equal(t, want(a, 8, v1), w.res.Rows(0, 0)[:8*dRow], "the hit serves the accepted rows")
}

// Accepted counts are checked before anything is applied: a refused Save
// undoes its Begin (as any refused Save) and the step can be saved again.
func TestSpecDecodeErrors(t *testing.T) {
	w := newDWorld(t)
	before := w.c.Stats()
	p := func() *omnicache.Plan { return &omnicache.Plan{} }
	for _, bad := range [][]int32{{4}, {-1}, {1, 1}} {
		require.NoError(t, w.c.Begin(&omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{3},
			Table: w.table, Stride: dStride, Arrivals: []int64{1}, HitTokens: []int32{0}}))
		_, err := w.c.Save(&omnicache.Outputs{Tokens: 3, Padded: 3, Tensors: []omnicache.Tensor{{Host: make([]byte, 3*dRow), Rows: 3}}, Accepted: bad})
		require.ErrorIs(t, err, omnicache.ErrOutputs, "accepted %v", bad)
	}
	after := w.c.Stats()
	require.Equal(t, before.Steps, after.Steps)
	require.Zero(t, after.LiveRequests)
	id, err := w.step(p(), dreq{id: 1, start: 0, n: 3, ver: 1, accepted: -1, arrive: true})
	require.NoError(t, err)
	w.mat(id)
	// A decode step of one token a request rejects nothing.
	id, err = w.step(p(), dreq{id: 1, start: 3, n: 1, ver: 1, accepted: -1})
	require.NoError(t, err)
	w.mat(id)
	_, err = w.step(p(), dreq{id: 1, start: 4, n: 1, ver: 1, accepted: 0})
	require.ErrorIs(t, err, omnicache.ErrOutputs)
}

// Replaced prompts: rows from the replaced position on are not delivered
// from steps saved before (even materialized late), delivery restarts
// there with the new content, and a replace of an unknown request or past
// the request's length is ErrPlan and changes nothing.
func TestReplacedPrompt(t *testing.T) {
	w := newDWorld(t)
	a := int64(1)
	id, err := w.step(&omnicache.Plan{}, dreq{id: a, start: 0, n: 8, ver: 1, accepted: -1, arrive: true})
	require.NoError(t, err)
	w.mat(id)
	late, err := w.step(&omnicache.Plan{}, dreq{id: a, start: 8, n: 1, ver: 1, accepted: -1}) // consumed after the replace
	require.NoError(t, err)
	before := w.c.Stats()
	for _, bad := range []*omnicache.Plan{
		{Replaced: []int64{7}, ReplacedFrom: []int32{0}},    // not live
		{Replaced: []int64{a}, ReplacedFrom: []int32{10}},   // past its 9 tokens
		{Replaced: []int64{a}, ReplacedFrom: []int32{-1}},   // negative
		{Replaced: []int64{a}, ReplacedFrom: []int32{1, 2}}, // lengths
	} {
		bad.Table, bad.Stride = w.table, dStride
		require.ErrorIs(t, w.c.Begin(bad), omnicache.ErrPlan, "%+v", bad.Replaced)
	}
	after := w.c.Stats()
	require.Equal(t, []any{before.Steps, before.WriteTasks, before.BufferedSteps, before.LiveRequests},
		[]any{after.Steps, after.WriteTasks, after.BufferedSteps, after.LiveRequests}, "a refused replace changed the cache")
	// The prompt's tokens from 6 on are replaced: recompute 6..9 anew.
	id, err = w.step(&omnicache.Plan{Replaced: []int64{a}, ReplacedFrom: []int32{6}}, dreq{id: a, start: 6, n: 4, ver: 2, accepted: -1})
	require.NoError(t, err)
	require.NoError(t, w.c.Materialize(late, nil, &w.res)) // the old position 8: left out
	require.Equal(t, 0, w.res.Tokens(0), "a step saved before the replace delivers none of the replaced rows")
	w.from[a] = 6 // delivery restarts at the replaced position
	w.got[a] = w.got[a][:6*dRow]
	w.mat(id)
	ver := func(pos int) int {
		if pos >= 6 {
			return 2
		}
		return 1
	}
	require.Equal(t, want(a, 10, ver), w.got[a])
	// A hit over the request's blocks now serves the new rows.
	id, err = w.step(&omnicache.Plan{}, dreq{id: 2, start: 8, n: 1, ver: 1, accepted: -1, arrive: true, hitBlocks: []int32{0, 1}})
	require.NoError(t, err)
	require.NoError(t, w.c.Materialize(id, nil, &w.res))
	require.Equal(t, want(a, 8, ver), w.res.Rows(0, 0)[:8*dRow])
}

// A preempted request that resumes — with no hit, a hit shorter than what
// it was delivered, or one longer — receives exactly the rows after what
// it had: the concatenation of everything Materialize delivered to it is
// its rows with no gap and no repeat, as in a run without preemption.
func TestResumeDelivery(t *testing.T) {
	for _, tc := range []struct {
		name      string
		hitBlocks []int32 // the resumed request's hit (its own blocks)
		discard   bool    // its last step before the preemption is discarded: delivered 8, computed 12
	}{
		{"no hit", nil, false},
		{"hit shorter than delivered", []int32{0}, false},
		{"hit as long as delivered", []int32{0, 1, 2}, false},
		{"hit longer than delivered", []int32{0, 1, 2}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newDWorld(t)
			a := int64(1)
			id, err := w.step(&omnicache.Plan{}, dreq{id: a, start: 0, n: 8, ver: 1, accepted: -1, arrive: true})
			require.NoError(t, err)
			w.mat(id)
			id, err = w.step(&omnicache.Plan{}, dreq{id: a, start: 8, n: 4, ver: 1, accepted: -1})
			require.NoError(t, err)
			if tc.discard {
				require.NoError(t, w.c.Discard(id)) // rows 8..11 computed, never delivered
			} else {
				w.mat(id)
			}
			// Preempted (its blocks stay cached), another request runs, then
			// it resumes: recomputing from its hit, or from 0.
			id, err = w.step(&omnicache.Plan{Preempted: []int64{a}}, dreq{id: 2, start: 0, n: 4, ver: 1, accepted: -1, arrive: true})
			require.NoError(t, err)
			w.mat(id)
			hit := 4 * len(tc.hitBlocks)
			p := &omnicache.Plan{Resumed: []int64{a}}
			r := dreq{id: a, start: hit, n: 14 - hit, ver: 1, accepted: -1}
			if hit > 0 {
				r.arrive, r.hitBlocks = true, tc.hitBlocks
			}
			id, err = w.step(p, r)
			require.NoError(t, err)
			w.mat(id)
			id, err = w.step(&omnicache.Plan{}, dreq{id: a, start: 14, n: 1, ver: 1, accepted: -1})
			require.NoError(t, err)
			w.mat(id)
			require.Equal(t, want(a, 15, v1), w.got[a], "what request 1 received, in order")
		})
	}
}

// A resumed request's arrival with a hit must be scheduled from its hit
// length, as any arrival's.
func TestResumeHitStart(t *testing.T) {
	w := newDWorld(t)
	id, err := w.step(&omnicache.Plan{}, dreq{id: 1, start: 0, n: 8, ver: 1, accepted: -1, arrive: true})
	require.NoError(t, err)
	w.mat(id)
	id, err = w.step(&omnicache.Plan{Preempted: []int64{1}}, dreq{id: 2, start: 0, n: 4, ver: 1, accepted: -1, arrive: true})
	require.NoError(t, err)
	w.mat(id)
	_, err = w.step(&omnicache.Plan{Resumed: []int64{1}}, dreq{id: 1, start: 0, n: 4, ver: 1, accepted: -1, arrive: true, hitBlocks: []int32{0}})
	require.ErrorIs(t, err, omnicache.ErrPlan)
}

// matHeld materializes step id on another goroutine into res, holding it
// once it took the step, before it reads it; done yields its error once
// release let it go on.
func (w *dworld) matHeld(id omnicache.StepID, res *omnicache.Result) (release func(), done <-chan error) {
	w.t.Helper()
	held, release := omnicache.HoldMaterialize(w.c)
	ch := make(chan error, 1)
	go func() { ch <- w.c.Materialize(id, nil, res) }()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		w.t.Fatal("the Materialize did not take its step")
	}
	w.t.Cleanup(release)
	return release, ch
}

// A Materialize is taken, read, then delivered: while it reads, a later
// step of a resumed request leaves out the rows it will deliver (no
// repeat), and once served its request's delivery is at the end of its
// rows.
func TestDeliveryOfAStepBeingRead(t *testing.T) {
	w := newDWorld(t)
	a := int64(1)
	first, err := w.step(&omnicache.Plan{}, dreq{id: a, start: 0, n: 8, ver: 1, accepted: -1, arrive: true})
	require.NoError(t, err)
	id, err := w.step(&omnicache.Plan{Preempted: []int64{a}}, dreq{id: 2, start: 0, n: 4, ver: 1, accepted: -1, arrive: true})
	require.NoError(t, err)
	w.mat(id)
	resumed, err := w.step(&omnicache.Plan{Resumed: []int64{a}}, dreq{id: a, start: 0, n: 9, ver: 1, accepted: -1})
	require.NoError(t, err)

	var res omnicache.Result
	release, done := w.matHeld(first, &res)
	require.Zero(t, omnicache.Delivered(w.c, a), "nothing recorded before the read")
	require.NoError(t, w.c.Materialize(resumed, nil, &w.res))
	require.Equal(t, []int{8, 1}, []int{w.res.From(0), w.res.Tokens(0)}, "the rows the step being read delivers are left out")
	release()
	require.NoError(t, <-done)
	require.Equal(t, []int{0, 8}, []int{res.From(0), res.Tokens(0)})
	require.Equal(t, want(a, 9, v1), append(append([]byte(nil), res.Rows(0, 0)...), w.res.Rows(0, 0)...))
	require.EqualValues(t, 9, omnicache.Delivered(w.c, a))
}

// A replace while a step of the request is being read: the step, taken
// before, delivers its rows, but its delivery counts only up to the
// replaced position; an Abort of the replace's Begin (before the read
// ends or after) makes it count whole again.
func TestReplaceWhileAStepIsRead(t *testing.T) {
	for _, tc := range []struct {
		name           string
		abort          bool
		abortWhileHeld bool
	}{{"saved", false, false}, {"aborted after the read", true, false}, {"aborted during the read", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newDWorld(t)
			a := int64(1)
			first, err := w.step(&omnicache.Plan{}, dreq{id: a, start: 0, n: 8, ver: 1, accepted: -1, arrive: true})
			require.NoError(t, err)
			var res omnicache.Result
			release, done := w.matHeld(first, &res)
			p := &omnicache.Plan{Replaced: []int64{a}, ReplacedFrom: []int32{4}, IDs: []int64{a}, Rows: []int32{0},
				Start: []int32{4}, Count: []int32{2}, Table: w.table, Stride: dStride}
			require.NoError(t, w.c.Begin(p))
			if tc.abortWhileHeld {
				require.NoError(t, w.c.Abort())
			}
			release()
			require.NoError(t, <-done)
			require.Equal(t, want(a, 8, v1), res.Rows(0, 0), "taken before the replace: its rows whole")
			wantPos := int32(8)
			switch {
			case tc.abortWhileHeld:
			case tc.abort:
				require.EqualValues(t, 4, omnicache.Delivered(w.c, a), "counted up to the replaced position")
				require.NoError(t, w.c.Abort())
			default:
				wantPos = 4
				rows := append(drow(a, 4, 2), drow(a, 5, 2)...)
				id, err := w.c.Save(&omnicache.Outputs{Tokens: 2, Padded: 2, Tensors: []omnicache.Tensor{{Host: rows, Rows: 2}}})
				require.NoError(t, err)
				require.EqualValues(t, wantPos, omnicache.Delivered(w.c, a))
				require.NoError(t, w.c.Materialize(id, nil, &w.res))
				require.Equal(t, []int{4, 2}, []int{w.res.From(0), w.res.Tokens(0)}, "delivery restarts at the replaced position")
				wantPos = 6
			}
			require.Equal(t, wantPos, omnicache.Delivered(w.c, a))
		})
	}
}
