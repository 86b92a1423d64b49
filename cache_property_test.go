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
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
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
	mode     int
	reqs     []int64
	check    bool
}

type propReq struct {
	id            int64
	prompt, total int // tokens to prefill (grows to cover a recompute), total tokens
	done          int
	blocks        []int32
}

// propEngine is a tiny scheduler with a KV block manager: ref-counted
// blocks, an LRU free list whose full blocks stay hittable until reused.
type propEngine struct {
	rng       *rand.Rand
	bs        int
	nkeys     int
	ref       []int
	filled    []int // positions the block's current tenant wrote
	free      []int32
	reqs      map[int64]*propReq
	running   []int64
	preempted []int64
	complete  []int64

	nextID     int64
	hits       int64 // arrivals with a hit
	hitTokens  int64
	steps      int
	continued  int
	preempts   int
	resumes    int
	aborts     int
	implicit   int
	pureSteps  int
	zeroTokens int
}

func newPropEngine(seed uint64, nkeys int) *propEngine {
	e := &propEngine{
		rng:    rand.New(rand.NewPCG(seed, seed^0x5eed)),
		bs:     testBlockSize,
		nkeys:  nkeys,
		ref:    make([]int, propBlocks),
		filled: make([]int, propBlocks),
		reqs:   map[int64]*propReq{},
		nextID: 1,
	}
	for b := 0; b < propBlocks; b++ {
		e.free = append(e.free, int32(b))
	}
	return e
}

func (e *propEngine) takeFree(b int32) {
	for i, x := range e.free {
		if x == b {
			e.free = append(e.free[:i], e.free[i+1:]...)
			return
		}
	}
}

func (e *propEngine) alloc(n int) []int32 {
	if len(e.free) < n {
		return nil
	}
	out := append([]int32(nil), e.free[:n]...)
	e.free = e.free[n:]
	for _, b := range out {
		e.ref[b] = 1
		e.filled[b] = 0 // a new tenant: the block is no longer cached
	}
	return out
}

func (e *propEngine) release(bl []int32) {
	for _, b := range bl {
		e.ref[b]--
		if e.ref[b] == 0 {
			e.free = append(e.free, b)
		}
	}
}

func (e *propEngine) hittable() []int32 {
	var out []int32
	for b := range e.filled {
		if e.filled[b] == e.bs {
			out = append(out, int32(b))
		}
	}
	return out
}

func (e *propEngine) blocksFor(tokens int) int { return (tokens + e.bs - 1) / e.bs }

func remove(ids []int64, id int64) []int64 {
	for i, x := range ids {
		if x == id {
			return append(ids[:i], ids[i+1:]...)
		}
	}
	return ids
}

// schedule appends n tokens of r to the step and marks them written.
func (e *propEngine) schedule(act *propAction, r *propReq, n int) {
	act.st.Sched = append(act.st.Sched, S{r.id, r.done, n})
	for p := r.done; p < r.done+n; p++ {
		e.filled[r.blocks[p/e.bs]]++
	}
	r.done += n
}

func (e *propEngine) finish(act *propAction, id int64) {
	r := e.reqs[id]
	e.release(r.blocks)
	e.running = remove(e.running, id)
	e.preempted = remove(e.preempted, id)
	delete(e.reqs, id)
	act.st.Finished = append(act.st.Finished, id)
	act.unassign = append(act.unassign, id)
}

