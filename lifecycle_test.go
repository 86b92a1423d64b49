package omnicache_test

// Lifecycle and misuse: the calls' sequence (Begin, Save, Abort), nil
// arguments, bad configs and size bounds, bad plans and hits, step ids,
// outputs that do not match the step, and the closed cache. Every misuse
// must return its typed error (errors.Is) and leave the cache usable: each
// one is followed by a correct step (Harness.Usable).
//
// The error catalogue (every error an engine can trigger at run time) → test:
//   unaligned hit                         TestUnalignedHit
//   hit without block ids                 TestHitWithoutBlockIDs
//   slot count ≠ scheduled tokens         TestOutputsMismatch
//   output tensor with too few rows       TestOutputsMismatch
//   step larger than a staging page       TestStepTooLarge
//   unknown or already consumed step id   TestStepIDMisuse
//   request outside the step's snapshot   TestStepIDMisuse
//   hit over absent required rows         TestAbsentRequired (hits_test.go)
//   delayed read of reassigned slots      TestDelayedReadReassigned (hits_test.go)
//   staging page timeout                  TestStagingDepth (budget_test.go)
//   closed cache                          TestErrorCatalogue/closed
//   bad config                            TestErrorCatalogue/config
//   block table too narrow (and other
//   plan inconsistencies)                 TestErrorCatalogue/plan
//   calls out of sequence                 TestErrorCatalogue/sequence
//   reservation over the device budget    TestErrorCatalogue/budget
//   failed write (sticky)                 TestStickyWriteFailure (failures_test.go)

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/cachetest"
	"github.com/omnicache/omnicache/tier"
)

// A hit with hit_tokens > 0 and no block ids fails at Begin;
// so do too few and left-over block ids. A failed Begin registers nothing:
// the corrected plan with the same id hits.
func TestHitWithoutBlockIDs(t *testing.T) {
	const a, b = 1, 2
	h := cachetest.New(t, cachetest.Config())
	h.Assign(a, 1, 2)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 8}}, Arrive: []cachetest.A{{ID: a}}}))
	h.Assign(b, 1, 2, 3)
	for _, tc := range []struct {
		name string
		hit  int
		ids  []int32
	}{
		{"no block ids", 8, []int32{}},
		{"too few block ids", 8, []int32{1}},
		{"left-over block ids", 4, []int32{1, 2}},
	} {
		err := h.TryBegin(cachetest.Step{Sched: []cachetest.S{{b, int64(tc.hit), 2}}, Arrive: []cachetest.A{{ID: b, Hit: tc.hit, Blocks: tc.ids}}})
		require.ErrorIs(t, err, omnicache.ErrHitBlocks, "%s: hit_tokens=%d with block ids %v", tc.name, tc.hit, tc.ids)
		t.Logf("%s: %v", tc.name, err)
	}
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{b, 8, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 8}}}))
	require.Equal(t, 8, h.Res.Prefix(0), "after failed Begins, the corrected arrival must hit")
	h.Usable()
}

// A hit not block aligned (6 tokens, block 4) fails at Begin;
// the corrected plan with the same id hits.
func TestUnalignedHit(t *testing.T) {
	const a, b = 1, 2
	h := cachetest.New(t, cachetest.Config())
	h.Assign(a, 1, 2)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 8}}, Arrive: []cachetest.A{{ID: a}}}))
	h.Assign(b, 1, 2, 3)
	err := h.TryBegin(cachetest.Step{Sched: []cachetest.S{{b, 6, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 6, Blocks: []int32{1, 2}}}})
	require.ErrorIs(t, err, omnicache.ErrUnalignedHit, "hit_tokens 6 with block size 4")
	t.Logf("error: %v", err)
	err = h.TryBegin(cachetest.Step{Sched: []cachetest.S{{b, 6, 2}}, Arrive: []cachetest.A{{ID: b, Hit: 6, Blocks: []int32{1}}}})
	require.ErrorIs(t, err, omnicache.ErrUnalignedHit, "hit_tokens 6 with one block id")

	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{b, 4, 4}}, Arrive: []cachetest.A{{ID: b, Hit: 4}}}))
	require.Equal(t, 4, h.Res.Prefix(0), "after failed Begins, the corrected arrival must hit")
	h.Usable()
}

