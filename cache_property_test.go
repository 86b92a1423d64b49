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
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
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
	fault      int // 1 + gpu.Op: the device fails that method from this step on
	faultN     int // ... after faultN more successful calls
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

// propEngine is a tiny scheduler with a KV block manager: ref-counted
// blocks, an LRU free list whose full blocks stay hittable until reused.
// Its operations (finish, abort, preempt, resume, schedule, arrive, ...)
// build one step's action; two drivers pick them: next (a seeded PRNG, the
// property test) and fuzzNext (the fuzzer's bytes, FuzzCache).
type propEngine struct {
	rng       *rand.Rand
	lim       engineLimits
	bs        int
	nkeys     int
	ref       []int
	filled    []int  // positions the block's current tenant wrote
	written   []bool // the block was ever written (by any tenant)
	free      []int32
	reqs      map[int64]*propReq
	running   []int64
	preempted []int64
	complete  []int64

	nextID    int64
	hits      int64 // arrivals with a hit
	hitTokens int64
	steps     int
	continued int
	preempts  int
	resumes   int
	aborts    int
	// begun steps whose forward failed (Abort, Begin again), and of them
	// steps with hit arrivals
	abortRetries, abortedHits int
	implicit                  int
	pureSteps                 int
	zeroTokens                int
	bogus                     int // arrivals hitting never-written blocks (FuzzCache)
	reuses                    int // cached blocks handed to a new tenant on purpose (FuzzCache)

	// sparse steps (next): each optional key is omitted with probability
	// 0.3, drawn from omitRng (a stream of its own, so the schedule is the
	// same with and without omissions).
	omitRng  *rand.Rand
	optional []bool
	omitted  int
}

func newPropEngine(seed uint64, nkeys int) *propEngine {
	e := newEngine(propLimits, nkeys)
	e.rng = rand.New(rand.NewPCG(seed, seed^0x5eed))
	return e
}

