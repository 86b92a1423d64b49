package omnicache_test

// Reset: every row dropped (a later hit finds them absent), steps saved
// before fail with ErrReset, misuse refused; with a tier, what waits to be
// published and the tier's memory of what it stored dropped, and the
// store purged on request. A raw-API world (resetWorld).

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/internal/cachetest"
	"github.com/omnicache/omnicache/tier"
)

// resetWorld is a raw-API engine over blocks of 4 tokens: request id owns
// table row id-1.
type resetWorld struct {
	t     *testing.T
	c     *omnicache.Cache
	table []int32
}

const resetStride = 4

func newResetWorld(t *testing.T, cfg omnicache.Config) *resetWorld {
	c, err := omnicache.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return &resetWorld{t: t, c: c, table: make([]int32, 8*resetStride)}
}

// row is the content of token pos of request id, key k.
func resetRow(id int64, k, pos, rb int) []byte {
	b := make([]byte, rb)
	for i := range b {
		b[i] = byte(int(id)*31 + k*7 + pos + i)
	}
	return b
}

// step begins and saves one request's tokens [start, start+n); arrive
// registers it with a hit on hitBlocks; finished lists requests done.
func (w *resetWorld) step(id int64, blocks []int32, start, n int, arrive bool, hitBlocks []int32, finished ...int64) (omnicache.StepID, error) {
	row := int32(id - 1)
	copy(w.table[int(row)*resetStride:], blocks)
	p := &omnicache.Plan{IDs: []int64{id}, Rows: []int32{row}, Start: []int32{int32(start)}, Count: []int32{int32(n)},
		Table: w.table, Stride: resetStride, Finished: finished}
	if arrive {
		p.Arrivals, p.HitTokens, p.HitBlocks = []int64{id}, []int32{int32(4 * len(hitBlocks))}, hitBlocks
	}
	if err := w.c.Begin(p); err != nil {
		return 0, err
	}
	o := &omnicache.Outputs{Tokens: n, Padded: n}
	for k, key := range []omnicache.Key{cachetest.KeyHidden, cachetest.KeyAux} {
		var b []byte
		for pos := start; pos < start+n; pos++ {
			b = append(b, resetRow(id, k, pos, key.RowBytes)...)
		}
		o.Tensors = append(o.Tensors, omnicache.Tensor{Host: b, Rows: n})
	}
	return w.c.Save(o)
}

// finish drops requests with an empty step.
func (w *resetWorld) finish(ids ...int64) {
	require.NoError(w.t, w.c.Begin(&omnicache.Plan{Table: w.table, Stride: resetStride, Finished: ids}))
	id, err := w.c.Save(cachetest.EmptyOutputs(2))
	require.NoError(w.t, err)
	require.NoError(w.t, w.c.Discard(id))
}