// Materialize or discard twice, an unknown id, a request
// outside the step: typed errors, the cache stays usable.
func TestStepIDMisuse(t *testing.T) {
	const a, b = 1, 2
	h := cachetest.New(t, cachetest.Config())
	h.Assign(a, 1, 2)
	h.Assign(b, 3)
	s1 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}, {b, 0, 2}}, Arrive: []cachetest.A{{ID: a}, {ID: b}}})
	h.Mat(s1)
	require.ErrorIs(t, h.MatCall(s1, nil, &h.Res), omnicache.ErrUnknownStep, "Materialize twice")
	require.ErrorIs(t, h.TryDiscard(s1), omnicache.ErrUnknownStep, "Discard after Materialize")

	s2 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 4, 1}, {b, 2, 1}}})
	h.Discard(s2)
	require.ErrorIs(t, h.TryDiscard(s2), omnicache.ErrUnknownStep, "Discard twice")
	require.ErrorIs(t, h.MatCall(s2, nil, &h.Res), omnicache.ErrUnknownStep, "Materialize after Discard")

	unknown := s2 + 1000
	require.ErrorIs(t, h.MatCall(unknown, nil, &h.Res), omnicache.ErrUnknownStep, "Materialize of an id never returned by Save")
	require.ErrorIs(t, h.TryDiscard(unknown), omnicache.ErrUnknownStep, "Discard of an id never returned by Save")

	// b is live but not in s3; 999 was never seen.
	s3 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 5, 1}}})
	for _, reqs := range [][]int64{{b}, {999}, {a, b}} {
		err := h.MatCall(s3, reqs, &h.Res)
		require.ErrorIs(t, err, omnicache.ErrNotInStep, "Materialize(s3, %v): request outside the step", reqs)
		t.Logf("Materialize(s3, %v): %v", reqs, err)
	}
	// The spec does not say whether a refused read consumes the step:
	// either it still materializes, or it is gone.
	if err := h.MatCall(s3, []int64{a}, &h.Res); err != nil {
		require.ErrorIs(t, err, omnicache.ErrUnknownStep, "Materialize after ErrNotInStep: success or an already consumed step")
	} else {
		require.NoError(t, h.Verify(s3, []int64{a}, &h.Res))
	}
	h.Usable()
	assert.Zero(t, h.Stats().PagesInUse, "Stats.PagesInUse once every step is consumed")
}

// A step with more tokens than a staging page fails at once:
// Begin rejects it, naming the capacity, before sizing anything from it.
func TestStepTooLarge(t *testing.T) {
	const a, b = 1, 2
	cfg := cachetest.Config()
	cfg.StagingCapacityTokens = 8
	h := cachetest.New(t, cfg)
	h.Assign(a, 1, 2, 3)
	err := h.TryBegin(cachetest.Step{Sched: []cachetest.S{{a, 0, 12}}, Arrive: []cachetest.A{{ID: a}}})
	require.ErrorIs(t, err, omnicache.ErrStepTooLarge, "a 12-token step with 8-token pages")
	assert.Contains(t, err.Error(), "8", "the error must name the page capacity (8 tokens)")
	t.Logf("error: %v", err)

	h.Assign(b, 4, 5)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{b, 0, 8}}, Arrive: []cachetest.A{{ID: b}}})) // exactly one page
	h.Usable()
}

