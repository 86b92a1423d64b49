package omnicache_test

// Plan.PrefetchInto: a prefetched hit read straight into the engine's
// buffers, Materialize into them copying only the step's own rows, and the
// buffers the engine's again once the step is consumed.

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/cachetest"
)

// intoBufs makes one buffer per key of the harness's config for rows rows.
func intoBufs(h *cachetest.Harness, rows int) [][]byte {
	var out [][]byte
	for _, k := range h.Cfg.Keys {
		out = append(out, make([]byte, rows*k.RowBytes))
	}
	return out
}

// intoHit writes request a's 8 tokens, then begins and saves a step in
// which b arrives hitting them and computes 2, with into as its
// PrefetchInto: the step's Result is b's 8 prefix rows and its 2 own.
func intoHit(h *cachetest.Harness, into [][]byte) omnicache.StepID {
	const a, b = 1, 2
	h.Assign(a, 1, 2)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 8}}, Arrive: []cachetest.A{{ID: a}}}))
	h.Assign(b, 1, 2, 3)
	return h.Step(cachetest.Step{Sched: []cachetest.S{{b, 8, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 8}},
		Finished: []int64{a}, PrefetchInto: into})
}

// The prefetch reads the hit's rows into the engine's buffers during the
// forward; Materialize of the whole step into them returns them there,
// every row right, and the prefix rows it found in place are the ones it
// returns.
func TestPrefetchIntoTheEnginesBuffers(t *testing.T) {
	h := cachetest.New(t, cachetest.Config())
	into := intoBufs(h, 10)
	sid := intoHit(h, into)
	h.Sync() // the prefetch ran (it was queued at Begin)
	var before [][]byte
	for k, b := range into {
		rb := h.Cfg.Keys[k].RowBytes
		before = append(before, bytes.Clone(b[:8*rb]))
		if k == 0 {
			require.NotEqual(t, make([]byte, 8*rb), b[:8*rb], "the hit's hidden rows are in the engine's buffer before Materialize")
		}
	}
	h.Res.Into(into)
	h.Mat(sid) // every row checked against the oracle
	for k := range into {
		rb := h.Cfg.Keys[k].RowBytes
		require.Same(t, &into[k][0], &h.Res.Rows(0, k)[0], "key %d: the rows are in the engine's buffer", k)
		require.Equal(t, before[k], h.Res.Rows(0, k)[:8*rb], "key %d: the prefix rows read during the forward", k)
	}
}

// A Result without Into never takes the engine's buffers as its own (the
// cache's buffers are adopted, the engine's are not): its rows are in its
// own memory, right, and the engine's buffers are not written after the
// step was consumed.
func TestPrefetchIntoNotAdopted(t *testing.T) {
	h := cachetest.New(t, cachetest.Config())
	into := intoBufs(h, 10)
	sid := intoHit(h, into)
	h.Mat(sid)
	require.NotSame(t, &into[0][0], &h.Res.Rows(0, 0)[0])
	for k := range into {
		for i := range into[k] {
			into[k][i] = 0xA5
		}
	}
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{2, 10, 1}}})) // the Result's memory is reused, rows right
	for k := range into {
		require.Equal(t, bytes.Repeat([]byte{0xA5}, len(into[k])), into[k], "key %d: untouched once consumed", k)
	}
}

// Buffers too small for the step's rows are not used: the prefetch goes to
// the cache's own buffers, nothing is written into them, and the rows are
// right.
func TestPrefetchIntoTooSmall(t *testing.T) {
	h := cachetest.New(t, cachetest.Config())
	into := intoBufs(h, 9)
	sid := intoHit(h, into)
	h.Sync()
	h.Mat(sid)
	for k := range into {
		require.Equal(t, make([]byte, len(into[k])), into[k], "key %d: a buffer too small is not written", k)
	}
}

// A Materialize of some requests only into buffers overlapping the step's
// PrefetchInto, or of the whole step into them shifted, is ErrOutputs and
// consumes nothing; the whole step into them then serves every row.
func TestPrefetchIntoClash(t *testing.T) {
	h := cachetest.New(t, cachetest.Config())
	into := intoBufs(h, 12)
	sid := intoHit(h, into)
	h.Sync() // the prefetch ran: the counters hold still
	st := h.Stats()
	var res omnicache.Result
	res.Into(into)
	require.ErrorIs(t, h.C.Materialize(sid, []int64{2}, &res), omnicache.ErrOutputs, "some requests only")
	shifted := [][]byte{into[0][h.Cfg.Keys[0].RowBytes:], into[1]}
	res.Into(shifted)
	require.ErrorIs(t, h.C.Materialize(sid, nil, &res), omnicache.ErrOutputs, "the whole step, shifted by a row")
	require.Equal(t, st, h.Stats(), "nothing changed")
	h.Res.Into(into)
	h.Mat(sid)
	require.Same(t, &into[0][0], &h.Res.Rows(0, 0)[0])
}

