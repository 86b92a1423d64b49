package omnicache_test

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/cachetest"
	"github.com/omnicache/omnicache/internal/gputest"
)

// Staging pages: the first Save allocates its page; the next page's memory
// is allocated ahead in the background, so the second Save finds it ready;
// no page beyond the ones used plus one is allocated, and Close frees every
// page, the one allocated ahead included.
func TestStagingPagesAllocatedOneAhead(t *testing.T) {
	for _, steps := range []int{1, 2, 6} {
		d := cachetest.NewPinLog()
		c, err := omnicache.New(omnicache.Config{NumBlocks: 8, BlockSize: 4, StagingDepth: 4,
			Keys: []omnicache.Key{{Name: "hidden", RowBytes: 16}}, DisableDecodeBuffer: true, Device: d})
		require.NoError(t, err)
		_, total := d.Counts()
		require.Zero(t, total, "New allocates no staging page")
		plan := omnicache.Plan{Table: []int32{0, 1, 2, 3, 4, 5, 6, 7}, Stride: 8,
			IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{1},
			Arrivals: []int64{1}, HitTokens: []int32{0}}
		// Every step is discarded a step late, as an engine would: two
		// pages in use.
		var prev omnicache.StepID
		for s := 0; s < steps; s++ {
			require.NoError(t, c.Begin(&plan))
			id, err := c.Save(&omnicache.Outputs{Tokens: 1, Tensors: []omnicache.Tensor{{Host: make([]byte, 16), Rows: 1}}})
			require.NoError(t, err)
			if prev != 0 {
				require.NoError(t, c.Discard(prev))
			}
			prev = id
			plan.Arrivals, plan.HitTokens = nil, nil
			plan.Start[0]++
			if s == 0 {
				for c.Stats().PagesAllocating > 0 {
				}
				_, total = d.Counts()
				require.Equal(t, 2, total, "after the first Save: its page and the next one, allocated ahead")
			}
		}
		require.NoError(t, c.Discard(prev))
		for c.Stats().PagesAllocating > 0 {
		}
		_, total = d.Counts()
		switch steps {
		case 1:
			require.Equal(t, 2, total, "one page used, one ahead")
		case 2:
			require.Equal(t, 3, total, "two pages used (the first step is discarded after the second Save), one ahead")
		default:
			require.LessOrEqual(t, total, 4, "never more pages than StagingDepth")
		}
		require.NoError(t, c.Close())
		live, _ := d.Counts()
		require.Zero(t, live, "%d steps: staging memory not freed by Close", steps)
	}
}

// stagingConfig is a small cache on device d for the staging-allocation
// tests.
func stagingConfig(d gpu.Device) omnicache.Config {
	return omnicache.Config{NumBlocks: 8, BlockSize: 4, StagingDepth: 3,
		Keys: []omnicache.Key{{Name: "hidden", RowBytes: 16}}, DisableDecodeBuffer: true, Device: d}
}

// sixSteps saves six steps of one request (each discarding the one before),
// checking each with check, and materializes the last: its row must be
// exact.
func sixSteps(t *testing.T, c *omnicache.Cache, check func()) {
	t.Helper()
	plan := omnicache.Plan{Table: []int32{0, 1, 2, 3, 4, 5, 6, 7}, Stride: 8,
		IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{1},
		Arrivals: []int64{1}, HitTokens: []int32{0}}
	var prev omnicache.StepID
	for s := 0; s < 6; s++ {
		require.NoError(t, c.Begin(&plan))
		row := make([]byte, 16)
		for i := range row {
			row[i] = byte(s*16 + i)
		}
		id, err := c.Save(&omnicache.Outputs{Tokens: 1, Tensors: []omnicache.Tensor{{Host: row, Rows: 1}}})
		require.NoError(t, err)
		check()
		if prev != 0 {
			require.NoError(t, c.Discard(prev))
		}
		prev = id
		plan.Arrivals, plan.HitTokens = nil, nil
		plan.Start[0]++
	}
	var res omnicache.Result
	require.NoError(t, c.Materialize(prev, nil, &res))
	require.Equal(t, byte(5*16), res.Rows(0, 0)[0])
}

// newFailsOnPages: a device that refuses the staging pages fails New (with
// mode set by set) with an error wrapping gpu.ErrAlloc; nothing stays
// allocated and no goroutine of the cache is left running.
func newFailsOnPages(t *testing.T, set func(*omnicache.Config)) {
	t.Helper()
	base := runtime.NumGoroutine()
	d := cachetest.NewPinLog()
	f := gputest.NewFaulty(d)
	f.FailOpAfter(gputest.OpAllocHost, 0)
	cfg := stagingConfig(f)
	cfg.CopyWorkers = 4
	set(&cfg)
	c, err := omnicache.New(cfg)
	require.Nil(t, c)
	require.ErrorIs(t, err, gpu.ErrAlloc)
	require.ErrorContains(t, err, "staging pages")
	live, _ := d.Counts()
	require.Zero(t, live)
	cachetest.WaitGoroutines(t, base)
}

// AllocStagingAtNew: New allocates every page, Saves allocate nothing and
// read back exact rows, and Close frees every page.
func TestAllocStagingAtNew(t *testing.T) {
	d := cachetest.NewPinLog()
	cfg := stagingConfig(d)
	cfg.AllocStagingAtNew = true
	c, err := omnicache.New(cfg)
	require.NoError(t, err)
	live, total := d.Counts()
	require.Equal(t, 1, total, "New allocates every page, as one allocation")
	require.Equal(t, 1, live)
	sixSteps(t, c, func() {
		require.Zero(t, c.Stats().PagesAllocating, "no page is allocated in the background")
	})
	_, total = d.Counts()
	require.Equal(t, 1, total, "no Save allocated a page")
	require.NoError(t, c.Close())
	live, _ = d.Counts()
	require.Zero(t, live, "Close frees the pages")
}

// A device that refuses the staging pages fails New (AllocStagingAtNew).
func TestAllocStagingAtNewFails(t *testing.T) {
	newFailsOnPages(t, func(c *omnicache.Config) { c.AllocStagingAtNew = true })
}

// AllocStagingAhead: New allocates one page and starts the others in the
// background at once; once they are in (Sync waits for them), Saves
// allocate nothing more, rows read back exact and Close frees every page,
// also right after New. A device that refuses the first page fails New;
// asking for both modes is ErrConfig.
func TestAllocStagingAhead(t *testing.T) {
	d := cachetest.NewPinLog()
	cfg := stagingConfig(d)
	cfg.AllocStagingAhead = true
	c, err := omnicache.New(cfg)
	require.NoError(t, err)
	_, total := d.Counts()
	require.GreaterOrEqual(t, total, 1, "New allocated the first page")
	require.NoError(t, c.Sync())
	live, total := d.Counts()
	require.Equal(t, 3, total, "every page allocated, the others in the background")
	require.Equal(t, 3, live)
	require.Zero(t, c.Stats().PagesAllocating)
	sixSteps(t, c, func() {})
	_, total = d.Counts()
	require.Equal(t, 3, total, "no Save allocated a page")
	require.NoError(t, c.Close())
	live, _ = d.Counts()
	require.Zero(t, live, "Close frees the pages")

	c, err = omnicache.New(cfg)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	live, _ = d.Counts()
	require.Zero(t, live, "Close right after New frees every page, the background ones too")

	newFailsOnPages(t, func(c *omnicache.Config) { c.AllocStagingAhead = true })

	both := cfg
	both.AllocStagingAtNew = true
	_, err = omnicache.New(both)
	require.ErrorIs(t, err, omnicache.ErrConfig)
}