// Outputs whose token count differs from the scheduled tokens
// (ErrTokenCount), and tensors with fewer rows than tokens, short buffers or
// a wrong tensor count (ErrOutputs).
func TestOutputsMismatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		device bool
		bad    func(o *omnicache.Outputs)
		want   error
	}{
		{"fewer tokens than scheduled", false, func(o *omnicache.Outputs) { o.Tokens--; o.Padded-- }, omnicache.ErrTokenCount},
		{"more tokens than scheduled", false, func(o *omnicache.Outputs) {
			o.Tokens++
			o.Padded++
			for i := range o.Tensors {
				o.Tensors[i].Host = append(o.Tensors[i].Host, make([]byte, 64)...)
				o.Tensors[i].Rows++
			}
		}, omnicache.ErrTokenCount},
		{"tensor with fewer rows than tokens", false, func(o *omnicache.Outputs) { o.Tensors[0].Rows-- }, omnicache.ErrOutputs},
		{"host buffer shorter than its rows", false, func(o *omnicache.Outputs) {
			o.Tensors[1].Host = o.Tensors[1].Host[:len(o.Tensors[1].Host)-1]
		}, omnicache.ErrOutputs},
		{"device buffer shorter than its rows", true, func(o *omnicache.Outputs) {
			o.Tensors[0].Dev = gpu.HostBuffer(o.Tensors[0].Dev.Host[:len(o.Tensors[0].Dev.Host)-1])
		}, omnicache.ErrOutputs},
		{"fewer tensors than keys", false, func(o *omnicache.Outputs) { o.Tensors = o.Tensors[:1] }, omnicache.ErrOutputs},
		{"more tensors than keys", false, func(o *omnicache.Outputs) { o.Tensors = append(o.Tensors, o.Tensors[0]) }, omnicache.ErrOutputs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const a = 1
			h := cachetest.New(t, cachetest.Config())
			h.Device = tc.device
			h.Assign(a, 1, 2)
			h.Begin(cachetest.Step{Sched: []cachetest.S{{a, 0, 6}}, Arrive: []cachetest.A{{ID: a}}})
			o := h.Outs()
			tc.bad(o)
			_, err := h.TrySave(o)
			require.ErrorIs(t, err, tc.want)
			t.Logf("error: %v", err)
			h.Usable()
		})
	}
}

