package omnicache_test

// Plan.ResultInto: a prefetched hit read straight into the engine's
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
// ResultInto: the step's Result is b's 8 prefix rows and its 2 own.
func intoHit(h *cachetest.Harness, into [][]byte) omnicache.StepID {
	return hitStep(h, cachetest.Step{ResultInto: into})
}

// hitStep is intoHit with the hit step's result buffers (ResultInto or
// ResultDev) taken from with.
func hitStep(h *cachetest.Harness, with cachetest.Step) omnicache.StepID {
	const a, b = 1, 2
	h.Assign(a, 1, 2)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 8}}, Arrive: []cachetest.A{{ID: a}}}))
	h.Assign(b, 1, 2, 3)
	return h.Step(cachetest.Step{Sched: []cachetest.S{{b, 8, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 8}},
		Finished: []int64{a}, ResultInto: with.ResultInto, ResultDev: with.ResultDev})
}

// The prefetch reads the hit's rows into the engine's buffers during the
// forward; Materialize of the whole step into them returns them there,
// every row right, and the prefix rows it found in place are the ones it
// returns.
func TestResultIntoTheEnginesBuffers(t *testing.T) {
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
func TestResultIntoNotAdopted(t *testing.T) {
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
func TestResultIntoTooSmall(t *testing.T) {
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
// ResultInto, or of the whole step into them shifted, is ErrOutputs and
// consumes nothing; the whole step into them then serves every row.
func TestResultIntoClash(t *testing.T) {
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

// A plan with another number of ResultInto buffers than keys is ErrPlan
// and registers nothing.
func TestResultIntoWrongCount(t *testing.T) {
	h := cachetest.New(t, cachetest.Config())
	h.Assign(1, 1, 2)
	err := h.TryBegin(cachetest.Step{Sched: []cachetest.S{{1, 0, 8}}, Arrive: []cachetest.A{{ID: 1}},
		ResultInto: [][]byte{make([]byte, 8*cachetest.KeyHidden.RowBytes)}})
	require.ErrorIs(t, err, omnicache.ErrPlan)
	require.Zero(t, h.Stats().LiveRequests)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{1, 0, 8}}, Arrive: []cachetest.A{{ID: 1}}}))
}

// Discard, Abort and a Materialize of a prefetched step return only once
// no read writes into its ResultInto buffers: the engine writes them at
// once (the race detector sees a read still running), and a later Sync
// finds its own bytes there.
func TestResultIntoSettles(t *testing.T) {
	settles(t, func(p *omnicache.Plan, buf []byte) { p.ResultInto = [][]byte{buf} },
		func(c *omnicache.Cache, id omnicache.StepID, buf []byte) []byte {
			var res omnicache.Result
			res.Into([][]byte{make([]byte, len(buf))}) // other buffers: the prefix is copied out of the engine's
			require.NoError(t, c.Materialize(id, nil, &res))
			return res.Rows(0, 0)
		})
}

// settles runs the Settles tests: a hit step of 16 MiB of prefix rows
// (a read that takes a while), begun with the engine's buffer buf (set
// puts it in the plan), is discarded, aborted, then materialized (mat,
// which returns the rows it served); after each the test writes buf at
// once and requires, after a Sync, to find only its own bytes there.
func settles(t *testing.T, set func(p *omnicache.Plan, buf []byte), mat func(c *omnicache.Cache, id omnicache.StepID, buf []byte) []byte) {
	const rb, hit, bs = 64 << 10, 256, 16
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
	own := bytes.Repeat([]byte{0x77}, bs*rb)
	buf := make([]byte, (hit+bs)*rb)
	next := int64(2)
	step := func() {
		plan := &omnicache.Plan{IDs: []int64{next}, Rows: []int32{1}, Start: []int32{hit}, Count: []int32{bs},
			Table: table, Stride: stride, Arrivals: []int64{next}, HitTokens: []int32{hit}, HitBlocks: hitBlocks,
			Finished: []int64{next - 1}}
		set(plan, buf)
		if next == 2 {
			plan.Finished = nil
		}
		next++
		require.NoError(t, c.Begin(plan))
	}
	scribble := func(what string, b byte) {
		for i := range buf {
			buf[i] = b
		}
		require.NoError(t, c.Sync())
		time.Sleep(time.Millisecond)
		require.Equal(t, bytes.Repeat([]byte{b}, len(buf)), buf, "%s: nothing written into the buffers after it returned", what)
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
		got := mat(c, save(), buf)
		require.Equal(t, rows, got[:hit*rb], "the hit rows")
		require.Equal(t, own, got[hit*rb:], "the step's rows")
		scribble("Materialize", 0x3C)
	}
}

