package omnicache_test

// Reliability tests for bounded waits, size bounds, sticky and budget failures, and Abort.

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/cachetest"
	"github.com/omnicache/omnicache/internal/gputest"
	"github.com/omnicache/omnicache/tier"
)

// Finding 9: waits on a device that never completes are bounded: a hit
// read's join fails the cache with ErrDeviceTimeout, and Close returns
// ErrDeviceTimeout within Config.WaitTimeout instead of hanging.
func TestHungDeviceBoundedWaits(t *testing.T) {
	dev := gputest.NewFaulty(gpu.NewHost())
	cfg := cachetest.Config()
	cfg.Device = dev
	cfg.WaitTimeout = 50 * time.Millisecond
	h := cachetest.New(t, cfg)
	t.Cleanup(dev.Release) // let the stuck committer go at the end
	const a, b = 1, 2
	h.Assign(a, 1)
	h.Assign(b, 1, 2)
	dev.Hang()
	h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}})
	s := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 4, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 4}}, Finished: []int64{a}})
	err := h.MatCall(s, nil, &h.Res)
	require.ErrorIs(t, err, omnicache.ErrWriteFailed, "a hit read joined to a write that never lands")
	require.ErrorIs(t, err, omnicache.ErrDeviceTimeout)
	err = cachetest.Guard(t, "Close", func() error { return h.C.Close() })
	h.MarkClosed()
	require.ErrorIs(t, err, omnicache.ErrDeviceTimeout, "Close with the committer stuck on the device")
}

// Finding 9: the engine's own join (a Save waits for the copies of the
// write before the previous one) is bounded too: with the device hung, the
// third Save fails the cache with ErrDeviceTimeout instead of hanging.
func TestHungDeviceBoundedJoin(t *testing.T) {
	dev := gputest.NewFaulty(gpu.NewHost())
	cfg := cachetest.Config()
	cfg.Device = dev
	cfg.WaitTimeout = 50 * time.Millisecond
	cfg.StagingDepth = 4
	h := cachetest.New(t, cfg)
	t.Cleanup(dev.Release)
	dev.Hang()
	var err error
	for i := int64(1); i <= 3 && err == nil; i++ {
		h.Assign(i, int32(i))
		h.Begin(cachetest.Step{Sched: []cachetest.S{{i, 0, 2}}, Arrive: []cachetest.A{{ID: i}}})
		_, err = h.TrySave(h.Outs())
	}
	require.ErrorIs(t, err, omnicache.ErrWriteFailed, "the Save that joins a write whose copy never completes")
	require.ErrorIs(t, err, omnicache.ErrDeviceTimeout)
	require.ErrorIs(t, h.C.Sync(), omnicache.ErrWriteFailed, "sticky")
	err = cachetest.Guard(t, "Close", func() error { return h.C.Close() })
	h.MarkClosed()
	require.ErrorIs(t, err, omnicache.ErrDeviceTimeout, "Close with the committer stuck on the device")
}