// TestReset: Reset drops every row: a later hit over blocks written
// before finds them absent (a required key errs, an optional one reads
// zeros), a step saved before fails with ErrReset at Materialize and its
// page and budget come back, and misuse (a live request, a begun step, a
// closed cache, PurgeTier without a tier) is a typed error that changes
// nothing.
func TestReset(t *testing.T) {
	ctx := context.Background()
	cfg := cachetest.Config()
	cfg.StagingDepth = 2
	w := newResetWorld(t, cfg)
	// Request 1 writes blocks 1 and 2 (8 tokens); request 2 hits them.
	id, err := w.step(1, []int32{1, 2}, 0, 8, true, nil)
	require.NoError(t, err)
	var res omnicache.Result
	require.NoError(t, w.c.Materialize(id, nil, &res))
	// Live request 1: Reset refuses and changes nothing.
	require.ErrorIs(t, w.c.Reset(ctx, omnicache.ResetOptions{}), omnicache.ErrSequence)
	w.finish(1)
	id, err = w.step(2, []int32{1, 2, 3}, 8, 1, true, []int32{1, 2})
	require.NoError(t, err)
	require.NoError(t, w.c.Materialize(id, nil, &res))
	require.Equal(t, resetRow(1, 0, 5, cachetest.KeyHidden.RowBytes), res.Rows(0, 0)[5*cachetest.KeyHidden.RowBytes:6*cachetest.KeyHidden.RowBytes],
		"the hit before Reset serves request 1's rows")
	// Between Begin and Save: refused.
	row := int32(2)
	require.NoError(t, w.c.Begin(&omnicache.Plan{IDs: []int64{2}, Rows: []int32{row - 1}, Start: []int32{9}, Count: []int32{1}, Table: w.table, Stride: resetStride}))
	require.ErrorIs(t, w.c.Reset(ctx, omnicache.ResetOptions{}), omnicache.ErrSequence)
	require.NoError(t, w.c.Abort())
	// A step saved before the Reset and not consumed.
	unconsumed, err := w.step(2, []int32{1, 2, 3}, 9, 1, false, nil)
	require.NoError(t, err)
	w.finish(2)
	require.ErrorIs(t, w.c.Reset(ctx, omnicache.ResetOptions{PurgeTier: true}), omnicache.ErrConfig, "PurgeTier without a tier")
	require.NoError(t, w.c.Reset(ctx, omnicache.ResetOptions{}))
	require.ErrorIs(t, w.c.Materialize(unconsumed, nil, &res), omnicache.ErrReset)
	require.ErrorIs(t, w.c.Discard(unconsumed), omnicache.ErrUnknownStep, "Materialize consumed it")
	st := w.c.Stats()
	require.Zero(t, st.PagesInUse)
	require.Zero(t, st.BudgetCharged)
	require.EqualValues(t, 1, st.Resets)
	// A hit over blocks 1 and 2 now finds the required key absent.
	id, err = w.step(3, []int32{1, 2, 4}, 8, 1, true, []int32{1, 2})
	require.NoError(t, err)
	err = w.c.Materialize(id, nil, &res)
	var re *omnicache.RequestError
	require.ErrorAs(t, err, &re)
	require.ErrorIs(t, res.Err(0), omnicache.ErrAbsentRequired)
	w.finish(3)
	// The cache goes on: a new request writes and is hit again.
	id, err = w.step(4, []int32{5}, 0, 4, true, nil)
	require.NoError(t, err)
	require.NoError(t, w.c.Materialize(id, nil, &res))
	w.finish(4)
	id, err = w.step(5, []int32{5, 6}, 4, 1, true, []int32{5})
	require.NoError(t, err)
	require.NoError(t, w.c.Materialize(id, nil, &res))
	require.Equal(t, resetRow(4, 1, 3, cachetest.KeyAux.RowBytes), res.Rows(0, 1)[3*cachetest.KeyAux.RowBytes:4*cachetest.KeyAux.RowBytes])
	w.finish(5)
	require.NoError(t, w.c.Close())
	require.ErrorIs(t, w.c.Reset(ctx, omnicache.ResetOptions{}), omnicache.ErrClosed)
}