// A plan with another number of PrefetchInto buffers than keys is ErrPlan
// and registers nothing.
func TestPrefetchIntoWrongCount(t *testing.T) {
	h := cachetest.New(t, cachetest.Config())
	h.Assign(1, 1, 2)
	err := h.TryBegin(cachetest.Step{Sched: []cachetest.S{{1, 0, 8}}, Arrive: []cachetest.A{{ID: 1}},
		PrefetchInto: [][]byte{make([]byte, 8*cachetest.KeyHidden.RowBytes)}})
	require.ErrorIs(t, err, omnicache.ErrPlan)
	require.Zero(t, h.Stats().LiveRequests)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{1, 0, 8}}, Arrive: []cachetest.A{{ID: 1}}}))
}

// Discard, Abort and a Materialize of a prefetched step return only once
// no read writes into its PrefetchInto buffers: the engine writes them at
// once (the race detector sees a read still running), and a later Sync
// finds its own bytes there.
func TestPrefetchIntoSettles(t *testing.T) {
	const rb, hit, bs = 64 << 10, 256, 16 // 16 MiB of hit rows a step: a read that takes a while
	c, err := omnicache.New(omnicache.Config{NumBlocks: 2 * (hit/bs + 1), BlockSize: bs,
		Keys: []omnicache.Key{{Name: "hidden", RowBytes: rb}}, StagingCapacityTokens: hit + bs,
		ReadAheadBytes: 4 * (hit + bs) * rb})
	require.NoError(t, err)
	defer c.Close()
	const stride = hit/bs + 1
	table := make([]int32, 2*stride)
	for i := range table {
		table[i] = int32(i % stride) // both rows: blocks 0..16
	}
	rows := make([]byte, hit*rb)
	for i := range rows {
		rows[i] = byte(i/rb) + 1
	}
	// request 1 writes the 256 tokens the later requests hit
	require.NoError(t, c.Begin(&omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{hit},
		Table: table, Stride: stride, Arrivals: []int64{1}, HitTokens: []int32{0}}))
	id, err := c.Save(&omnicache.Outputs{Tokens: hit, Tensors: []omnicache.Tensor{{Host: rows, Rows: hit}}})
	require.NoError(t, err)
	require.NoError(t, c.Discard(id))
	hitBlocks := make([]int32, hit/bs)
	for i := range hitBlocks {
		hitBlocks[i] = int32(i)
	}
	own := make([]byte, bs*rb)
	into := make([]byte, (hit+bs)*rb)
	next := int64(2)
	step := func() {
		plan := &omnicache.Plan{IDs: []int64{next}, Rows: []int32{1}, Start: []int32{hit}, Count: []int32{bs},
			Table: table, Stride: stride, Arrivals: []int64{next}, HitTokens: []int32{hit}, HitBlocks: hitBlocks,
			Finished: []int64{next - 1}, PrefetchInto: [][]byte{into}}
		if next == 2 {
			plan.Finished = nil
		}
		next++
		require.NoError(t, c.Begin(plan))
	}
	scribble := func(what string, b byte) {
		for i := range into {
			into[i] = b
		}
		require.NoError(t, c.Sync())
		time.Sleep(time.Millisecond)
		require.Equal(t, bytes.Repeat([]byte{b}, len(into)), into, "%s: nothing written into the buffers after it returned", what)
	}
	save := func() omnicache.StepID {
		id, err := c.Save(&omnicache.Outputs{Tokens: bs, Tensors: []omnicache.Tensor{{Host: own, Rows: bs}}})
		require.NoError(t, err)
		return id
	}
	for i := 0; i < 4; i++ {
		step()
		require.NoError(t, c.Discard(save()))
		scribble("Discard", 0xD1)

		step()
		require.NoError(t, c.Abort())
		scribble("Abort", 0xAB)

		step()
		var res omnicache.Result
		res.Into([][]byte{make([]byte, len(into))}) // other buffers: the prefix is copied out of the engine's
		require.NoError(t, c.Materialize(save(), nil, &res))
		require.Equal(t, rows, res.Rows(0, 0)[:hit*rb], "the hit rows")
		scribble("Materialize", 0x3C)
	}
}