// TestErrorCatalogue covers the catalogue's entries no scenario covers: bad config,
// plan inconsistencies, calls out of sequence, a reservation larger than
// the device budget, and the closed cache.
func TestErrorCatalogue(t *testing.T) {
	t.Run("config", func(t *testing.T) {
		valid := func() omnicache.Config { return cachetest.Config() }
		for _, tc := range []struct {
			name string
			mut  func(c *omnicache.Config)
		}{
			{"zero blocks", func(c *omnicache.Config) { c.NumBlocks = 0 }},
			{"negative blocks", func(c *omnicache.Config) { c.NumBlocks = -1 }},
			{"zero block size", func(c *omnicache.Config) { c.BlockSize = 0 }},
			{"negative block size", func(c *omnicache.Config) { c.BlockSize = -4 }},
			{"no keys", func(c *omnicache.Config) { c.Keys = nil }},
			{"zero row bytes", func(c *omnicache.Config) { c.Keys = []omnicache.Key{cachetest.KeyHidden, {Name: "empty", RowBytes: 0}} }},
			{"negative row bytes", func(c *omnicache.Config) { c.Keys = []omnicache.Key{{Name: "neg", RowBytes: -8}} }},
			{"duplicate key names", func(c *omnicache.Config) {
				c.Keys = []omnicache.Key{cachetest.KeyHidden, cachetest.KeyAux, {Name: "hidden", RowBytes: 8}}
			}},
			{"negative staging depth", func(c *omnicache.Config) { c.StagingDepth = -1 }},
			{"negative staging capacity", func(c *omnicache.Config) { c.StagingCapacityTokens = -1 }},
			{"negative device budget", func(c *omnicache.Config) { c.DeviceBudgetBytes = -1 }},
			{"negative sync spin", func(c *omnicache.Config) { c.SyncSpin = -time.Microsecond }},
			{"sync spin over MaxSyncSpin", func(c *omnicache.Config) { c.SyncSpin = omnicache.MaxSyncSpin + 1 }},
		} {
			cfg := valid()
			tc.mut(&cfg)
			c, err := omnicache.New(cfg)
			assert.ErrorIs(t, err, omnicache.ErrConfig, "New with %s", tc.name)
			if c != nil {
				assert.Failf(t, "New returned a cache for a bad config", "%s", tc.name)
				_ = c.Close()
			}
		}
		h := cachetest.New(t, valid()) // the control: the valid config works
		h.Usable()
		spinning := valid() // Sync spinning through the committer's work
		spinning.SyncSpin = omnicache.MaxSyncSpin
		cachetest.New(t, spinning).Usable()
	})

	t.Run("plan", func(t *testing.T) {
		const a, b = 1, 2
		h := cachetest.New(t, cachetest.Config())
		h.Assign(a, 1, 2)
		h.Assign(b, 3)
		h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 4}}, Arrive: []cachetest.A{{ID: a}}}))
		good := cachetest.Step{Sched: []cachetest.S{{a, 4, 2}, {b, 0, 2}}, Arrive: []cachetest.A{{ID: b}}}
		for _, tc := range []struct {
			name string
			mut  func(p *omnicache.Plan)
		}{
			{"Rows shorter than IDs", func(p *omnicache.Plan) { p.Rows = p.Rows[:1] }},
			{"Start shorter than IDs", func(p *omnicache.Plan) { p.Start = p.Start[:1] }},
			{"Count longer than IDs", func(p *omnicache.Plan) { p.Count = append(p.Count, 1) }},
			{"HitTokens shorter than Arrivals", func(p *omnicache.Plan) { p.HitTokens = nil }},
			{"row outside the block table", func(p *omnicache.Plan) { p.Rows[1] = int32(len(p.Table) / p.Stride) }},
			{"negative row", func(p *omnicache.Plan) { p.Rows[1] = -1 }},
			{"table too narrow for a position", func(p *omnicache.Plan) {
				// Stride 1: request a's position 4 needs a second column.
				rows := len(p.Table) / p.Stride
				t1 := make([]int32, rows)
				for r := 0; r < rows; r++ {
					t1[r] = p.Table[r*p.Stride]
				}
				p.Table, p.Stride = t1, 1
			}},
			{"table shorter than its rows", func(p *omnicache.Plan) { p.Table = p.Table[:len(p.Table)-p.Stride] }},
			{"request scheduled twice", func(p *omnicache.Plan) {
				p.IDs[1] = p.IDs[0]
				p.Arrivals, p.HitTokens = nil, nil
			}},
			{"negative position", func(p *omnicache.Plan) { p.Start[1] = -1 }},
			{"block id outside the cache", func(p *omnicache.Plan) { p.Table[int(p.Rows[1])*p.Stride] = cachetest.NumBlocks }},
		} {
			p := h.Plan(good)
			tc.mut(p)
			err := h.BeginPlan(p)
			require.ErrorIs(t, err, omnicache.ErrPlan, "Begin with %s", tc.name)
			t.Logf("%s: %v", tc.name, err)
		}
		// A hit block id outside the cache: a bad plan or a bad hit.
		h.Assign(3, 4, 5)
		p := h.Plan(cachetest.Step{Sched: []cachetest.S{{3, 4, 1}}, Arrive: []cachetest.A{{ID: 3, Hit: 4, Blocks: []int32{cachetest.NumBlocks + 3}}}})
		err := h.BeginPlan(p)
		require.Error(t, err, "Begin with a hit block id outside the cache")
		require.True(t, isAny(err, omnicache.ErrPlan, omnicache.ErrHitBlocks), "hit block id outside the cache: want ErrPlan or ErrHitBlocks, got %v", err)

		// The failed Begins registered nothing: the good plan works, and b
		// is a fresh arrival.
		h.Mat(h.Step(good))
		h.Usable()
	})

	t.Run("sequence", func(t *testing.T) {
		const a, b = 1, 2
		h := cachetest.New(t, cachetest.Config())
		h.Assign(a, 1)
		h.Assign(b, 2)
		first := cachetest.Step{Sched: []cachetest.S{{a, 0, 2}}, Arrive: []cachetest.A{{ID: a}}}
		_, err := h.TrySave(h.OutputsFor(first))
		require.ErrorIs(t, err, omnicache.ErrSequence, "Save without Begin")
		h.Usable()

		// Begin twice without Save: the second fails, the first stays begun.
		h.Begin(first)
		p := h.Plan(cachetest.Step{Sched: []cachetest.S{{b, 0, 2}}, Arrive: []cachetest.A{{ID: b}}})
		require.ErrorIs(t, h.BeginPlan(p), omnicache.ErrSequence, "Begin twice without Save")
		s := h.Save()
		h.Mat(s)
		_, err = h.TrySave(h.OutputsFor(first))
		require.ErrorIs(t, err, omnicache.ErrSequence, "Save twice after one Begin")
		h.Usable()
	})

	t.Run("budget", func(t *testing.T) {
		// One key of 32-byte rows on the device, a budget of 4 rows: an
		// 8-token step's clone can never fit.
		cfg := cachetest.Config(cachetest.KeyHidden)
		cfg.DeviceBudgetBytes = 4 * int64(cachetest.KeyHidden.RowBytes)
		cfg.DeferredChunkBytes = cfg.DeviceBudgetBytes
		h := cachetest.New(t, cfg)
		h.Device = true
		const a = 1
		h.Assign(a, 1, 2)
		h.Begin(cachetest.Step{Sched: []cachetest.S{{a, 0, 8}}, Arrive: []cachetest.A{{ID: a}}})
		_, err := h.TrySave(h.Outs())
		require.ErrorIs(t, err, omnicache.ErrBudget, "a step clone larger than the whole device budget")
		t.Logf("error: %v", err)
		h.Usable() // 3 tokens fit
		st := h.Stats()
		assert.LessOrEqual(t, st.BudgetPeak, st.BudgetLimit, "Stats.BudgetPeak <= BudgetLimit")
		assert.EqualValues(t, cfg.DeviceBudgetBytes, st.BudgetLimit, "Stats.BudgetLimit")
	})

	t.Run("closed", func(t *testing.T) {
		const a, b = 1, 2
		h := cachetest.New(t, cachetest.Config())
		h.Assign(a, 1)
		h.Assign(b, 2)
		s1 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 2}}, Arrive: []cachetest.A{{ID: a}}}) // left unconsumed
		h.MarkClosed()
		require.NoError(t, cachetest.Guard(t, "Close", func() error { return h.C.Close() }), "Close")
		st := h.Stats()
		assert.Zero(t, st.PagesInUse, "Close releases the pages")
		assert.Zero(t, st.BudgetCharged, "Close releases the budget")

		bs := cachetest.Step{Sched: []cachetest.S{{b, 0, 2}}, Arrive: []cachetest.A{{ID: b}}}
		require.ErrorIs(t, h.BeginPlan(h.Plan(bs)), omnicache.ErrClosed, "Begin after Close")
		_, err := h.TrySave(h.OutputsFor(bs))
		require.ErrorIs(t, err, omnicache.ErrClosed, "Save after Close")
		require.ErrorIs(t, h.MatCall(s1, nil, &h.Res), omnicache.ErrClosed, "Materialize after Close")
		require.ErrorIs(t, h.TryDiscard(s1), omnicache.ErrClosed, "Discard after Close")
		require.ErrorIs(t, h.TrySync(), omnicache.ErrClosed, "Sync after Close")
		err = cachetest.Guard(t, "second Close", func() error { return h.C.Close() })
		if err != nil {
			require.ErrorIs(t, err, omnicache.ErrClosed, "a second Close returns nil or ErrClosed")
		}
	})
}

func isAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// TestBlockIDsLongStep: a step of many tokens a request checks the block
// ids its requests use in the table (not each token's slot): a used entry
// outside [0, NumBlocks), first, inside or last of a request's span, fails
// Begin with ErrPlan and changes nothing; an entry the step does not use
// is not looked at.
func TestBlockIDsLongStep(t *testing.T) {
	const a = 1
	h := cachetest.New(t, cachetest.Config())
	h.Assign(a, 4, 5, 6, 7)
	long := cachetest.Step{Sched: []cachetest.S{{a, 0, 11}}, Arrive: []cachetest.A{{ID: a}}} // positions 0..10: table columns 0..2
	for _, tc := range []struct {
		name string
		col  int
		id   int32
	}{
		{"first column beyond NumBlocks", 0, cachetest.NumBlocks},
		{"middle column negative", 1, -1},
		{"last column far beyond", 2, cachetest.NumBlocks + 100},
	} {
		p := h.Plan(long)
		p.Table[int(p.Rows[0])*p.Stride+tc.col] = tc.id
		err := h.BeginPlan(p)
		require.ErrorIs(t, err, omnicache.ErrPlan, tc.name)
		require.ErrorContains(t, err, "beyond NumBlocks", tc.name)
	}
	p := h.Plan(long)
	p.Table[int(p.Rows[0])*p.Stride+3] = cachetest.NumBlocks // column 3: not used by this step
	require.NoError(t, h.BeginPlan(p), "an unused table entry is not checked")
	require.NoError(t, h.C.Abort())
	h.Mat(h.Step(long)) // the failed Begins registered nothing
	h.Usable()
}