// A prefill of more than 4 MiB with ResultInto: Save copies its rows into
// the engine's buffer while the committer writes them to the mirror from
// the engine's tensor, and returns once both are done: the engine
// overwrites its tensor at once (the race detector sees a committer still
// reading it), Materialize into the buffer copies nothing and returns the
// rows, and a later hit over the blocks reads the rows the step computed.
// The hit step, its only hit its first request's, has its prefix
// prefetched and its own rows saved into its buffer the same way.
func TestResultIntoSavesTheStepsRows(t *testing.T) {
	const rb, n, bs = 64 << 10, 128, 16 // 8 MiB of rows a step
	const stride = 2 * n / bs
	c, err := omnicache.New(omnicache.Config{NumBlocks: 2 * stride, BlockSize: bs,
		Keys: []omnicache.Key{{Name: "hidden", RowBytes: rb}}, StagingCapacityTokens: n,
		ReadAheadBytes: 4 * 2 * n * rb})
	require.NoError(t, err)
	defer c.Close()
	table := make([]int32, 2*stride)
	for i := range table {
		table[i] = int32(i % stride) // both rows: blocks 0..15
	}
	fill := func(b []byte, seed byte) {
		for i := range b {
			b[i] = byte(i/rb) + seed
		}
	}
	out := make([]byte, n*rb)
	want := make([]byte, n*rb)
	fill(out, 1)
	copy(want, out)
	into := make([]byte, n*rb)
	require.NoError(t, c.Begin(&omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{n},
		Table: table, Stride: stride, Arrivals: []int64{1}, HitTokens: []int32{0}, ResultInto: [][]byte{into}}))
	id, err := c.Save(&omnicache.Outputs{Tokens: n, Tensors: []omnicache.Tensor{{Host: out, Rows: n}}})
	require.NoError(t, err)
	require.Equal(t, want, into, "the rows are in the engine's buffer when Save returns")
	fill(out, 9) // the engine's next forward
	var res omnicache.Result
	res.Into([][]byte{into})
	require.NoError(t, c.Materialize(id, nil, &res))
	require.Same(t, &into[0], &res.Rows(0, 0)[0])
	require.Equal(t, want, res.Rows(0, 0))

	// request 2 hits request 1's first 64 tokens and computes 64 more
	const hit = n / 2
	hitBlocks := make([]int32, hit/bs)
	for i := range hitBlocks {
		hitBlocks[i] = int32(i)
	}
	into2 := make([]byte, (hit+n)*rb)
	require.NoError(t, c.Begin(&omnicache.Plan{IDs: []int64{2}, Rows: []int32{1}, Start: []int32{hit}, Count: []int32{n},
		Table: table, Stride: stride, Arrivals: []int64{2}, HitTokens: []int32{hit}, HitBlocks: hitBlocks,
		Finished: []int64{1}, ResultInto: [][]byte{into2}}))
	fill(out, 40)
	copy(want, out)
	id, err = c.Save(&omnicache.Outputs{Tokens: n, Tensors: []omnicache.Tensor{{Host: out, Rows: n}}})
	require.NoError(t, err)
	fill(out, 77)
	res.Into([][]byte{into2})
	require.NoError(t, c.Materialize(id, nil, &res))
	require.Same(t, &into2[0], &res.Rows(0, 0)[0])
	got := res.Rows(0, 0)
	first := make([]byte, hit*rb)
	fill(first, 1)
	require.Equal(t, first, got[:hit*rb], "the hit prefix: request 1's rows")
	require.Equal(t, want, got[hit*rb:], "the step's own rows")
}