// next generates step i.
func (e *propEngine) next(i int) propAction {
	var act propAction
	rng := e.rng
	quiet := (i/40)%2 == 1 // alternate busy and quiet (decode-heavy) phases

	// 1. Finished: requests that completed last step, plus random aborts.
	done := e.complete
	e.complete = nil
	for _, id := range done {
		e.finish(&act, id)
	}
	for _, id := range append(append([]int64{}, e.running...), e.preempted...) {
		if rng.Float64() < 0.012 {
			e.finish(&act, id)
			e.aborts++
		}
	}
	// 2. Preemption: blocks freed (still cached), recompute from 0 later.
	if len(e.running) > 0 && rng.Float64() < 0.04 {
		id := e.running[rng.IntN(len(e.running))]
		r := e.reqs[id]
		e.release(r.blocks)
		r.blocks = nil
		r.prompt = max(r.prompt, r.done)
		r.done = 0
		e.running = remove(e.running, id)
		e.preempted = append(e.preempted, id)
		act.st.Preempted = append(act.st.Preempted, id)
		e.preempts++
	}
	// 3. Resume the oldest preempted request if its blocks fit.
	if len(e.preempted) > 0 && len(e.running) < propMaxRunning && rng.Float64() < 0.3 {
		id := e.preempted[0]
		if !containsID(act.st.Preempted, id) {
			r := e.reqs[id]
			if bl := e.alloc(e.blocksFor(r.total)); bl != nil {
				r.blocks = bl
				e.preempted = e.preempted[1:]
				e.running = append(e.running, id)
				act.st.Resumed = append(act.st.Resumed, id)
				act.assign = append(act.assign, propAssign{id, bl})
				act.bump = append(act.bump, id)
				e.resumes++
			}
		}
	}
	// 4. Schedule the running requests: a prefill chunk or one decode token.
	budget := propTokenBudget
	for _, id := range e.running {
		r := e.reqs[id]
		n := 1
		if r.done < r.prompt {
			n = min(r.prompt-r.done, propChunk)
		}
		n = min(n, budget, r.total-r.done)
		if n <= 0 {
			continue
		}
		e.schedule(&act, r, n)
		budget -= n
	}
	// 5. A streamed continuation: a scheduled live request listed as an
	//    arrival again, with a well-formed hit that must be ignored.
	if len(act.st.Sched) > 0 && rng.Float64() < 0.05 {
		s := act.st.Sched[rng.IntN(len(act.st.Sched))]
		r := e.reqs[s.ID]
		act.st.Arrive = append(act.st.Arrive, A{ID: r.id, Hit: e.bs, Blocks: []int32{r.blocks[0]}})
		e.continued++
	}
	// 6. Arrivals, some hitting cached full blocks (any order of them).
	pArr := 0.45
	if quiet {
		pArr = 0.06
	}
	if len(e.running) == 0 {
		pArr = 1
	}
	for try := 0; try < 2; try++ {
		if len(e.running) >= propMaxRunning || budget <= 0 || rng.Float64() >= pArr {
			continue
		}
		prompt := 1 + rng.IntN(20)
		total := prompt + 1 + rng.IntN(12)
		var hit []int32
		if rng.Float64() < 0.6 {
			hb := e.hittable()
			if maxK := min(len(hb), (prompt-1)/e.bs); maxK > 0 {
				rng.Shuffle(len(hb), func(i, j int) { hb[i], hb[j] = hb[j], hb[i] })
				hit = hb[:1+rng.IntN(maxK)]
			}
		}
		freeAfterHit := len(e.free)
		for _, b := range hit {
			if e.ref[b] == 0 {
				freeAfterHit--
			}
		}
		need := e.blocksFor(total) - len(hit)
		if freeAfterHit < need {
			continue
		}
		for _, b := range hit {
			if e.ref[b] == 0 {
				e.takeFree(b)
			}
			e.ref[b]++
		}
		fresh := e.alloc(need)
		r := &propReq{id: e.nextID, prompt: prompt, total: total, done: len(hit) * e.bs}
		e.nextID++
		r.blocks = append(append([]int32{}, hit...), fresh...)
		e.reqs[r.id] = r
		e.running = append(e.running, r.id)
		act.assign = append(act.assign, propAssign{r.id, r.blocks})
		if len(hit) > 0 || rng.Float64() >= 0.15 {
			act.st.Arrive = append(act.st.Arrive, A{ID: r.id, Hit: len(hit) * e.bs})
		} else {
			e.implicit++ // scheduled without being listed: a no-hit arrival
		}
		if len(hit) > 0 {
			e.hits++
			e.hitTokens += int64(len(hit) * e.bs)
		}
		n := min(r.prompt-r.done, propChunk, budget)
		e.schedule(&act, r, n)
		budget -= n
	}
	// 7. Requests that are complete finish in the next plan.
	for _, id := range e.running {
		if r := e.reqs[id]; r.done == r.total {
			e.complete = append(e.complete, id)
		}
	}

	pure := len(act.st.Sched) > 0 && len(act.st.Arrive) == 0 && len(act.st.Finished) == 0 &&
		len(act.st.Preempted) == 0 && len(act.st.Resumed) == 0
	for _, s := range act.st.Sched {
		pure = pure && s.Count == 1
	}
	if pure {
		e.pureSteps++
	}

	// Outputs and consumption.
	act.devKeys = make([]bool, e.nkeys)
	act.ownKeys = make([]bool, e.nkeys)
	for k := range act.devKeys {
		act.devKeys[k] = rng.Float64() < 0.5
		act.ownKeys[k] = rng.Float64() < 0.3
	}
	switch x := rng.Float64(); {
	case x < 0.4:
		act.mode = matNow
	case x < 0.65:
		act.mode = matLate
	case x < 0.8:
		act.mode = matDiscard
	default:
		act.mode = matAsync
	}
	if len(act.st.Sched) == 0 {
		act.mode = matDiscard
		e.zeroTokens++
	} else if len(act.st.Sched) > 1 && rng.Float64() < 0.3 {
		ids := make([]int64, len(act.st.Sched))
		for j, s := range act.st.Sched {
			ids[j] = s.ID
		}
		rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		act.reqs = ids[:1+rng.IntN(len(ids))]
	}
	act.check = i%50 == 49
	e.steps++
	return act
}