func newEngine(lim engineLimits, nkeys int) *propEngine {
	e := &propEngine{
		lim:     lim,
		bs:      lim.bs,
		nkeys:   nkeys,
		ref:     make([]int, lim.blocks),
		filled:  make([]int, lim.blocks),
		written: make([]bool, lim.blocks),
		reqs:    map[int64]*propReq{},
		nextID:  1,
	}
	for b := 0; b < lim.blocks; b++ {
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

// neverWritten lists the blocks no request ever wrote: a hit over them
// reads absent rows.
func (e *propEngine) neverWritten() []int32 {
	var out []int32
	for b, w := range e.written {
		if !w {
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
		b := r.blocks[p/e.bs]
		e.filled[b]++
		e.written[b] = true
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

// finishComplete finishes the requests that completed last step.
func (e *propEngine) finishComplete(act *propAction) {
	done := e.complete
	e.complete = nil
	for _, id := range done {
		e.finish(act, id)
	}
}

// abort finishes a running or preempted request before it completed.
func (e *propEngine) abort(act *propAction, id int64) {
	e.finish(act, id)
	e.aborts++
}

// live lists the running and the preempted requests.
func (e *propEngine) live() []int64 {
	return append(append([]int64{}, e.running...), e.preempted...)
}

// preempt frees a running request's blocks (they stay cached) and makes it
// recompute from 0 once resumed.
func (e *propEngine) preempt(act *propAction, id int64) {
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

// resume resumes the oldest preempted request (not one preempted in this
// step) if its blocks fit, with a new content version.
func (e *propEngine) resume(act *propAction) {
	id := e.preempted[0]
	if containsID(act.st.Preempted, id) {
		return
	}
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

// scheduleRunning schedules the running requests, a prefill chunk or one
// decode token each, and returns the step's token budget left.
func (e *propEngine) scheduleRunning(act *propAction) int {
	budget := e.lim.tokenBudget
	for _, id := range e.running {
		r := e.reqs[id]
		n := 1
		if r.done < r.prompt {
			n = min(r.prompt-r.done, e.lim.chunk)
		}
		n = min(n, budget, r.total-r.done)
		if n <= 0 {
			continue
		}
		e.schedule(act, r, n)
		budget -= n
	}
	return budget
}

// continuation lists scheduled request j as an arrival again, with a
// well-formed hit that must be ignored (a streamed continuation).
func (e *propEngine) continuation(act *propAction, j int) {
	r := e.reqs[act.st.Sched[j].ID]
	act.st.Arrive = append(act.st.Arrive, A{ID: r.id, Hit: e.bs, Blocks: []int32{r.blocks[0]}})
	e.continued++
}

// admit admits a new request hitting the given blocks and allocates the
// rest of its blocks; it returns nil (and changes nothing) when they do not
// fit.
func (e *propEngine) admit(act *propAction, prompt, total int, hit []int32) *propReq {
	freeAfterHit := len(e.free)
	for _, b := range hit {
		if e.ref[b] == 0 {
			freeAfterHit--
		}
	}
	need := e.blocksFor(total) - len(hit)
	if freeAfterHit < need {
		return nil
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
	return r
}

// start lists an admitted request as an arrival (a request without a hit
// may also just be scheduled: an implicit no-hit arrival) and schedules
// its first chunk; it returns the token budget left.
func (e *propEngine) start(act *propAction, r *propReq, hitBlocks int, listed bool, budget int) int {
	if listed {
		act.st.Arrive = append(act.st.Arrive, A{ID: r.id, Hit: hitBlocks * e.bs})
	} else {
		e.implicit++ // scheduled without being listed: a no-hit arrival
	}
	if hitBlocks > 0 {
		e.hits++
		e.hitTokens += int64(hitBlocks * e.bs)
	}
	n := min(r.prompt-r.done, e.lim.chunk, budget)
	e.schedule(act, r, n)
	return budget - n
}

// endStep notes the requests that are complete (they finish in the next
// plan) and counts the step.
func (e *propEngine) endStep(act *propAction) {
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
	if len(act.st.Sched) == 0 {
		e.zeroTokens++
	}
	e.steps++
}

// next generates step i from the PRNG.
func (e *propEngine) next(i int) propAction {
	var act propAction
	rng := e.rng
	quiet := (i/40)%2 == 1 // alternate busy and quiet (decode-heavy) phases

	// 1. Finished: requests that completed last step, plus random aborts.
	e.finishComplete(&act)
	for _, id := range e.live() {
		if rng.Float64() < 0.012 {
			e.abort(&act, id)
		}
	}
	// 2. Preemption: blocks freed (still cached), recompute from 0 later.
	if len(e.running) > 0 && rng.Float64() < 0.04 {
		e.preempt(&act, e.running[rng.IntN(len(e.running))])
	}
	// 3. Resume the oldest preempted request if its blocks fit.
	if len(e.preempted) > 0 && len(e.running) < e.lim.maxRunning && rng.Float64() < 0.3 {
		e.resume(&act)
	}
	// 4. Schedule the running requests: a prefill chunk or one decode token.
	budget := e.scheduleRunning(&act)
	// 5. A streamed continuation.
	if len(act.st.Sched) > 0 && rng.Float64() < 0.05 {
		e.continuation(&act, rng.IntN(len(act.st.Sched)))
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
		if len(e.running) >= e.lim.maxRunning || budget <= 0 || rng.Float64() >= pArr {
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
		r := e.admit(&act, prompt, total, hit)
		if r == nil {
			continue
		}
		listed := len(hit) > 0 || rng.Float64() >= 0.15
		budget = e.start(&act, r, len(hit), listed, budget)
	}
	// 7. Requests that are complete finish in the next plan.
	e.endStep(&act)

	// Outputs and consumption.
	act.devKeys = make([]bool, e.nkeys)
	act.ownKeys = make([]bool, e.nkeys)
	for k := range act.devKeys {
		act.devKeys[k] = rng.Float64() < 0.5
		act.ownKeys[k] = rng.Float64() < 0.3
	}
	if e.omitRng != nil {
		act.omitKeys = make([]bool, e.nkeys)
		for k := range act.omitKeys {
			act.omitKeys[k] = e.optional[k] && e.omitRng.Float64() < 0.3
			if act.omitKeys[k] {
				e.omitted++
			}
		}
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
	} else if len(act.st.Sched) > 1 && rng.Float64() < 0.3 {
		ids := make([]int64, len(act.st.Sched))
		for j, s := range act.st.Sched {
			ids[j] = s.ID
		}
		rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		act.reqs = ids[:1+rng.IntN(len(ids))]
	}
	act.check = i%50 == 49
	// Every 23rd step's forward fails after Begin: Abort, then the same
	// step again (a deterministic choice: the schedule's draws stay as
	// they were).
	if act.abortRetry = i%23 == 11; act.abortRetry {
		e.abortRetries++
		for _, a := range act.st.Arrive {
			if a.Hit > 0 {
				e.abortedHits++
				break
			}
		}
	}
	return act
}

// drainAll finishes every request left.
func (e *propEngine) drainAll() propAction {
	var act propAction
	for _, id := range e.complete {
		e.finish(&act, id)
	}
	e.complete = nil
	for _, id := range e.live() {
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
	due   int // consumed after the Save of this step (runner's index)
}

// absentRequired reports whether the hit prefix of reqs (nil: all) of step
// id covers a row of a required key that no step had written when the step
// was saved: its read must fail.
func (h *harness) absentRequired(id omnicache.StepID, reqs []int64) bool {
	for _, rw := range h.want(id).reqs {
		if reqs != nil && !containsID(reqs, rw.id) {
			continue
		}
		for k, key := range h.cfg.Keys {
			if key.Optional || rw.prefix == nil {
				continue
			}
			for _, g := range rw.prefix[k] {
				if g == 0 {
					return true
				}
			}
		}
	}
	return false
}

// checkConsumed checks that a step whose read failed is consumed: a later
// Discard fails with ErrUnknownStep (or succeeds, if the failed read left
// it unconsumed).
func checkConsumed(h *harness, id omnicache.StepID) {
	h.t.Helper()
	if err := h.tryDiscard(id); err != nil {
		require.ErrorIs(h.t, err, omnicache.ErrUnknownStep, "%sDiscard(%v) after a failed read", h.prefix(), id)
	}
}

// materializeNow materializes step id right after its Save: the rows must be
// exactly the step's rows, unless a hit covers never-written rows of a
// required key (ErrAbsentRequired).
func materializeNow(h *harness, id omnicache.StepID, reqs []int64) {
	h.t.Helper()
	if !h.absentRequired(id, reqs) {
		h.mat(id, reqs...)
		return
	}
	err := h.matCall(id, reqs, &h.res)
	require.ErrorIs(h.t, err, omnicache.ErrAbsentRequired, "%sMaterialize(%v, %v): the hit covers never-written rows of a required key", h.prefix(), id, reqs)
	h.checkServed(id, reqs, &h.res, err, "immediate")
}

// consume finishes a late or asynchronous Materialize: ErrReassigned is
// allowed only if a hit slot was rewritten since the step; a hit over
// never-written rows of a required key must fail (ErrAbsentRequired, or
// ErrReassigned once rewritten); otherwise the rows must be exactly the
// step's (original) rows.
func consume(h *harness, l lateMat) {
	h.t.Helper()
	var err error
	res := l.res
	if l.async {
		err = guard(h.t, fmt.Sprintf("asynchronous Materialize(%v)", l.id), func() error { return <-l.done })
	} else {
		res = &h.res
		err = h.matCall(l.id, l.reqs, res)
	}
	if h.checkServed(l.id, l.reqs, res, err, "late") {
		h.reassigned[h.want(l.id).ord] = true
	}
}

// checkServed checks a Materialize of reqs (nil: all) of step id that
// returned err into res, request by request: a request whose hit covers
// never-written rows of a required key must fail with ErrAbsentRequired;
// one whose hit slots were rewritten since may fail with ErrReassigned
// only where the cache may not have preserved them (prefetch off, or a
// read-ahead budget that may not have held the step); every other request
// is served exactly, failed or not its neighbours. It reports whether a
// request failed with ErrReassigned.
func (h *harness) checkServed(id omnicache.StepID, reqs []int64, res *omnicache.Result, err error, what string) (reassigned bool) {
	h.t.Helper()
	var re *omnicache.RequestError
	if err != nil && !errors.As(err, &re) {
		h.t.Fatalf("%s%s Materialize(%v, %v): %v", h.prefix(), what, id, reqs, err)
	}
	failed := map[int64]error{}
	if re != nil {
		require.Equal(h.t, id, re.Step)
		for i, rid := range re.IDs {
			failed[rid] = re.Errs[i]
		}
	}
	for _, rw := range h.want(id).reqs {
		if reqs != nil && !containsID(reqs, rw.id) {
			continue
		}
		one := []int64{rw.id}
		absent := h.absentRequired(id, one)
		mayMove := h.rewrittenSince(id, one) && h.mayReassign()
		ferr := failed[rw.id]
		switch {
		case ferr == nil:
			require.False(h.t, absent, "%s%s Materialize(%v): request %d served over never-written rows of a required key", h.prefix(), what, id, rw.id)
		case mayMove && errors.Is(ferr, omnicache.ErrReassigned):
			reassigned = true
		case absent:
			require.ErrorIs(h.t, ferr, omnicache.ErrAbsentRequired, "%s%s Materialize(%v): request %d", h.prefix(), what, id, rw.id)
		default:
			h.t.Fatalf("%s%s Materialize(%v): request %d failed (hit slots rewritten since: %v, the cache may let them move: %v): %v",
				h.prefix(), what, id, rw.id, h.rewrittenSince(id, one), h.mayReassign(), ferr)
		}
	}
	require.NoError(h.t, h.verifyServed(id, reqs, res, failed))
	checkConsumed(h, id)
	return reassigned
}

// mayReassign reports whether a late read may find its hit rows moved:
// only without prefetch, or with a read-ahead budget too small to hold
// every hit step's buffers (such a step is read at Materialize).
func (h *harness) mayReassign() bool {
	return h.cfg.DisablePrefetch || (h.cfg.ReadAheadBytes > 0 && h.cfg.ReadAheadBytes < 1<<20)
}

// propRun applies actions to one harness, step by step.
type propRun struct {
	h        *harness
	maxDelay int // cap on propAction.delay: at most maxDelay steps stay unconsumed across a Save
	i        int
	late     []lateMat
	// pinnedBudget tolerates a Save failing with ErrBudget when the device
	// bytes that unconsumed steps may pin (see pinnedBound) and the step's
	// need exceed the budget: the run is then broken and must stop.
	pinnedBudget bool
	broken       error
	dead         bool // the cache failed or closed on purpose: the run ended
	stepAborts   int  // begun steps aborted (propAction.abortRetry) and begun again
}

// outsideID is a request id no schedule uses.
const outsideID int64 = 1 << 40

// apply runs one action: Begin, Save, the due late reads, this step's
// consumption, and the checks.
func (r *propRun) apply(act propAction) {
	h := r.h
	h.t.Helper()
	i := r.i
	r.i++
	for _, id := range act.unassign {
		h.unassign(id)
	}
	for _, as := range act.assign {
		h.assign(as.id, as.blocks...)
	}
	for _, id := range act.bump {
		h.bump(id)
	}
	h.devKeys, h.ownKeys, h.omitKeys = act.devKeys, act.ownKeys, act.omitKeys
	if act.fault > 0 {
		r.faultStep(act)
		return
	}
	if act.closeNow {
		r.closeMidReads()
		return
	}
	r.misuseBefore(act.misuse)
	r.badPlanFirst(act)
	err := h.tryBegin(act.st)
	require.NoError(h.t, err, "%sBegin of step %d", h.prefix(), i)
	if r.badSaveFirst(act) {
		require.NoError(h.t, h.tryBegin(act.st), "%sBegin of step %d again after its failed Save", h.prefix(), i)
	}
	if act.abortRetry {
		// The forward failed: the cache returns to before this Begin
		// (finished requests stay dropped), and the engine retries the
		// step; its rows and hits must come out as if it never failed.
		h.abortBegun()
		r.stepAborts++
		require.NoError(h.t, h.tryBegin(act.st), "%sBegin of step %d again after Abort", h.prefix(), i)
	}
	if act.misuse == misuseBeginTwice {
		err := h.beginPlan(&omnicache.Plan{Stride: h.stride})
		require.ErrorIs(h.t, err, omnicache.ErrSequence, "%sBegin twice (step %d)", h.prefix(), i)
	}
	ps := h.pending
	sid, err := h.trySave(h.outs())
	if err != nil && r.pinnedBudget && errors.Is(err, omnicache.ErrBudget) {
		pinned, need := r.pinnedBound(ps), r.needBound(ps)
		require.Greater(h.t, pinned+need, h.cfg.DeviceBudgetBytes,
			"%sSave of step %d failed (%v) although unconsumed steps pin at most %d device bytes and the step needs at most %d",
			h.prefix(), i, err, pinned, need)
		r.breakOn(ps, fmt.Errorf("Save of step %d: %w (unconsumed steps may pin %d bytes, the step needs up to %d)", i, err, pinned, need))
		return
	}
	require.NoError(h.t, err, "%sSave of step %d", h.prefix(), i)
	r.consumeDue(i)

	if act.outside {
		err := h.matCall(sid, []int64{outsideID}, &h.res)
		require.ErrorIs(h.t, err, omnicache.ErrNotInStep, "%sMaterialize(%v) of a request outside the step", h.prefix(), sid)
	}
	reqs := reqList(act.reqs)
	due := i + min(max(act.delay, 1), max(r.maxDelay, 1))
	switch act.mode {
	case matNow:
		materializeNow(h, sid, reqs)
	case matLate:
		r.late = append(r.late, lateMat{id: sid, reqs: reqs, due: due})
	case matDiscard:
		h.discard(sid)
	case matAsync:
		l := lateMat{id: sid, reqs: reqs, async: true, done: make(chan error, 1), res: new(omnicache.Result), due: due}
		go func(c *omnicache.Cache) { l.done <- c.Materialize(l.id, l.reqs, l.res) }(h.c)
		r.late = append(r.late, l)
	}
	if act.twice && (act.mode == matNow || act.mode == matDiscard) {
		err := h.matCall(sid, reqs, &h.res)
		require.ErrorIs(h.t, err, omnicache.ErrUnknownStep, "%sMaterialize(%v) of a consumed step", h.prefix(), sid)
		require.ErrorIs(h.t, h.tryDiscard(sid), omnicache.ErrUnknownStep, "%sDiscard(%v) of a consumed step", h.prefix(), sid)
	}
	st := h.stats()
	require.LessOrEqual(h.t, st.BudgetPeak, st.BudgetLimit, "%sStats.BudgetPeak after step %d", h.prefix(), i)
	require.LessOrEqual(h.t, st.PagesInUse, max(h.cfg.StagingDepth, omnicache.DefaultStagingDepth), "%sStats.PagesInUse", h.prefix())
	if act.check {
		h.checkMirror()
	}
}

// consumeDue consumes the late and asynchronous reads due by step i.
func (r *propRun) consumeDue(i int) {
	keep := r.late[:0]
	for _, l := range r.late {
		if l.due <= i {
			consume(r.h, l)
		} else {
			keep = append(keep, l)
		}
	}
	clear(r.late[len(keep):])
	r.late = keep
}

// rowBytes sums the row bytes of the deferred keys and of the immediate
// keys.
func rowBytes(cfg omnicache.Config) (deferred, immediate int64) {
	for _, k := range cfg.Keys {
		if k.Deferred {
			deferred += int64(k.RowBytes)
		} else {
			immediate += int64(k.RowBytes)
		}
	}
	return deferred, immediate
}

// pinnedBound bounds the device bytes that unconsumed steps may keep
// charged however the cache forces writes out: a step record pins its own
// deferred clones and the deferred clones its hits read while in transit
// (at most the clones of the steps that last wrote the hit slots), and an
// asynchronous read in flight may hold parked decode rows.
func (r *propRun) pinnedBound(ps *pendingStep) int64 {
	h := r.h
	def, imm := rowBytes(h.cfg)
	seen := map[int]bool{}
	var b int64
	add := func(ord int) {
		if ord > 0 && !seen[ord] {
			seen[ord] = true
			b += int64(h.tokensAt[ord]) * def
		}
	}
	// The step being saved is not consumed either: its hit plan (made at
	// Begin) pins the deferred clones its hit rows come from while they
	// are in transit.
	if ps != nil {
		for _, hs := range ps.hits {
			for _, sl := range hs {
				if sl >= 0 && int(sl) < len(h.writtenAt) {
					add(h.writtenAt[sl])
				}
			}
		}
	}
	for _, l := range r.late {
		sw := h.want(l.id)
		add(sw.ord)
		for _, rw := range sw.reqs {
			for _, w := range rw.hitFrom {
				add(w)
			}
		}
		if l.async {
			b += int64(h.tokensAt[sw.ord]) * imm
		}
	}
	return b
}

// needBound bounds the device bytes the Save of ps reserves.
func (r *propRun) needBound(ps *pendingStep) int64 {
	def, imm := rowBytes(r.h.cfg)
	n := 0
	for _, s := range ps.st.Sched {
		n += s.Count
	}
	return int64(n) * (def + imm)
}

// breakOn ends a run whose Save failed: the slots the step scheduled may or
// may not have been written, so the model forgets them (and a delayed read
// of a hit on them may fail with ErrReassigned).
func (r *propRun) breakOn(ps *pendingStep, err error) {
	h := r.h
	r.broken = err
	for _, sl := range ps.slots {
		for _, s := range sl {
			if s >= 0 && int(s) < len(h.unknown) {
				h.unknown[s] = true
				h.writtenAt[s] = h.nsteps + 1
			}
		}
	}
}

// misuseBefore makes a call that must fail with its documented error and
// change nothing, before the step's Begin.
func (r *propRun) misuseBefore(kind int) {
	h := r.h
	bs := int32(h.cfg.BlockSize)
	arrival := func(hit int32, blocks ...int32) *omnicache.Plan {
		return &omnicache.Plan{Stride: h.stride, Arrivals: []int64{outsideID}, HitTokens: []int32{hit}, HitBlocks: blocks}
	}
	var (
		p    *omnicache.Plan
		want error
	)
	switch kind {
	case misuseNone, misuseBeginTwice:
		return
	case misuseUnalignedHit:
		if bs == 1 {
			p, want = arrival(1), omnicache.ErrHitBlocks
		} else {
			p, want = arrival(bs+1, 0, 1), omnicache.ErrUnalignedHit
		}
	case misuseNoHitBlocks:
		p, want = arrival(bs), omnicache.ErrHitBlocks
	case misuseExtraBlocks:
		p, want = arrival(bs, 0, 1), omnicache.ErrHitBlocks
	case misuseHitOutOfRange:
		p, want = arrival(bs, int32(h.cfg.NumBlocks)), omnicache.ErrPlan
	case misuseNegativeStart:
		p = &omnicache.Plan{Stride: h.stride, IDs: []int64{outsideID}, Rows: []int32{0}, Start: []int32{-1}, Count: []int32{1},
			Table: make([]int32, h.stride)}
		want = omnicache.ErrPlan
	case misuseSaveFirst:
		res := guard(h.t, h.prefix()+"Save", func() saveResult {
			id, err := h.c.Save(h.outputsFor(step{}))
			return saveResult{id, err}
		})
		require.ErrorIs(h.t, res.err, omnicache.ErrSequence, "%sSave without Begin", h.prefix())
		return
	default:
		panic(fmt.Sprintf("misuse kind %d", kind))
	}
	err := h.beginPlan(p)
	require.ErrorIs(h.t, err, want, "%sBegin with misuse %d", h.prefix(), kind)
}

// finish consumes what is still unconsumed and checks the whole mirror,
// deferred keys included.
func (r *propRun) finish() {
	r.h.t.Helper()
	for _, l := range r.late {
		consume(r.h, l)
	}
	r.late = nil
	r.h.checkMirror(allKeys(r.h)...)
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
			dev := gpu.NewFaulty(gpu.NewHost())
			dev.DelayWaits(100 * time.Microsecond)
			c.Device = dev
		}},
		{"buffer on, lagging committer", func(c *omnicache.Config) {
			// Every device wait takes longer: the committer falls behind
			// the engine, so writes skip slots newer writes claimed and
			// delayed reads race reassignment (the read protocol's case).
			dev := gpu.NewFaulty(gpu.NewHost())
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
			t.Logf("schedule: %d steps, %d requests, %d hits (%d tokens), %d pure decode steps, %d preemptions, %d resumes, %d aborts, %d continuations, %d implicit arrivals, %d zero-token steps",
				e.steps, e.nextID-1, e.hits, e.hitTokens, e.pureSteps, e.preempts, e.resumes, e.aborts, e.continued, e.implicit, e.zeroTokens)
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
