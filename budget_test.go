package omnicache_test

// Budget and back-pressure: the device byte budget (pressure flushes the
// oldest writes, clones pinned by unconsumed steps, the decode buffer),
// the staging pages (a Save waits for a free page, pages recycle, the
// typed timeout, pages allocated one ahead, at New or ahead in the
// background), and owned host tensors handed back exactly once
// (Config.ReleaseHost).

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/cachetest"
	"github.com/omnicache/omnicache/internal/gputest"
)

// A parked decode step larger than the whole budget fails with ErrBudget,
// as the same step does with the buffer off. Budget 64 bytes, rows of 32. Step 1 prefills 4 tokens from host memory
// (no device bytes); step 2 is a pure decode step of 4 requests with
// non-owned device tensors: 128 bytes, more than the whole budget.
func TestBudgetErrorFromDecodeBuffer(t *testing.T) {
	c, err := omnicache.New(omnicache.Config{NumBlocks: 16, BlockSize: 4,
		Keys: []omnicache.Key{{Name: "hidden", RowBytes: 32}}, DeviceBudgetBytes: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	plan := &omnicache.Plan{IDs: []int64{1, 2, 3, 4}, Rows: []int32{0, 1, 2, 3}, Start: []int32{0, 0, 0, 0}, Count: []int32{1, 1, 1, 1},
		Table: []int32{0, 1, 2, 3}, Stride: 1, Arrivals: []int64{1, 2, 3, 4}, HitTokens: []int32{0, 0, 0, 0}}
	if err := c.Begin(plan); err != nil {
		t.Fatal(err)
	}
	id, err := c.Save(&omnicache.Outputs{Tokens: 4, Padded: 4, Tensors: []omnicache.Tensor{{Host: make([]byte, 128), Rows: 4}}})
	if err != nil {
		t.Fatal(err)
	}
	c.Discard(id)
	plan = &omnicache.Plan{IDs: []int64{1, 2, 3, 4}, Rows: []int32{0, 1, 2, 3}, Start: []int32{1, 1, 1, 1}, Count: []int32{1, 1, 1, 1},
		Table: []int32{0, 1, 2, 3}, Stride: 1}
	if err := c.Begin(plan); err != nil {
		t.Fatal(err)
	}
	_, err = c.Save(&omnicache.Outputs{Tokens: 4, Padded: 4, Tensors: []omnicache.Tensor{{Dev: gpu.HostBuffer(make([]byte, 128)), Rows: 4}}})
	if !errors.Is(err, omnicache.ErrBudget) {
		t.Fatalf("pure decode Save over the whole budget: %v, want ErrBudget", err)
	}
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

// With a budget of 3 step clones of the deferred key, the 4th
// forces the oldest pending write out; charged bytes never exceed the
// budget and return to 0 when idle.
func TestBudgetPressure(t *testing.T) {
	const r, q = 1, 2
	const chunk = 4 // tokens per step
	clone := int64(chunk * cachetest.KeyCodes.RowBytes)
	cfg := cachetest.Config(cachetest.KeyCodes) // the only key: every device byte is a deferred clone
	cfg.DeviceBudgetBytes = 3 * clone
	cfg.DeferredChunkBytes = clone
	h := cachetest.New(t, cfg)
	h.Device = true
	check := func(when string) {
		st := h.Stats()
		require.LessOrEqual(t, st.BudgetCharged, st.BudgetLimit, "Stats.BudgetCharged %s", when)
		require.LessOrEqual(t, st.BudgetPeak, st.BudgetLimit, "Stats.BudgetPeak %s", when)
	}
	h.Assign(r, 1, 2, 3, 4, 5)
	for i := 0; i < 4; i++ {
		st := cachetest.Step{Sched: []cachetest.S{{r, int64(i * chunk), chunk}}}
		if i == 0 {
			st.Arrive = []cachetest.A{{ID: r}}
		}
		s := h.Step(st)
		check("after Save")
		h.Mat(s)
		check("after Materialize")
	}
	st := h.Stats()
	require.EqualValues(t, 3*clone, st.BudgetLimit, "Stats.BudgetLimit")
	require.Positive(t, st.BudgetFlushes, "the 4th clone must force the oldest pending write out (Stats.BudgetFlushes)")
	h.Sync()
	h.ExpectBlock(0, 1, r, 0, 0) // the oldest chunk was written early, R still live

	// Q hits R's first 3 blocks: rows partly in the mirror, partly pending.
	h.Assign(q, 1, 2, 3, 6)
	h.Mat(h.Step(cachetest.Step{Sched: []cachetest.S{{r, 16, 1}, {q, 12, 2}}, Arrive: []cachetest.A{{ID: q, Hit: 12}}}))
	check("after the hit")
	h.Drain(r, q)
	h.Sync()
	st = h.Stats()
	assert.Zero(t, st.BudgetCharged, "Stats.BudgetCharged once every request finished")
	assert.LessOrEqual(t, st.BudgetPeak, st.BudgetLimit, "Stats.BudgetPeak")
	h.CheckMirror(0)
}

// With 2 pages, a third Save waits until a step is consumed;
// with StagingClaimTimeout NoWait it fails at once, naming the unconsumed
// step ids.
func TestStagingDepth(t *testing.T) {
	const a, b, c = 1, 2, 3
	setup := func(t *testing.T, timeout time.Duration) (*cachetest.Harness, omnicache.StepID, omnicache.StepID) {
		cfg := cachetest.Config()
		cfg.StagingDepth = 2
		cfg.StagingClaimTimeout = timeout
		h := cachetest.New(t, cfg)
		h.Assign(a, 1)
		h.Assign(b, 2)
		h.Assign(c, 3)
		s1 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 2}}, Arrive: []cachetest.A{{ID: a}}})
		s2 := h.Step(cachetest.Step{Sched: []cachetest.S{{b, 0, 2}}, Arrive: []cachetest.A{{ID: b}}})
		h.Begin(cachetest.Step{Sched: []cachetest.S{{c, 0, 2}}, Arrive: []cachetest.A{{ID: c}}})
		return h, s1, s2
	}

	t.Run("waits for a consumed step", func(t *testing.T) {
		h, s1, s2 := setup(t, 5*time.Second)
		done, join := h.SaveAsync(h.Outs())
		select {
		case <-done:
			id, err := join()
			t.Fatalf("the third Save returned (%v, %v) while both pages were held: it must wait for a consumed step", id, err)
		case <-time.After(100 * time.Millisecond):
		}
		h.Discard(s1) // from this goroutine, while the engine's Save waits
		s3, err := join()
		require.NoError(t, err, "the waiting Save must succeed once a page is free")
		h.Mat(s3)
		h.Mat(s2)
		h.Usable()
	})

	t.Run("NoWait fails at once naming the unconsumed steps", func(t *testing.T) {
		h, s1, s2 := setup(t, omnicache.NoWait)
		_, err := h.TrySave(h.Outs())
		require.ErrorIs(t, err, omnicache.ErrStagingTimeout, "Save with both pages held and NoWait")
		msg := err.Error()
		assert.Contains(t, msg, fmt.Sprint(s1), "the error must name unconsumed step %v", s1)
		assert.Contains(t, msg, fmt.Sprint(s2), "the error must name unconsumed step %v", s2)
		t.Logf("error: %v", err)
		h.Mat(s2)
		h.Mat(s1)
		h.Sync()
		h.Usable()
	})
}