// Nil arguments are typed errors that change nothing: Begin(nil) is
// ErrPlan, Save(nil) ErrOutputs (undoing its Begin as any refused Save),
// Materialize into a nil Result ErrOutputs with the step still unconsumed
// (its staging page held: with one page, materializing it afterwards is
// what lets the next Save through). None panics.
func TestNilArguments(t *testing.T) {
	cfg := cachetest.Config()
	cfg.StagingDepth = 1
	cfg.StagingClaimTimeout = omnicache.NoWait
	h := cachetest.New(t, cfg)
	before := h.C.Stats()
	require.ErrorIs(t, cachetest.Guard(t, "Begin(nil)", func() error { return h.C.Begin(nil) }), omnicache.ErrPlan)
	require.Equal(t, before, h.C.Stats(), "Begin(nil) changed the cache")

	const a, b = 1, 2
	h.Assign(a, 1)
	h.Begin(cachetest.Step{Sched: []cachetest.S{{a, 0, 3}}, Arrive: []cachetest.A{{ID: a}}})
	err := cachetest.Guard(t, "Save(nil)", func() error { _, err := h.C.Save(nil); return err })
	require.ErrorIs(t, err, omnicache.ErrOutputs)
	require.ErrorIs(t, h.C.Begin(nil), omnicache.ErrPlan)
	h.Begin(cachetest.Step{Sched: []cachetest.S{{a, 0, 3}}}) // the refused Save undid its Begin (a stays live)
	sid := h.Save()
	err = cachetest.Guard(t, "Materialize(nil Result)", func() error { return h.C.Materialize(sid, nil, nil) })
	require.ErrorIs(t, err, omnicache.ErrOutputs)
	h.Mat(sid)                     // still unconsumed: its rows are all there
	require.NoError(t, h.C.Sync()) // its page is back once its write landed
	h.Assign(b, 2)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{b, 0, 2}}, Arrive: []cachetest.A{{ID: b}}})) // the page came back
	require.NoError(t, h.C.Sync())
	h.Usable()
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

// Abort: a forward that fails after Begin abandons the step (the request
// it finished is live again); the same plan then runs as if the failed
// attempt never happened (its hit is served), and Abort outside a begun
// step is ErrSequence.
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
	require.Equal(t, before.LiveRequests, after.LiveRequests, "a is live again, b is gone again")
	require.ErrorIs(t, h.C.Abort(), omnicache.ErrSequence, "Abort twice")
	_, err := h.C.Save(&omnicache.Outputs{})
	require.ErrorIs(t, err, omnicache.ErrSequence, "Save after Abort")
	h.Mat(h.Step(hit))
	require.Equal(t, 4, h.Res.Prefix(0), "the hit is served when the step runs again")
	h.Usable()
}

// An empty step right after an aborted one must not see the aborted
// step's requests (a stale batch once made Save index past the empty
// step's counts, with a deferred key, and panic).
func TestEmptyStepAfterAbort(t *testing.T) {
	cfg := cachetest.Config(cachetest.KeyHidden, omnicache.Key{Name: "codes", RowBytes: 8, Deferred: true})
	c, err := omnicache.New(cfg)
	require.NoError(t, err)
	defer c.Close()
	table := []int32{1, 2, 3, 4}
	p := &omnicache.Plan{IDs: []int64{1, 2}, Rows: []int32{0, 1}, Start: []int32{0, 0}, Count: []int32{2, 2},
		Table: table, Stride: 2, Arrivals: []int64{1, 2}, HitTokens: []int32{0, 0}}
	require.NoError(t, c.Begin(p))
	require.NoError(t, c.Abort())
	require.NoError(t, c.Begin(&omnicache.Plan{Table: table, Stride: 2}))
	var id omnicache.StepID
	err = cachetest.Guard(t, "Save", func() (err error) { id, err = c.Save(cachetest.EmptyOutputs(2)); return err })
	require.NoError(t, err)
	require.NoError(t, c.Discard(id))
}
