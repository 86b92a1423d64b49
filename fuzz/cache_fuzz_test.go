package fuzz

// FuzzCache drives the model engine of internal/cachetest from the
// fuzzer's bytes instead of a PRNG (cachetest.Engine.NextFrom; the input
// layout is cachetest.Input's) and checks the cache against the harness's
// row oracle: every materialized row, the whole mirror after Sync, the
// documented errors of misuse and of failing calls, and the budget and
// staging pages once everything is consumed.
//
// Run it with
//
//	go test -run '^$' -fuzz '^FuzzCache$' -fuzztime 30s ./fuzz/
//
// and replay one input, printing the steps it decodes to, with
//
//	FUZZ_TRACE=1 go test -run 'FuzzCache/<name>' -v ./fuzz/

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/omnicache/omnicache/internal/cachetest"
)

func FuzzCache(f *testing.F) {
	// A few shapes to start from; testdata/fuzz/FuzzCache holds more.
	f.Add([]byte{})
	f.Add([]byte{0x04, 3, 0, 11, 7, 0x15, 0x03, 0x01, 12, 5, 9, 3, 0, 0, 0, 0, 0, 0, 0x02, 0x00, 18, 4, 0})
	f.Add([]byte{0x07, 0, 1, 6, 1, 0x3f, 0x01, 0x01, 30, 30, 0x01, 0x03, 40, 40, 0, 0x02, 0x02, 40, 0, 0, 0})
	// Forwards failing after Begin (failing byte 0x10): a step with a hit
	// arrival and a decode step are aborted and begun again.
	f.Add([]byte{0x07, 0, 1, 6, 1, 0x3f, 0x83, 0x40, 0x01, 0x00, 0x03, 0x10, 0x1e, 0x10, 0x00, 0x01, 0x80, 0x40, 0x03, 0x10, 0x28, 0x02, 0x00, 0x10, 0x40, 0x83})
	// Sparse steps with an optional deferred key: omissions of aux and
	// codes on prefill, decode and hit steps, and a required key omitted.
	f.Add([]byte{0x04, 0x1b, 0, 11, 7, 0x15, 0x01, 0x01, 0x02, 12, 5, 0x00, 0x00, 0x04, 0x00, 0x00, 0x06, 0x00, 0x00, 0x82,
		0x02, 0x00, 0x02, 18, 4, 0, 0x00, 0x00, 0x80, 0x00, 0x00, 0x06, 0x40, 0x40, 0x00, 0x01, 0x02, 30, 30, 0, 0x00, 0x00, 0x04})
	// Replaced prompts and drafts (failing byte 0x40 and 0x80, after the
	// misuse byte 0x40), among arrivals and decode steps.
	f.Add([]byte{0x04, 3, 0, 11, 7, 0x15, 0x01, 0x01, 12, 5, 0x01, 0x00, 0x80, 0x40, 0xc0, 0x07, 0x1d, 0x00, 0x80, 0x40, 0x80, 0x33, 0x00,
		0x80, 0x40, 0x40, 0x05, 0x00, 0x80, 0x40, 0xc0, 0x0b, 0x2e, 0x00, 0x00, 0x00, 0x00, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := cachetest.NewInput(data)
		s := cachetest.SetupFrom(in)
		e := cachetest.NewEngine(s.Limits, len(s.Config.Keys))
		h := cachetest.New(t, s.Config)
		h.Stride = s.Limits.Stride
		// Odd-length inputs begin every step with Plan.ResultInto buffers
		// and materialize whole steps into them (no input byte is taken:
		// the corpus keeps its meaning).
		h.ResultInto = len(data)%2 == 1
		run := cachetest.NewRunner(h, s.Config.StagingDepth-1, true)
		for i := 0; i < cachetest.FuzzMaxSteps && !in.Empty() && run.Broken() == nil; i++ {
			act := e.NextFrom(in, s)
			if os.Getenv("FUZZ_TRACE") != "" {
				t.Logf("step %d: %v", i, act)
			}
			run.Apply(act)
		}
		if run.Dead() {
			t.Logf("run ended early: %v", run.Broken()) // its checks ran
			return
		}
		if last := e.DrainAll(); len(last.Step.Finished) > 0 {
			run.Apply(last)
		}
		run.Finish()

		st := h.Stats()
		n := e.Counts
		t.Logf("config: %d blocks of %d, depth %d, keys %d, buffer off %v, budget %d; schedule: %d steps, %d requests, %d hits (%d bogus), %d pure decode steps, %d preemptions, %d resumes (%d with a hit, %d without one at an unaligned length), %d replaces, %d rejected drafts, %d aborts, %d continuations, %d reuses, %d step aborts (%d other plans abandoned, %d by a failed Save); cache: %d buffered steps, %d flushes, %d budget flushes, %d deferred writes, %d rows skipped",
			s.Config.NumBlocks, s.Config.BlockSize, s.Config.StagingDepth, len(s.Config.Keys), s.Config.DisableDecodeBuffer, st.BudgetLimit,
			n.Steps, n.Requests, n.Hits, n.Bogus, n.PureSteps, n.Preempts, n.Resumes, n.ResumeHits, n.ResumesUnaligned, n.Replaces, n.Drafts, n.Aborts, n.Continued, n.Reuses, run.StepAborts(), n.Abandoned, n.FailedSaves,
			st.BufferedSteps, st.BufferFlushes, st.BudgetFlushes, st.DeferredWrites, st.RowsSkipped)
		assert.Zero(t, st.BudgetCharged, "Stats.BudgetCharged once every request finished")
		assert.Zero(t, st.PagesInUse, "Stats.PagesInUse once every step is consumed")
		assert.Zero(t, st.LiveRequests, "Stats.LiveRequests once every request finished")
		assert.EqualValues(t, h.Steps(), st.Steps, "Stats.Steps")
		if run.Broken() != nil {
			t.Logf("run stopped early: %v", run.Broken())
			return
		}
		assert.Equal(t, n.Hits, st.HitRequests, "Stats.HitRequests")
		assert.Equal(t, n.HitTokens, st.HitTokens, "Stats.HitTokens")
	})
}