// TestResetOptionalReadsZeros: after Reset an optional key's rows under a
// hit read as exact zeros.
func TestResetOptionalReadsZeros(t *testing.T) {
	ctx := context.Background()
	opt := omnicache.Key{Name: "codes", RowBytes: 8, Optional: true}
	cfg := cachetest.Config(omnicache.Key{Name: "hidden", RowBytes: 16, Optional: true}, opt)
	c, err := omnicache.New(cfg)
	require.NoError(t, err)
	defer c.Close()
	table := []int32{1, 2, 0, 0, 1, 2, 3, 0}
	save := func(p *omnicache.Plan, n int) omnicache.StepID {
		require.NoError(t, c.Begin(p))
		id, err := c.Save(&omnicache.Outputs{Tokens: n, Padded: n, Tensors: []omnicache.Tensor{
			{Host: bytesOf(n*16, 0xAB), Rows: n}, {Host: bytesOf(n*8, 0xCD), Rows: n}}})
		require.NoError(t, err)
		return id
	}
	require.NoError(t, c.Discard(save(&omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{8},
		Table: table, Stride: 4, Arrivals: []int64{1}, HitTokens: []int32{0}}, 8)))
	require.NoError(t, c.Begin(&omnicache.Plan{Table: table, Stride: 4, Finished: []int64{1}}))
	id, err := c.Save(cachetest.EmptyOutputs(2))
	require.NoError(t, err)
	require.NoError(t, c.Discard(id))
	require.NoError(t, c.Reset(ctx, omnicache.ResetOptions{}))
	id = save(&omnicache.Plan{IDs: []int64{2}, Rows: []int32{1}, Start: []int32{8}, Count: []int32{1},
		Table: table, Stride: 4, Arrivals: []int64{2}, HitTokens: []int32{8}, HitBlocks: []int32{1, 2}}, 1)
	var res omnicache.Result
	require.NoError(t, c.Materialize(id, nil, &res))
	require.Equal(t, make([]byte, 8*16), res.Rows(0, 0)[:8*16], "hidden prefix after Reset")
	require.Equal(t, make([]byte, 8*8), res.Rows(0, 1)[:8*8], "codes prefix after Reset")
}

func bytesOf(n int, b byte) []byte {
	s := make([]byte, n)
	for i := range s {
		s[i] = b
	}
	return s
}

// TestResetTier: Reset drops the blocks queued for publishing and the
// tier's memory of what it stored lately, leaves the shared store alone,
// or purges the namespace's values with PurgeTier (other namespaces are
// kept).
func TestResetTier(t *testing.T) {
	ctx := context.Background()
	tr, e := embeddedTier(t)
	other, err := tier.New(e, tier.Namespace{Model: "other", BlockSize: tbs, Keys: tr.Namespace().Keys}, tier.Options{})
	require.NoError(t, err)
	a := newTierCache(t, tr, nil)
	publishPrompt(t, a, 7)
	require.NoError(t, a.Sync())
	_, err = other.Put(ctx, []tier.Block{tblock(t, other, thash(9, 0))})
	require.NoError(t, err)
	finishAll(t, a)
	n, err := a.Lookup(ctx, []uint64{thash(7, 0), thash(7, 1), thash(7, 2)})
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.True(t, tr.StoredRecently(thash(7, 0)))
	require.NoError(t, a.Reset(ctx, omnicache.ResetOptions{}))
	require.False(t, tr.StoredRecently(thash(7, 0)), "the tier forgot what it stored lately")
	n, _ = a.Lookup(ctx, []uint64{thash(7, 0)})
	require.Equal(t, 1, n, "the shared store is left alone")
	require.NoError(t, a.Reset(ctx, omnicache.ResetOptions{PurgeTier: true}))
	n, _ = a.Lookup(ctx, []uint64{thash(7, 0), thash(7, 1), thash(7, 2)})
	require.Zero(t, n, "purged")
	m, err := other.Lookup(ctx, []uint64{thash(9, 0)})
	require.NoError(t, err)
	require.Equal(t, 1, m, "another namespace is kept")
	require.EqualValues(t, 2, a.Stats().Resets)
}

// finishAll finishes request 1 of publishPrompt with an empty step.
func finishAll(t *testing.T, c *omnicache.Cache) {
	require.NoError(t, c.Begin(&omnicache.Plan{Stride: tstride, Table: make([]int32, tstride), Finished: []int64{1}}))
	id, err := c.Save(cachetest.EmptyOutputs(len(tkeys)))
	require.NoError(t, err)
	require.NoError(t, c.Discard(id))
}

// tblock is a block of zero rows for every key of tr.
func tblock(t *testing.T, tr *tier.Tier, h uint64) tier.Block {
	b := tier.Block{Hash: h}
	for k := range tr.Namespace().Keys {
		b.Rows = append(b.Rows, make([]byte, tr.BlockBytes(k)))
	}
	return b
}