// Six steps through four pages stay correct (pages recycle):
// every step is consumed three steps late, so four pages are in use at
// once; the steps hit blocks written by steps not consumed yet.
func TestPagesRecycle(t *testing.T) {
	cfg := cachetest.Config()
	cfg.StagingDepth = 4
	h := cachetest.New(t, cfg)
	steps := []struct {
		id     int64
		blocks []int32
		hit    int
		start  int
		count  int
	}{
		{1, []int32{1, 2}, 0, 0, 8},
		{2, []int32{1, 3}, 4, 4, 4},     // hits request 1's first block
		{3, []int32{1, 3, 4}, 8, 8, 4},  // hits request 2's chain
		{4, []int32{1, 2, 5}, 8, 8, 2},  // hits request 1's chain
		{5, []int32{6, 7}, 0, 0, 6},     // miss
		{6, []int32{6, 8, 9}, 4, 4, 6},  // hits request 5's first block
		{7, []int32{6, 8, 10}, 8, 8, 1}, // hits request 6's chain
	}
	var ids []omnicache.StepID
	for i, s := range steps {
		h.Assign(s.id, s.blocks...)
		ids = append(ids, h.Step(cachetest.Step{Sched: []cachetest.S{{s.id, int64(s.start), int64(s.count)}}, Arrive: []cachetest.A{{ID: s.id, Hit: s.hit}}}))
		require.LessOrEqual(t, h.Stats().PagesInUse, cfg.StagingDepth, "Stats.PagesInUse after step %d", i+1)
		if i >= 3 {
			if i == 4 {
				h.Discard(ids[i-3])
			} else {
				h.Mat(ids[i-3])
			}
		}
	}
	for _, id := range ids[len(ids)-3:] {
		h.Mat(id)
	}
	h.CheckMirror()
	assert.Zero(t, h.Stats().PagesInUse, "Stats.PagesInUse once every step is consumed")
}

// The staging-page timeout is a typed error naming the unconsumed steps.
func TestStagingTimeoutErrorAs(t *testing.T) {
	cfg := cachetest.Config()
	cfg.StagingDepth = 1
	cfg.StagingClaimTimeout = omnicache.NoWait
	h := cachetest.New(t, cfg)
	const a, b = 1, 2
	h.Assign(a, 1)
	h.Assign(b, 2)
	s1 := h.Step(cachetest.Step{Sched: []cachetest.S{{a, 0, 2}}, Arrive: []cachetest.A{{ID: a}}})
	h.Begin(cachetest.Step{Sched: []cachetest.S{{b, 0, 2}}, Arrive: []cachetest.A{{ID: b}}})
	_, err := h.TrySave(h.Outs())
	var te *omnicache.StagingTimeoutError
	require.True(t, errors.As(err, &te), "want a *StagingTimeoutError, got %v", err)
	require.ErrorIs(t, err, omnicache.ErrStagingTimeout)
	require.Equal(t, []omnicache.StepID{s1}, te.Unconsumed)
	require.Equal(t, 1, te.Depth)
	h.Mat(s1)
	h.Sync() // the page returns once s1's write landed too (NoWait does not wait for it)
	h.Usable()
}

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

