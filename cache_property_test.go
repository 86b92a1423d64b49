package omnicache_test

// Randomized property test (issue #5): a seeded, deterministic random
// schedule — arrivals with hits on previously written blocks, chunked
// prefills, decodes, finishes, aborts, preemption with recompute, streamed
// continuations, LRU block reuse — runs through the cache with the decode
// buffer on, with it off, and on with a tight device budget. Every
// materialized row is checked against the model (slot → latest row, the
// writes replayed in step order), the mirrors are checked against the model
// along the way and at the end, and the three runs' mirrors and
// materialized rows must be identical.

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/gputest"
)

const (
	propBlocks      = 24
	propSteps       = 300
	propTokenBudget = 32 // tokens per step
	propChunk       = 8  // prefill chunk per request and step
	propMaxRunning  = 4
)

// Materialize modes.
const (
	matNow = iota
	matLate
	matDiscard
	matAsync
)

type propAssign struct {
	id     int64
	blocks []int32
}

// propAction is one generated step, applied identically to every run.
type propAction struct {
	st       step
	unassign []int64
	assign   []propAssign
	bump     []int64
	devKeys  []bool
	ownKeys  []bool
	omitKeys []bool // the step omits these (optional) keys: a zero Tensor{}
	mode     int
	reqs     []int64
	// delay: a late or asynchronous consumption completes after the Save
	// of the step delay steps later (0 means 1); capped by the runner.
	delay int
	check bool
	// Misuse exercised around the step (FuzzCache): each must fail with its
	// documented error and leave the cache usable.
	misuse  int  // before (or right after) Begin, see misuse* constants
	outside bool // Materialize with a request outside the step first: ErrNotInStep
	twice   bool // consume the step a second time: ErrUnknownStep
	// Failing calls (FuzzCache, cache_fuzz_failure_test.go): each must fail
	// with its documented error and change nothing, and the step then runs
	// as generated.
	badPlan int // the step's own plan made wrong, see badPlan* constants
	badSave int // the step's outputs made wrong, see badSave* constants
	// abortRetry: the step's forward fails after its Begin: Abort, then
	// Begin the same step again.
	abortRetry bool
	nilArgs    bool // Begin(nil), Save(nil) and Materialize into a nil Result first: typed errors that change nothing
	fault      int  // 1 + gputest.Op: the device fails that method from this step on
	faultN     int  // ... after faultN more successful calls
	closeNow   bool
}

// Misuse around Begin.
const (
	misuseNone          = iota
	misuseUnalignedHit  // ErrUnalignedHit
	misuseNoHitBlocks   // ErrHitBlocks
	misuseExtraBlocks   // ErrHitBlocks (block ids left over)
	misuseHitOutOfRange // ErrPlan
	misuseNegativeStart // ErrPlan
	misuseSaveFirst     // Save before Begin: ErrSequence
	misuseBeginTwice    // Begin again after Begin: ErrSequence, the first stays begun
	numMisuse
)

type propReq struct {
	id            int64
	prompt, total int // tokens to prefill (grows to cover a recompute), total tokens
	done          int
	blocks        []int32
	shared        int // tokens of its leading blocks that came from a hit (shared: never rewritten by it)
}

// engineLimits sizes the simulated engine.
type engineLimits struct {
	blocks      int // KV blocks
	bs          int // block size
	stride      int // block-table stride: the most blocks one request holds
	tokenBudget int // tokens per step
	chunk       int // prefill chunk per request and step
	maxRunning  int // requests running at once
}

var propLimits = engineLimits{
	blocks:      propBlocks,
	bs:          testBlockSize,
	stride:      testStride,
	tokenBudget: propTokenBudget,
	chunk:       propChunk,
	maxRunning:  propMaxRunning,
}

// runProp applies the actions to h and returns the run's capture.
func runProp(h *harness, acts []propAction) capture {
	h.t.Helper()
	h.stride = testStride
	r := &propRun{h: h, maxDelay: 1}
	for _, act := range acts {
		r.apply(act)
	}
	r.finish()
	return h.capture()
}

func allKeys(h *harness) []int {
	ks := make([]int, len(h.cfg.Keys))
	for k := range ks {
		ks[k] = k
	}
	return ks
}