// Finding 5: sizes that overflow or exceed what the process can address
// are ErrConfig naming the field; a step count beyond the staging
// capacity is rejected by Begin before anything is sized from it.
func TestBounds(t *testing.T) {
	for _, tc := range []struct {
		name, field string
		mut         func(c *omnicache.Config)
	}{
		{"row bytes 1<<40", "RowBytes", func(c *omnicache.Config) { c.Keys = []omnicache.Key{{Name: "h", RowBytes: 1 << 40}} }},
		{"mirror overflows", "mirror", func(c *omnicache.Config) {
			c.NumBlocks, c.BlockSize = 1<<20, 1<<10
			c.Keys = []omnicache.Key{{Name: "h", RowBytes: 1 << 29}}
		}},
		{"staging depth 1<<40", "StagingDepth", func(c *omnicache.Config) { c.StagingDepth = 1 << 40 }},
		{"staging capacity 1<<40", "StagingCapacityTokens", func(c *omnicache.Config) { c.StagingCapacityTokens = 1 << 40 }},
		{"page bytes", "StagingCapacityTokens", func(c *omnicache.Config) {
			c.StagingCapacityTokens = 1 << 30
			c.Keys = []omnicache.Key{{Name: "h", RowBytes: 1 << 10}}
		}},
		{"slots overflow int32", "NumBlocks", func(c *omnicache.Config) { c.NumBlocks, c.BlockSize = 1<<30, 4 }},
		// Products that wrap int64 itself: each passed a multiplied check.
		{"slots wrap int64", "NumBlocks", func(c *omnicache.Config) { c.NumBlocks, c.BlockSize = math.MaxInt, 1<<20 }},
		{"block size MaxInt", "BlockSize", func(c *omnicache.Config) { c.NumBlocks, c.BlockSize = 1, math.MaxInt }},
		{"block size over MaxBlockSize", "BlockSize", func(c *omnicache.Config) { c.NumBlocks, c.BlockSize = 1, omnicache.MaxBlockSize+1 }},
		{"page bytes wrap int64", "StagingCapacityTokens", func(c *omnicache.Config) {
			c.StagingCapacityTokens = 1 << 31 / 2
			c.Keys = []omnicache.Key{{Name: "a", RowBytes: 1 << 30}, {Name: "b", RowBytes: 1 << 30}, {Name: "c", RowBytes: 1 << 30}, {Name: "d", RowBytes: 1 << 30}}
			c.NumBlocks, c.BlockSize = 1, 1
		}},
		{"device budget MaxInt64", "DeviceBudgetBytes", func(c *omnicache.Config) { c.DeviceBudgetBytes = math.MaxInt64 }},
		{"chunk bytes MaxInt64", "DeferredChunkBytes", func(c *omnicache.Config) { c.DeferredChunkBytes = math.MaxInt64 }},
		{"read-ahead MaxInt64", "ReadAheadBytes", func(c *omnicache.Config) { c.ReadAheadBytes = math.MaxInt64 }},
		{"claim timeout MaxInt64", "StagingClaimTimeout", func(c *omnicache.Config) { c.StagingClaimTimeout = math.MaxInt64 }},
		{"wait timeout MaxInt64", "WaitTimeout", func(c *omnicache.Config) { c.WaitTimeout = math.MaxInt64 }},
		{"tier import timeout wraps 4×", "ImportTimeout", func(c *omnicache.Config) {
			c.Tier = &omnicache.TierConfig{Tier: boundsTier(t, c), ImportTimeout: math.MaxInt64/4 + 1}
			c.WaitTimeout = -1
		}},
		{"tier import timeout over the max", "ImportTimeout", func(c *omnicache.Config) {
			c.Tier = &omnicache.TierConfig{Tier: boundsTier(t, c), ImportTimeout: omnicache.MaxImportTimeout + 1}
			c.WaitTimeout = -1
		}},
		{"tier publish queue MaxInt", "PublishQueue", func(c *omnicache.Config) {
			c.Tier = &omnicache.TierConfig{Tier: boundsTier(t, c), PublishQueue: math.MaxInt}
		}},
		{"tier publish batch MaxInt", "PublishBatch", func(c *omnicache.Config) {
			c.Tier = &omnicache.TierConfig{Tier: boundsTier(t, c), PublishBatch: math.MaxInt}
		}},
		{"tier importers", "Importers", func(c *omnicache.Config) {
			c.Tier = &omnicache.TierConfig{Tier: boundsTier(t, c), Importers: 257}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := cachetest.Config()
			tc.mut(&cfg)
			c, err := omnicache.New(cfg)
			if c != nil {
				c.Close()
			}
			require.ErrorIs(t, err, omnicache.ErrConfig)
			require.Contains(t, err.Error(), tc.field)
		})
	}
	t.Run("count beyond the page", func(t *testing.T) {
		h := cachetest.New(t, cachetest.Config())
		p := &omnicache.Plan{IDs: []int64{1}, Rows: []int32{0}, Start: []int32{0}, Count: []int32{1<<31 - 1},
			Table: make([]int32, 8), Stride: 8, Arrivals: []int64{1}, HitTokens: []int32{0}}
		var err error
		allocs := testing.AllocsPerRun(1, func() { err = h.C.Begin(p) })
		require.ErrorIs(t, err, omnicache.ErrStepTooLarge)
		require.Less(t, allocs, 20.0, "Begin allocated before rejecting the count")
		h.Usable()
	})
}

// Finding 6: a device tensor whose declared size exceeds its memory is
// this Save's ErrOutputs, not a failed copy that fails the cache.
func TestDeviceTensorLargerThanItsMemory(t *testing.T) {
	h := cachetest.New(t, cachetest.Config())
	h.Device = true
	const a = 1
	h.Assign(a, 1, 2)
	h.Begin(cachetest.Step{Sched: []cachetest.S{{a, 0, 6}}, Arrive: []cachetest.A{{ID: a}}})
	o := h.Outs()
	d := &o.Tensors[0].Dev
	d.Host = d.Host[:len(d.Host)/2] // the buffer holds half of what it declares
	_, err := h.TrySave(o)
	require.ErrorIs(t, err, omnicache.ErrOutputs)
	require.NotErrorIs(t, err, omnicache.ErrWriteFailed)
	h.Usable()
}