// Owned host tensors come back through Config.ReleaseHost exactly once, and
// only when the cache no longer needs them: an engine that recycles them at
// once still gets the right rows from Materialize and in the mirror.
func TestReleaseHostRecycling(t *testing.T) {
	const bs, reqs, rb = 4, 4, 16
	const blocksPer = 8
	var mu sync.Mutex
	var free [][]byte
	out := map[unsafe.Pointer]bool{} // handed to the cache, not back yet
	release := func(b []byte) {
		mu.Lock()
		defer mu.Unlock()
		p := unsafe.Pointer(unsafe.SliceData(b))
		require.True(t, out[p], "a buffer came back that the cache did not hold (or came back twice)")
		delete(out, p)
		// Recycle at once, scribbling over it as an engine's next forward would.
		for i := range b {
			b[i] = 0xEE
		}
		free = append(free, b[:cap(b)])
	}
	get := func(n int) []byte {
		mu.Lock()
		defer mu.Unlock()
		var b []byte
		if k := len(free); k > 0 && cap(free[k-1]) >= n*rb {
			b, free = free[k-1][:n*rb], free[:k-1]
		} else {
			b = make([]byte, n*rb, reqs*blocksPer*bs*rb)
		}
		out[unsafe.Pointer(unsafe.SliceData(b))] = true
		return b
	}
	row := func(req, pos int) []byte {
		r := make([]byte, rb)
		for i := range r {
			r[i] = byte(req*31 + pos*7 + i)
		}
		return r
	}
	for _, buffer := range []bool{true, false} {
		c, err := omnicache.New(omnicache.Config{NumBlocks: reqs * blocksPer, BlockSize: bs,
			Keys:                []omnicache.Key{{Name: "hidden", RowBytes: rb}},
			DisableDecodeBuffer: !buffer, ReleaseHost: release})
		require.NoError(t, err)
		table := make([]int32, reqs*blocksPer)
		for i := range table {
			table[i] = int32(i)
		}
		plan := omnicache.Plan{Table: table, Stride: blocksPer}
		for r := 0; r < reqs; r++ {
			plan.IDs = append(plan.IDs, int64(r))
			plan.Rows = append(plan.Rows, int32(r))
			plan.Start = append(plan.Start, 0)
			plan.Count = append(plan.Count, 5)
			plan.Arrivals = append(plan.Arrivals, int64(r))
			plan.HitTokens = append(plan.HitTokens, 0)
		}
		var res omnicache.Result
		var prev omnicache.StepID
		var prevStart []int32
		prevCount := []int32(nil)
		for step := 0; plan.Start[0]+plan.Count[0] <= blocksPer*bs; step++ {
			require.NoError(t, c.Begin(&plan))
			n := 0
			for _, cnt := range plan.Count {
				n += int(cnt)
			}
			b := get(n)
			off := 0
			for r := range plan.IDs {
				for p := plan.Start[r]; p < plan.Start[r]+plan.Count[r]; p++ {
					copy(b[off*rb:], row(r, int(p)))
					off++
				}
			}
			id, err := c.Save(&omnicache.Outputs{Tokens: n, Tensors: []omnicache.Tensor{{Host: b, Rows: n, Owned: true}}})
			require.NoError(t, err)
			if prev != 0 {
				require.NoError(t, c.Materialize(prev, nil, &res))
				for r := 0; r < res.Len(); r++ {
					got := res.Rows(r, 0)
					for i := 0; i < int(prevCount[r]); i++ {
						require.True(t, bytes.Equal(got[i*rb:(i+1)*rb], row(r, int(prevStart[r])+i)),
							"buffer=%v step %d request %d row %d", buffer, step-1, r, i)
					}
				}
			}
			prev = id
			prevStart = append(prevStart[:0], plan.Start...)
			prevCount = append(prevCount[:0], plan.Count...)
			plan.Arrivals, plan.HitTokens = nil, nil
			for r := range plan.Start {
				plan.Start[r] += plan.Count[r]
				plan.Count[r] = 1
			}
		}
		require.NoError(t, c.Discard(prev))
		require.NoError(t, c.Sync())
		got := make([]byte, rb)
		for r := 0; r < reqs; r++ {
			for p := 0; p < int(plan.Start[r]); p++ {
				require.NoError(t, c.Peek(0, []int32{table[r*blocksPer+p/bs]*bs + int32(p%bs)}, got))
				require.True(t, bytes.Equal(got, row(r, p)), "buffer=%v mirror request %d position %d", buffer, r, p)
			}
		}
		require.NoError(t, c.Close())
		mu.Lock()
		require.Empty(t, out, "buffer=%v: owned buffers the cache never handed back", buffer)
		mu.Unlock()
	}
}