func TestPropertyRandomSchedule(t *testing.T) {
	keys := []omnicache.Key{keyHidden, keyAux, keyCodes}
	base := omnicache.Config{
		NumBlocks:           propBlocks,
		BlockSize:           testBlockSize,
		StagingClaimTimeout: testConfig().StagingClaimTimeout,
	}
	runs := []struct {
		name string
		mut  func(*omnicache.Config)
	}{
		{"buffer on", func(*omnicache.Config) {}},
		{"buffer off", func(c *omnicache.Config) { c.DisableDecodeBuffer = true }},
		{"buffer on, tight budget", func(c *omnicache.Config) {
			c.DeviceBudgetBytes = 2048 // > the largest step (32 tokens × 52 bytes)
			c.DeferredChunkBytes = 512
		}},
		{"prefetch off", func(c *omnicache.Config) { c.DisablePrefetch = true }},
		{"tight read-ahead", func(c *omnicache.Config) {
			// Some hit steps' prefetch buffers do not fit: read at
			// Materialize, racing reassignment.
			c.ReadAheadBytes = 1024
			dev := gputest.NewFaulty(gpu.NewHost())
			dev.DelayWaits(100 * time.Microsecond)
			c.Device = dev
		}},
		{"buffer on, lagging committer", func(c *omnicache.Config) {
			// Every device wait takes longer: the committer falls behind
			// the engine, so writes skip slots newer writes claimed and
			// delayed reads race reassignment (the read protocol's case).
			dev := gputest.NewFaulty(gpu.NewHost())
			dev.DelayWaits(100 * time.Microsecond)
			c.Device = dev
		}},
	}
	// Seed 4 is seed 1's schedule with sparse steps: aux and an optional
	// deferred key omitted at random.
	for _, seed := range []uint64{1, 2, 3, 4} {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			base := base
			base.Keys = keys
			e := newPropEngine(seed, len(keys))
			if seed == 4 {
				base.Keys = []omnicache.Key{keyHidden, keyAux, keyCodesOpt}
				e = newPropEngine(1, len(keys))
				e.omitRng = rand.New(rand.NewPCG(4, 4^0x5eed))
				for _, k := range base.Keys {
					e.optional = append(e.optional, k.Optional)
				}
			}
			var acts []propAction
			for i := 0; i < propSteps; i++ {
				acts = append(acts, e.next(i))
			}
			if last := e.drainAll(); len(last.st.Finished) > 0 {
				acts = append(acts, last)
			}
			t.Logf("schedule: %d steps, %d requests, %d hits (%d tokens), %d pure decode steps, %d preemptions, %d resumes (%d with a hit), %d replaces, %d rejected drafts, %d aborts, %d continuations, %d implicit arrivals, %d zero-token steps",
				e.steps, e.nextID-1, e.hits, e.hitTokens, e.pureSteps, e.preempts, e.resumes, e.resumeHits, e.replaces, e.drafts, e.aborts, e.continued, e.implicit, e.zeroTokens)
			require.Positive(t, e.replaces, "the schedule must replace prompts")
			require.Positive(t, e.drafts, "the schedule must reject drafts")
			require.Positive(t, e.resumeHits, "the schedule must resume requests with a hit")
			require.Positive(t, e.hits, "the schedule must contain hits")
			require.Positive(t, e.pureSteps, "the schedule must contain pure decode steps")
			require.Positive(t, e.abortedHits, "the schedule must abort hit steps (%d aborts)", e.abortRetries)
			if e.omitRng != nil {
				require.Positive(t, e.omitted, "the schedule must omit keys")
			}

			caps := make([]capture, len(runs))
			for i, run := range runs {
				ok := t.Run(run.name, func(t *testing.T) {
					cfg := base
					run.mut(&cfg)
					h := newHarness(t, cfg)
					h.label = run.name
					h.keepRows = true
					caps[i] = runProp(h, acts)
					st := h.stats()
					t.Logf("cache: %d tasks, %d rows skipped (a newer write claimed them), %d delayed reads reassigned", st.WriteTasks, st.RowsSkipped, len(h.reassigned))
					assert.Zero(t, st.BudgetCharged, "Stats.BudgetCharged once every request finished")
					assert.Zero(t, st.PagesInUse, "Stats.PagesInUse once every step is consumed")
					assert.Equal(t, e.hits, st.HitRequests, "Stats.HitRequests")
					assert.Equal(t, e.hitTokens, st.HitTokens, "Stats.HitTokens")
					assert.EqualValues(t, len(acts), st.Steps, "Stats.Steps")
				})
				if !ok {
					return
				}
			}
			for i := 1; i < len(runs); i++ {
				compareCaptures(t, base, caps[0], caps[i], runs[0].name, runs[i].name)
			}
		})
	}
}
