package omnicache_test

// Reliability tests on cachetest.AsyncDevice, a device whose copies run later in stream order.

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/cachetest"
	"github.com/omnicache/omnicache/internal/gputest"
)

// A non-owned device tensor may be overwritten as soon as Save returns,
// even on a device whose copies run later: Save waits for its clones. The
// harness scribbles every non-owned output right after Save; a clone that
// ran after that would hand back the scribbles.
func TestNonOwnedDeviceTensorOverwrittenAfterSave(t *testing.T) {
	for _, buffer := range []bool{true, false} {
		t.Run(fmt.Sprintf("buffer=%v", buffer), func(t *testing.T) {
			cfg := cachetest.Config(cachetest.KeyHidden, cachetest.KeyAux, cachetest.KeyCodes)
			cfg.Device = cachetest.NewAsyncDevice()
			cfg.DisableDecodeBuffer = !buffer
			h := cachetest.New(t, cfg)
			h.Device = true
			const a, b = 1, 2
			h.Assign(a, 1, 2, 3)
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 8}}, Arrive: []cachetest.A{{ID: a}}}))
			for pos := 8; pos < 12; pos++ { // pure decode steps (parked with the buffer on)
				h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, int64(pos), 1}}}))
			}
			h.Assign(b, 1, 2, 4)
			h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{b, 8, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 8}}, Finished: []int64{a}}))
			h.Mat(h.Step(cachetest.Step{Finished: []int64{b}}))
			h.Sync()
			h.CheckMirror(h.AllKeys()...)
		})
	}
}

// A large step's non-owned device tensor: Save waits for its clone, and
// issues the copy out of the clone itself (behind it on the stream) before
// it hands the write over; the committer waits for that copy instead of
// issuing one. On a device whose copies run at the next wait, the step's
// own rows, the mirror and a later hit read the clone's rows, not the
// tensor scribbled after Save. A device→host copy failing there is the
// sticky write failure: Save fails, the pages and the budget come back.
func TestLargeClonedStepCopiedBySave(t *testing.T) {
	const rb, tok, bs = 128 << 10, 48, 16 // 6 MiB: above the lazy hand-over's 4 MiB
	newCfg := func(d gpu.Device) omnicache.Config {
		return omnicache.Config{NumBlocks: 8, BlockSize: bs, StagingCapacityTokens: 64,
			Keys: []omnicache.Key{{Name: "hidden", RowBytes: rb}}, DisableDecodeBuffer: true, Device: d}
	}
	table := []int32{0, 1, 2, 3, 4, 5, 6, 7}
	plan := func(id int64, start, count int32, hit int32, finished ...int64) *omnicache.Plan {
		p := &omnicache.Plan{IDs: []int64{id}, Rows: []int32{0}, Start: []int32{start}, Count: []int32{count},
			Table: table, Stride: len(table), Arrivals: []int64{id}, HitTokens: []int32{hit}, Finished: finished}
		if hit > 0 {
			p.HitBlocks = []int32{0, 1, 2}[:hit/bs]
		}
		return p
	}
	src := make([]byte, tok*rb)
	for i := range src {
		src[i] = byte(i*7 + i/rb)
	}

	t.Run("rows", func(t *testing.T) {
		d := cachetest.NewAsyncDevice()
		c, err := omnicache.New(newCfg(d))
		require.NoError(t, err)
		defer c.Close()
		tensor, err := d.Alloc(tok * rb)
		require.NoError(t, err)
		copy(tensor.Host, src)
		require.NoError(t, c.Begin(plan(1, 0, tok, 0)))
		id, err := c.Save(&omnicache.Outputs{Tokens: tok, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: tok}}})
		require.NoError(t, err)
		for i := range tensor.Host {
			tensor.Host[i] = 0xEE // the engine reuses its tensor at once
		}
		var res omnicache.Result
		require.NoError(t, c.Materialize(id, nil, &res))
		require.True(t, bytes.Equal(res.Rows(0, 0), src), "the step's own rows")
		require.NoError(t, c.Sync())
		got := make([]byte, tok*rb)
		sl := make([]int32, tok)
		for i := range sl {
			sl[i] = int32(i)
		}
		require.NoError(t, c.Peek(0, sl, got))
		require.True(t, bytes.Equal(got, src), "the mirror's rows")

		// A new request hits the first 32 rows and computes 16 more.
		copy(tensor.Host, src[:16*rb])
		require.NoError(t, c.Begin(plan(2, 32, 16, 32, 1)))
		id, err = c.Save(&omnicache.Outputs{Tokens: 16, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: 16}}})
		require.NoError(t, err)
		require.NoError(t, c.Materialize(id, nil, &res))
		require.True(t, bytes.Equal(res.Rows(0, 0)[:32*rb], src[:32*rb]), "hit rows")
		st := c.Stats()
		require.Zero(t, st.RowsSkipped)
	})

	t.Run("copy fails", func(t *testing.T) {
		f := gputest.NewFaulty(gpu.NewHost())
		c, err := omnicache.New(newCfg(f))
		require.NoError(t, err)
		defer c.Close()
		tensor, err := f.Alloc(tok * rb)
		require.NoError(t, err)
		copy(tensor.Host, src)
		f.FailOpAfter(gputest.OpCopyDtoH, 0) // the clone succeeds, its copy out fails
		require.NoError(t, c.Begin(plan(1, 0, tok, 0)))
		_, err = c.Save(&omnicache.Outputs{Tokens: tok, Tensors: []omnicache.Tensor{{Dev: tensor, Rows: tok}}})
		require.ErrorIs(t, err, omnicache.ErrWriteFailed)
		st := c.Stats()
		require.Zero(t, st.PagesInUse, "the page came back")
		require.Zero(t, st.BudgetCharged, "the clone's budget came back")
		require.ErrorIs(t, c.Begin(plan(2, 0, 1, 0)), omnicache.ErrWriteFailed, "the failure is sticky")
	})
}