// drainAll finishes every request left.
func (e *propEngine) drainAll() propAction {
	var act propAction
	for _, id := range e.complete {
		e.finish(&act, id)
	}
	e.complete = nil
	for _, id := range append(append([]int64{}, e.running...), e.preempted...) {
		e.finish(&act, id)
	}
	act.mode = matDiscard
	act.devKeys = make([]bool, e.nkeys)
	act.ownKeys = make([]bool, e.nkeys)
	return act
}

type lateMat struct {
	id    omnicache.StepID
	reqs  []int64
	async bool
	done  chan error
	res   *omnicache.Result
}

// consume finishes a late or asynchronous Materialize: ErrReassigned is
// allowed only if a hit slot was rewritten since the step; otherwise the
// rows must be exactly the step's (original) rows.
func consume(h *harness, l lateMat) {
	h.t.Helper()
	allow := h.rewrittenSince(l.id, l.reqs)
	var err error
	res := l.res
	if l.async {
		err = guard(h.t, fmt.Sprintf("asynchronous Materialize(%v)", l.id), func() error { return <-l.done })
	} else {
		res = &h.res
		err = h.matCall(l.id, l.reqs, res)
	}
	if allow && errors.Is(err, omnicache.ErrReassigned) {
		h.reassigned[h.want(l.id).ord] = true
		if derr := h.tryDiscard(l.id); derr != nil {
			require.ErrorIs(h.t, derr, omnicache.ErrUnknownStep, "Discard after ErrReassigned")
		}
		return
	}
	require.NoError(h.t, err, "%slate Materialize(%v, %v) (hit slots rewritten since: %v)", h.prefix(), l.id, l.reqs, allow)
	require.NoError(h.t, h.verify(l.id, l.reqs, res))
}

// runProp applies the actions to h and returns the run's capture.
func runProp(h *harness, acts []propAction) capture {
	h.t.Helper()
	h.stride = testStride
	var late []lateMat
	for i, act := range acts {
		for _, id := range act.unassign {
			h.unassign(id)
		}
		for _, as := range act.assign {
			h.assign(as.id, as.blocks...)
		}
		for _, id := range act.bump {
			h.bump(id)
		}
		h.devKeys, h.ownKeys = act.devKeys, act.ownKeys
		err := h.tryBegin(act.st)
		require.NoError(h.t, err, "%sBegin of step %d", h.prefix(), i)
		sid, err := h.trySave(h.outs())
		require.NoError(h.t, err, "%sSave of step %d", h.prefix(), i)
		for _, l := range late {
			consume(h, l)
		}
		late = late[:0]
		switch act.mode {
		case matNow:
			h.mat(sid, act.reqs...)
		case matLate:
			late = append(late, lateMat{id: sid, reqs: reqList(act.reqs)})
		case matDiscard:
			h.discard(sid)
		case matAsync:
			l := lateMat{id: sid, reqs: reqList(act.reqs), async: true, done: make(chan error, 1), res: new(omnicache.Result)}
			go func(c *omnicache.Cache) { l.done <- c.Materialize(l.id, l.reqs, l.res) }(h.c)
			late = append(late, l)
		}
		st := h.stats()
		require.LessOrEqual(h.t, st.BudgetPeak, st.BudgetLimit, "%sStats.BudgetPeak after step %d", h.prefix(), i)
		require.LessOrEqual(h.t, st.PagesInUse, max(h.cfg.StagingDepth, omnicache.DefaultStagingDepth), "%sStats.PagesInUse", h.prefix())
		if act.check {
			h.checkMirror()
		}
	}
	for _, l := range late {
		consume(h, l)
	}
	h.checkMirror(allKeys(h)...)
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
		Keys:                keys,
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
	}
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			e := newPropEngine(seed, len(keys))
			var acts []propAction
			for i := 0; i < propSteps; i++ {
				acts = append(acts, e.next(i))
			}
			if last := e.drainAll(); len(last.st.Finished) > 0 {
				acts = append(acts, last)
			}
			t.Logf("schedule: %d steps, %d requests, %d hits (%d tokens), %d pure decode steps, %d preemptions, %d resumes, %d aborts, %d continuations, %d implicit arrivals, %d zero-token steps",
				e.steps, e.nextID-1, e.hits, e.hitTokens, e.pureSteps, e.preempts, e.resumes, e.aborts, e.continued, e.implicit, e.zeroTokens)
			require.Positive(t, e.hits, "the schedule must contain hits")
			require.Positive(t, e.pureSteps, "the schedule must contain pure decode steps")

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
