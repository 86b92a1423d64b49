package omnicache_test

// Randomized property test: a seeded, deterministic random
// schedule — arrivals with hits on previously written blocks, chunked
// prefills, decodes, finishes, aborts, preemption with recompute, streamed
// continuations, LRU block reuse — runs through the cache with the decode
// buffer on, with it off, on with a tight device budget, with prefetch
// off, with a tight read-ahead budget and with a lagging committer. Before
// every 7th step another plan the engine could have run (finishing,
// preempting, resuming, replacing and hitting far more often) is begun and
// abandoned, by Abort or by a Save that fails: the oracle never sees it,
// and one more run without those plans must serve the same rows. Every
// materialized row is checked against the model (slot → latest row, the
// writes replayed in step order), the mirrors are checked against the model
// along the way and at the end, and the runs' mirrors and materialized
// rows must be identical. The model engine and its runner are
// internal/cachetest's (Engine, RunAll).

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/cachetest"
	"github.com/omnicache/omnicache/internal/gputest"
)

func TestPropertyRandomSchedule(t *testing.T) {
	keys := []omnicache.Key{cachetest.KeyHidden, cachetest.KeyAux, cachetest.KeyCodes}
	base := omnicache.Config{
		NumBlocks:           cachetest.PropBlocks,
		BlockSize:           cachetest.BlockSize,
		StagingClaimTimeout: cachetest.Config().StagingClaimTimeout,
	}
	// direct is MirrorDirect for every step with device rows (the budget
	// holds StagingDepth+1 pages of them).
	direct := func(c *omnicache.Config) {
		c.MirrorDirect, c.MirrorDirectMinBytes = true, 1
		c.DeviceBudgetBytes = 8 << 20
	}
	runs := []struct {
		name       string
		mut        func(*omnicache.Config)
		dev, owned bool // outputs as device tensors (owned: handed over)
		into       bool // Materialize into the test's buffers (Result.Into)
		resultInto bool // begin with Plan.ResultInto, Materialize the whole step into them
		savedInto  bool // every step write handed over at once (SetLazyBytes): Save puts host rows into ResultInto
		resultDev  bool // begin with Plan.ResultDev, MaterializeDev the whole step into them
	}{
		{name: "buffer on", mut: func(*omnicache.Config) {}},
		{name: "buffer on, into the caller's buffers", mut: func(*omnicache.Config) {}, into: true},
		{name: "buffer on, into the plans' result buffers", mut: func(*omnicache.Config) {}, resultInto: true},
		{name: "buffer off, saved into the plans' result buffers", mut: func(c *omnicache.Config) { c.DisableDecodeBuffer = true },
			resultInto: true, savedInto: true},
		{name: "device tensors, handed over at once, into the plans' result buffers", mut: func(*omnicache.Config) {},
			dev: true, resultInto: true, savedInto: true},
		{name: "device tensors, handed over at once, into the result buffers, lagging committer", mut: func(c *omnicache.Config) {
			dev := gputest.NewFaulty(gpu.NewHost())
			dev.DelayWaits(100 * time.Microsecond)
			c.Device = dev
		}, dev: true, resultInto: true, savedInto: true},
		{name: "buffer on, into the plans' device buffers", mut: func(*omnicache.Config) {}, resultDev: true},
		{name: "device tensors, into the plans' device buffers, lagging committer", mut: func(c *omnicache.Config) {
			dev := gputest.NewFaulty(gpu.NewHost())
			dev.DelayWaits(100 * time.Microsecond)
			c.Device = dev
		}, dev: true, resultDev: true},
		{name: "device tensors, prefetch off, into the plans' device buffers", mut: func(c *omnicache.Config) { c.DisablePrefetch = true },
			dev: true, resultDev: true},
		{name: "buffer off", mut: func(c *omnicache.Config) { c.DisableDecodeBuffer = true }},
		{name: "buffer on, tight budget", mut: func(c *omnicache.Config) {
			c.DeviceBudgetBytes = 2048 // > the largest step (32 tokens × 52 bytes)
			c.DeferredChunkBytes = 512
		}},
		{name: "prefetch off", mut: func(c *omnicache.Config) { c.DisablePrefetch = true }},
		{name: "tight read-ahead", mut: func(c *omnicache.Config) {
			// Some hit steps' prefetch buffers do not fit: read at
			// Materialize, racing reassignment.
			c.ReadAheadBytes = 1024
			dev := gputest.NewFaulty(gpu.NewHost())
			dev.DelayWaits(100 * time.Microsecond)
			c.Device = dev
		}},
		{name: "buffer on, lagging committer", mut: func(c *omnicache.Config) {
			// Every device wait takes longer: the committer falls behind
			// the engine, so writes skip slots newer writes claimed and
			// delayed reads race reassignment (the read protocol's case).
			dev := gputest.NewFaulty(gpu.NewHost())
			dev.DelayWaits(100 * time.Microsecond)
			c.Device = dev
		}},
		{name: "device tensors", mut: func(*omnicache.Config) {}, dev: true},
		{name: "direct, device tensors", mut: direct, dev: true},
		{name: "direct, device tensors, into the caller's buffers", mut: direct, dev: true, into: true},
		{name: "direct, owned device tensors, lagging committer", mut: func(c *omnicache.Config) {
			direct(c)
			dev := gputest.NewFaulty(gpu.NewHost())
			dev.DelayWaits(100 * time.Microsecond)
			c.Device = dev
		}, dev: true, owned: true},
		{name: "direct, device tensors, prefetch off", mut: func(c *omnicache.Config) {
			direct(c)
			c.DisablePrefetch = true
		}, dev: true},
	}
	// Seed 4 is seed 1's schedule with sparse steps: aux and an optional
	// deferred key omitted at random.
	for _, seed := range []uint64{1, 2, 3, 4} {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			base := base
			base.Keys = keys
			e := cachetest.NewSeededEngine(seed, len(keys))
			if seed == 4 {
				base.Keys = []omnicache.Key{cachetest.KeyHidden, cachetest.KeyAux, cachetest.KeyCodesOpt}
				e = cachetest.NewSeededEngine(1, len(keys))
				e.OmitOptional(4, base.Keys)
			}
			var acts []cachetest.Action
			for i := 0; i < cachetest.PropSteps; i++ {
				acts = append(acts, e.Next(i))
			}
			if last := e.DrainAll(); len(last.Step.Finished) > 0 {
				acts = append(acts, last)
			}
			n := e.Counts
			t.Logf("schedule: %d steps, %d requests, %d hits (%d tokens), %d pure decode steps, %d preemptions, %d resumes (%d with a hit, %d without one at an unaligned length), %d replaces, %d rejected drafts, %d aborts, %d continuations, %d implicit arrivals, %d zero-token steps",
				n.Steps, n.Requests, n.Hits, n.HitTokens, n.PureSteps, n.Preempts, n.Resumes, n.ResumeHits, n.ResumesUnaligned, n.Replaces, n.Drafts, n.Aborts, n.Continued, n.Implicit, n.ZeroTokens)
			t.Logf("abandoned plans: %d (%d by a failed Save); %d finish, %d preempt, %d resume, %d replace, %d hit",
				n.Abandoned, n.FailedSaves, n.AbandonedFinish, n.AbandonedPreempt, n.AbandonedResume, n.AbandonedReplace, n.AbandonedHit)
			require.Positive(t, n.ResumesUnaligned, "the schedule must resume requests without a hit after an unaligned length")
			for what, k := range map[string]int{"fail a Save": n.FailedSaves, "finish": n.AbandonedFinish, "preempt": n.AbandonedPreempt,
				"resume": n.AbandonedResume, "replace": n.AbandonedReplace, "hit": n.AbandonedHit} {
				require.Positive(t, k, "abandoned plans must %s", what)
			}
			require.Positive(t, n.Replaces, "the schedule must replace prompts")
			require.Positive(t, n.Drafts, "the schedule must reject drafts")
			require.Positive(t, n.ResumeHits, "the schedule must resume requests with a hit")
			require.Positive(t, n.Hits, "the schedule must contain hits")
			require.Positive(t, n.PureSteps, "the schedule must contain pure decode steps")
			require.Positive(t, n.AbortedHits, "the schedule must abort hit steps (%d aborts)", n.AbortRetries)
			if seed == 4 {
				require.Positive(t, n.Omitted, "the schedule must omit keys")
			}

			runs := append(runs[:len(runs):len(runs)], runs[0]) // "buffer on", without the abandoned plans
			runs[len(runs)-1].name = "buffer on, no abandoned plans"
			caps := make([]cachetest.Capture, len(runs))
			for i, run := range runs {
				ok := t.Run(run.name, func(t *testing.T) {
					cfg := base
					run.mut(&cfg)
					if run.savedInto {
						defer omnicache.SetLazyBytes(1)()
					}
					h := cachetest.New(t, cfg)
					h.Device, h.Owned = run.dev, run.owned
					h.Label = run.name
					h.KeepRows = true
					h.Into, h.ResultInto, h.ResultDev = run.into, run.resultInto, run.resultDev
					if i == len(runs)-1 {
						caps[i] = cachetest.RunAll(h, cachetest.WithoutAbandoned(acts))
					} else {
						caps[i] = cachetest.RunAll(h, acts)
					}
					st := h.Stats()
					t.Logf("cache: %d tasks, %d rows skipped (a newer write claimed them), %d delayed reads reassigned", st.WriteTasks, st.RowsSkipped, h.ReassignedReads())
					assert.Zero(t, st.BudgetCharged, "Stats.BudgetCharged once every request finished")
					assert.Zero(t, st.PagesInUse, "Stats.PagesInUse once every step is consumed")
					assert.Equal(t, n.Hits, st.HitRequests, "Stats.HitRequests")
					assert.Equal(t, n.HitTokens, st.HitTokens, "Stats.HitTokens")
					assert.EqualValues(t, len(acts), st.Steps, "Stats.Steps")
				})
				if !ok {
					return
				}
			}
			for i := 1; i < len(runs); i++ {
				cachetest.CompareCaptures(t, base, caps[0], caps[i], runs[0].name, runs[i].name)
			}
		})
	}
}