// Finding 7: a staging page that cannot be allocated is a sticky write
// failure like any device failure (not a one-off ErrWriteFailed).
func TestStagingAllocFailureIsSticky(t *testing.T) {
	dev := gputest.NewFaulty(gpu.NewHost())
	cfg := cachetest.Config()
	cfg.Device = dev
	h := cachetest.New(t, cfg)
	dev.FailOpAfter(gputest.OpAllocHost, 0)
	const a = 1
	h.Assign(a, 1)
	h.Begin(cachetest.Step{Sched: []cachetest.S{{a, 0, 2}}, Arrive: []cachetest.A{{ID: a}}})
	_, err := h.TrySave(h.Outs())
	require.ErrorIs(t, err, omnicache.ErrWriteFailed)
	dev.Heal()
	require.ErrorIs(t, h.C.Begin(h.Plan(cachetest.Step{})), omnicache.ErrWriteFailed, "the failure is sticky")
	require.ErrorIs(t, h.C.Sync(), omnicache.ErrWriteFailed)
}

// A Save whose reservation cannot be met because unconsumed steps pin the
// deferred clones fails with ErrBudget before forcing anything out: the
// cache is exactly as before (no budget flush, no task, no page), and once
// the steps are consumed the same step saves.
func TestBudgetPinnedFailsFirst(t *testing.T) {
	const a, b, c = 1, 2, 3
	cfg := cachetest.Config(cachetest.KeyHidden, cachetest.KeyCodes)
	cfg.DeviceBudgetBytes = 8 * int64(cachetest.KeyCodes.RowBytes) // two 4-token steps of deferred rows
	cfg.DeferredChunkBytes = cfg.DeviceBudgetBytes
	h := cachetest.New(t, cfg)
	h.Assign(a, 1)
	h.Assign(b, 2)
	h.Assign(c, 3)
	s1 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}})
	s2 := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 0, 4}}, Arrive: []cachetest.A{{ID: b}}, Finished: []int64{a}})
	before := h.Stats()
	h.Begin(cachetest.Step{Sched: []cachetest.S{{c, 0, 4}}, Arrive: []cachetest.A{{ID: c}}})
	afterBegin := h.Stats()
	_, err := h.TrySave(h.Outs())
	require.ErrorIs(t, err, omnicache.ErrBudget)
	require.Contains(t, err.Error(), "pinned")
	after := h.Stats()
	require.Equal(t, afterBegin.BudgetFlushes, after.BudgetFlushes, "the failed Save forced a write out")
	require.Equal(t, afterBegin.WriteTasks, after.WriteTasks, "the failed Save queued a task")
	require.Equal(t, afterBegin.DeferredWrites, after.DeferredWrites)
	require.Equal(t, afterBegin.Steps, after.Steps)
	require.Equal(t, before.LiveRequests, after.LiveRequests, "the failed Save undid its Begin")
	h.Mat(s1)
	h.Mat(s2)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{c, 0, 4}}, Arrive: []cachetest.A{{ID: c}}}))
	h.Sync()
	h.CheckMirror()
}

// Abort: a forward that fails after Begin abandons the step; the same plan
// then runs as if the failed attempt never happened (its hit is served),
// and Abort outside a begun step is ErrSequence.
func TestAbort(t *testing.T) {
	const a, b = 1, 2
	h := cachetest.New(t, cachetest.Config())
	require.ErrorIs(t, h.C.Abort(), omnicache.ErrSequence, "Abort without Begin")
	h.Assign(a, 1)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}}))
	h.Assign(b, 1, 2)
	hit := cachetest.Step{Sched: []cachetest.S{{b, 4, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 4}}, Finished: []int64{a}}
	before := h.Stats()
	require.NoError(t, h.TryBegin(hit))
	h.AbortBegun()
	after := h.Stats()
	require.Equal(t, before.LiveRequests-1, after.LiveRequests, "a stays finished, b is gone again")
	require.ErrorIs(t, h.C.Abort(), omnicache.ErrSequence, "Abort twice")
	_, err := h.C.Save(&omnicache.Outputs{})
	require.ErrorIs(t, err, omnicache.ErrSequence, "Save after Abort")
	h.Mat(h.Step(hit))
	require.Equal(t, 4, h.Res.Prefix(0), "the hit is served when the step runs again")
	h.Usable()
}

// boundsTier is an embedded tier matching c's layout, closed with the test.
func boundsTier(t *testing.T, c *omnicache.Config) *tier.Tier {
	keys := make([]tier.Key, len(c.Keys))
	for i, k := range c.Keys {
		keys[i] = tier.Key{Name: k.Name, RowBytes: k.RowBytes}
	}
	e, err := tier.NewEmbedded(1 << 20)
	require.NoError(t, err)
	tr, err := tier.New(e, tier.Namespace{Model: "bounds", BlockSize: c.BlockSize, Keys: keys}, tier.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { tr.Close() })
	return tr
}