// Save with ResultInto rows returns only once the committer has written
// them from the engine's tensor: held at the write's device event, the
// committer keeps Save waiting; released, Save returns, and the rows
// written are the step's, whatever the engine writes into its tensor then.
func TestResultIntoSaveWaitsForTheWrite(t *testing.T) {
	const rb, n, bs = 64 << 10, 128, 16
	const stride = n/bs + 1
	dev := cachetest.NewGateDevice()
	c, err := omnicache.New(omnicache.Config{NumBlocks: 2 * stride, BlockSize: bs, Device: dev,
		Keys: []omnicache.Key{{Name: "hidden", RowBytes: rb}}, StagingCapacityTokens: n})
	require.NoError(t, err)
	defer c.Close()
	table := make([]int32, 2*stride)
	for i := range table {
		table[i] = int32(i % stride) // both rows: blocks 0..7, then 8 (row 0) and 17 (row 1)
	}
	table[2*stride-1] = 2*stride - 1
	out, want, into := make([]byte, n*rb), make([]byte, n*rb), make([]byte, n*rb)
	for i := range out {
		out[i] = byte(i/rb) + 3
	}
	copy(want, out)
	require.NoError(t, c.Begin(&omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{n},
		Table: table, Stride: stride, Arrivals: []int64{1}, HitTokens: []int32{0}, ResultInto: [][]byte{into}}))
	stop := dev.Hold()
	done := make(chan error, 1)
	var id omnicache.StepID
	go func() {
		var err error
		id, err = c.Save(&omnicache.Outputs{Tokens: n, Tensors: []omnicache.Tensor{{Host: out, Rows: n}}})
		done <- err
	}()
	require.True(t, dev.WaitEntered(5*time.Second), "the committer waits at the write's event")
	select {
	case err := <-done:
		t.Fatalf("Save returned (%v) while its write had not landed", err)
	case <-time.After(100 * time.Millisecond):
	}
	dev.Release(stop())
	require.NoError(t, <-done)
	clear(out) // the engine's next forward
	var res omnicache.Result
	res.Into([][]byte{into})
	require.NoError(t, c.Materialize(id, nil, &res))
	require.Equal(t, want, res.Rows(0, 0))
	// the mirror holds the step's rows: a hit on them reads them back
	hitBlocks := []int32{0, 1, 2, 3, 4, 5, 6, 7}
	require.NoError(t, c.Begin(&omnicache.Plan{IDs: []int64{2}, Rows: []int32{1}, Start: []int32{n}, Count: []int32{1},
		Table: table, Stride: stride, Arrivals: []int64{2}, HitTokens: []int32{n}, HitBlocks: hitBlocks, Finished: []int64{1}}))
	id, err = c.Save(&omnicache.Outputs{Tokens: 1, Tensors: []omnicache.Tensor{{Host: out[:rb], Rows: 1}}})
	require.NoError(t, err)
	res.Into(nil)
	require.NoError(t, c.Materialize(id, nil, &res))
	require.Equal(t, want, res.Rows(0, 0)[:n*rb])
}

// A step whose own rows Save put into its ResultInto buffers (no hit, so
// no prefetch) guards them as a prefetched one does: a Materialize of its
// requests in another order into those buffers is ErrOutputs and consumes
// nothing (it would copy one request's rows over the other's before they
// are read); the whole step into them then serves every row.
func TestResultIntoSavedRowsClash(t *testing.T) {
	const rb, n, bs = 64 << 10, 64, 16 // two requests of 64 tokens: 8 MiB
	const stride = n / bs
	c, err := omnicache.New(omnicache.Config{NumBlocks: 2 * stride, BlockSize: bs,
		Keys: []omnicache.Key{{Name: "hidden", RowBytes: rb}}, StagingCapacityTokens: 2 * n})
	require.NoError(t, err)
	defer c.Close()
	table := make([]int32, 2*stride)
	for i := range table {
		table[i] = int32(i)
	}
	out, want := make([]byte, 2*n*rb), make([]byte, 2*n*rb)
	for i := range out {
		out[i] = byte(i/rb) + 1
	}
	copy(want, out)
	into := make([]byte, 2*n*rb)
	require.NoError(t, c.Begin(&omnicache.Plan{IDs: []int64{1, 2}, Rows: []int32{0, 1}, Start: []int32{0, 0},
		Count: []int32{n, n}, Table: table, Stride: stride, Arrivals: []int64{1, 2}, HitTokens: []int32{0, 0},
		ResultInto: [][]byte{into}}))
	id, err := c.Save(&omnicache.Outputs{Tokens: 2 * n, Tensors: []omnicache.Tensor{{Host: out, Rows: 2 * n}}})
	require.NoError(t, err)
	require.Equal(t, want, into, "Save put the rows there")
	var res omnicache.Result
	res.Into([][]byte{into})
	require.ErrorIs(t, c.Materialize(id, []int64{2, 1}, &res), omnicache.ErrOutputs, "some requests, another order")
	require.Equal(t, want, into, "nothing was moved")
	require.NoError(t, c.Materialize(id, nil, &res), "the step stays unconsumed")
	require.Same(t, &into[0], &res.Rows(0, 0)[0])
	require.Equal(t, want[:n*rb], res.Rows(0, 0))
	require.Equal(t, want[n*rb:], res.Rows(1, 0))
}
