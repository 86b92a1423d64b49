package cachetest

// The model engine: a scheduler with a KV block manager that generates
// whole schedules, one Action a step.

import (
	"math/rand/v2"
	"slices"

	"github.com/omnicache/omnicache"
)

// Limits size a model engine.
type Limits struct {
	Blocks      int // KV blocks
	BlockSize   int // tokens per block
	Stride      int // block-table stride: the most blocks one request holds
	TokenBudget int // tokens per step
	Chunk       int // prefill chunk per request and step
	MaxRunning  int // requests running at once
}

// The property test's engine: PropBlocks blocks of the fixture's size; a
// schedule of PropSteps steps (before the drain).
const (
	PropBlocks = 24
	PropSteps  = 300
)

// PropLimits are the property test's limits (NewSeededEngine): 32 tokens a
// step, prefill chunks of 8, 4 requests running at once.
var PropLimits = Limits{
	Blocks:      PropBlocks,
	BlockSize:   BlockSize,
	Stride:      Stride,
	TokenBudget: 32,
	Chunk:       8,
	MaxRunning:  4,
}

// Counts are what an Engine's schedule held so far.
type Counts struct {
	Steps     int   // steps generated
	Requests  int   // requests admitted
	Hits      int64 // arrivals with a hit (a resume's counted once scheduled)
	HitTokens int64 // their hit tokens
	Continued int   // streamed continuations (a live request listed as an arrival)
	Preempts  int   // preemptions
	Resumes   int   // resumes after a preemption
	Aborts    int   // requests finished before they completed
	// AbortRetries are begun steps whose forward failed (Abort, Begin
	// again); AbortedHits those of them with hit arrivals.
	AbortRetries, AbortedHits int
	// Abandoned are other plans begun before a step and abandoned (Abort,
	// or a failed Save: FailedSaves of them); AbandonedFinish,
	// AbandonedPreempt, AbandonedResume, AbandonedReplace and
	// AbandonedHit those that finished, preempted, resumed, replaced or
	// hit requests.
	Abandoned, FailedSaves                                                             int
	AbandonedFinish, AbandonedPreempt, AbandonedResume, AbandonedReplace, AbandonedHit int
	// ResumesUnaligned are resumes without a hit of requests preempted at
	// a length that is not block aligned (they recompute a partial block).
	ResumesUnaligned int
	Implicit         int // arrivals scheduled without being listed
	PureSteps        int // pure decode steps
	ZeroTokens       int // steps that schedule nothing
	Bogus            int // arrivals hitting never-written blocks (NextFrom)
	Reuses           int // cached blocks handed to a new tenant on purpose (NextFrom)
	ResumeHits       int // resumes with a hit
	Replaces         int // replaced prompts
	Drafts           int // rejected draft tokens
	Omitted          int // optional keys omitted by a step (OmitOptional)
}

// Engine is a tiny scheduler with a KV block manager: ref-counted
// blocks, an LRU free list whose full blocks stay hittable until reused.
// Its operations (finish, abort, preempt, resume, schedule, arrive, ...)
// build one step's Action; two drivers pick them: Next (a seeded PRNG, the
// property test) and NextFrom (a fuzzer's bytes, FuzzCache).
type Engine struct {
	// Counts are the schedule's so far.
	Counts Counts

	rng       *rand.Rand
	lim       Limits
	bs        int
	nkeys     int
	ref       []int
	filled    []int  // positions the block's current tenant wrote
	written   []bool // the block was ever written (by any tenant)
	free      []int32
	reqs      map[int64]*request
	running   []int64
	preempted []int64
	complete  []int64

	nextID     int64
	pendingHit map[int64]int // resumed with a hit, not scheduled since: its hit tokens
	// spec: requests to schedule with drafts this step: {k drafts, accepted}
	spec map[int64][2]int

	// sparse steps (Next): each optional key is omitted with probability
	// 0.3, drawn from omitRng (a stream of its own, so the schedule is the
	// same with and without omissions).
	omitRng  *rand.Rand
	optional []bool
	// noAlt: a copy that generates an abandoned plan makes none itself.
	noAlt bool
	seed  uint64 // NewSeededEngine's
}

type request struct {
	id            int64
	prompt, total int // tokens to prefill (grows to cover a recompute), total tokens
	done          int
	blocks        []int32
	shared        int // tokens of its leading blocks that came from a hit (shared: never rewritten by it)
	preemptedAt   int // its length when last preempted
}

type assignment struct {
	id     int64
	blocks []int32
}

// Materialize modes.
const (
	matNow = iota
	matLate
	matDiscard
	matAsync
)

// Action is one generated step, applied identically to every run of a
// schedule (Runner.Apply).
type Action struct {
	// Step is the step the engine runs.
	Step     Step
	unassign []int64
	assign   []assignment
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
	// Misuse exercised around the step (NextFrom): each must fail with its
	// documented error and leave the cache usable.
	misuse  int  // before (or right after) Begin, see misuse* constants
	outside bool // Materialize with a request outside the step first: ErrNotInStep
	twice   bool // consume the step a second time: ErrUnknownStep
	// Failing calls (NextFrom, runfail.go): each must fail with its
	// documented error and change nothing, and the step then runs as
	// generated.
	badPlan int // the step's own plan made wrong, see badPlan* constants
	badSave int // the step's outputs made wrong, see badSave* constants
	// abortRetry: the step's forward fails after its Begin: Abort, then
	// Begin the same step again.
	abortRetry bool
	// failed: plans begun and abandoned before this step (abort.go).
	failed   []failedBegin
	nilArgs  bool // Begin(nil), Save(nil) and Materialize into a nil Result first: typed errors that change nothing
	fault    int  // 1 + gputest.Op: the device fails that method from this step on
	faultN   int  // ... after faultN more successful calls
	closeNow bool
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

// NewSeededEngine returns an engine of PropLimits for nkeys keys whose
// Next draws from a PRNG seeded with seed.
func NewSeededEngine(seed uint64, nkeys int) *Engine {
	e := NewEngine(PropLimits, nkeys)
	e.rng = rand.New(rand.NewPCG(seed, seed^0x5eed))
	e.seed = seed
	return e
}

// NewEngine returns an engine of lim for nkeys keys, every block free.
func NewEngine(lim Limits, nkeys int) *Engine {
	e := &Engine{
		lim:        lim,
		bs:         lim.BlockSize,
		nkeys:      nkeys,
		ref:        make([]int, lim.Blocks),
		filled:     make([]int, lim.Blocks),
		written:    make([]bool, lim.Blocks),
		reqs:       map[int64]*request{},
		spec:       map[int64][2]int{},
		pendingHit: map[int64]int{},
		nextID:     1,
	}
	for b := 0; b < lim.Blocks; b++ {
		e.free = append(e.free, int32(b))
	}
	return e
}

// OmitOptional makes Next's steps sparse: each of keys' optional keys is
// omitted with probability 0.3, drawn from a stream seeded with seed (the
// schedule's own draws stay as they were).
func (e *Engine) OmitOptional(seed uint64, keys []omnicache.Key) {
	e.omitRng = rand.New(rand.NewPCG(seed, seed^0x5eed))
	e.optional = e.optional[:0]
	for _, k := range keys {
		e.optional = append(e.optional, k.Optional)
	}
}

func (e *Engine) takeFree(b int32) {
	for i, x := range e.free {
		if x == b {
			e.free = append(e.free[:i], e.free[i+1:]...)
			return
		}
	}
}

func (e *Engine) alloc(n int) []int32 {
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

func (e *Engine) release(bl []int32) {
	for _, b := range bl {
		e.ref[b]--
		if e.ref[b] == 0 {
			e.free = append(e.free, b)
		}
	}
}

func (e *Engine) hittable() []int32 {
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
func (e *Engine) neverWritten() []int32 {
	var out []int32
	for b, w := range e.written {
		if !w {
			out = append(out, int32(b))
		}
	}
	return out
}

func (e *Engine) blocksFor(tokens int) int { return (tokens + e.bs - 1) / e.bs }

func remove(ids []int64, id int64) []int64 {
	for i, x := range ids {
		if x == id {
			return append(ids[:i], ids[i+1:]...)
		}
	}
	return ids
}

// schedule appends n tokens of r to the step and marks them written.
func (e *Engine) schedule(act *Action, r *request, n int) {
	e.countHit(r.id)
	act.Step.Sched = append(act.Step.Sched, S{r.id, int64(r.done), int64(n)})
	for p := r.done; p < r.done+n; p++ {
		b := r.blocks[p/e.bs]
		e.filled[b]++
		e.written[b] = true
	}
	r.done += n
}

func (e *Engine) finish(act *Action, id int64) {
	delete(e.pendingHit, id)
	r := e.reqs[id]
	e.release(r.blocks)
	e.running = remove(e.running, id)
	e.preempted = remove(e.preempted, id)
	delete(e.reqs, id)
	act.Step.Finished = append(act.Step.Finished, id)
	act.unassign = append(act.unassign, id)
}

// finishComplete finishes the requests that completed last step.
func (e *Engine) finishComplete(act *Action) {
	done := e.complete
	e.complete = nil
	for _, id := range done {
		e.finish(act, id)
	}
}

// abort finishes a running or preempted request before it completed.
func (e *Engine) abort(act *Action, id int64) {
	e.finish(act, id)
	e.Counts.Aborts++
}

// live lists the running and the preempted requests.
func (e *Engine) live() []int64 {
	return append(append([]int64{}, e.running...), e.preempted...)
}

// preempt frees a running request's blocks (they stay cached) and makes it
// recompute from 0 once resumed.
func (e *Engine) preempt(act *Action, id int64) {
	delete(e.pendingHit, id) // a hit not served is replaced at the next resume
	r := e.reqs[id]
	e.release(r.blocks)
	r.blocks = nil
	r.prompt = max(r.prompt, r.done)
	r.preemptedAt = r.done
	r.done = 0
	e.running = remove(e.running, id)
	e.preempted = append(e.preempted, id)
	act.Step.Preempted = append(act.Step.Preempted, id)
	e.Counts.Preempts++
}

// resume resumes the oldest preempted request (not one preempted in this
// step) if its blocks fit, with a new content version.
func (e *Engine) resume(act *Action, hitK int) {
	id := e.preempted[0]
	if slices.Contains(act.Step.Preempted, id) {
		return
	}
	r := e.reqs[id]
	// With hitK > 0 it resumes hitting that many cached full blocks (any
	// of them, as an arrival may): its delivery then leaves out what it
	// already had.
	var hit []int32
	if hitK > 0 {
		hb := e.hittable()
		if k := min(hitK, len(hb), (r.prompt-1)/e.bs); k > 0 {
			hit = hb[len(hb)-k:]
		}
	}
	freeAfterHit := len(e.free)
	for _, b := range hit {
		if e.ref[b] == 0 {
			freeAfterHit--
		}
	}
	need := e.blocksFor(r.total) - len(hit)
	if freeAfterHit < need {
		return
	}
	for _, b := range hit {
		if e.ref[b] == 0 {
			e.takeFree(b)
		}
		e.ref[b]++
	}
	if bl := e.alloc(need); bl != nil || need == 0 {
		bl = append(append([]int32{}, hit...), bl...)
		r.blocks = bl
		r.done = len(hit) * e.bs
		r.shared = r.done
		e.preempted = e.preempted[1:]
		e.running = append(e.running, id)
		act.Step.Resumed = append(act.Step.Resumed, id)
		if len(hit) > 0 {
			act.Step.Arrive = append(act.Step.Arrive, A{ID: id, Hit: len(hit) * e.bs})
			e.Counts.ResumeHits++
			e.pendingHit[id] = len(hit) * e.bs // counted once scheduled, as the cache counts it
		} else if r.preemptedAt%e.bs != 0 {
			e.Counts.ResumesUnaligned++
		}
		act.assign = append(act.assign, assignment{id, bl})
		act.bump = append(act.bump, id)
		e.Counts.Resumes++
	}
}

// replace replaces request id's tokens from a position in [0, done] (by
// pick) on: the plan says so, it recomputes from there with new content.
func (e *Engine) replace(act *Action, id int64, pick int) {
	r := e.reqs[id]
	if r.done <= r.shared || slices.Contains(act.Step.Resumed, id) {
		return
	}
	// From a position in its own blocks: the blocks it hit are shared
	// (an engine copies a shared block before it rewrites it).
	at := r.shared + pick%(r.done-r.shared+1)
	for pos := at; pos < r.done; pos++ {
		e.filled[r.blocks[pos/e.bs]]--
	}
	r.done = at
	if act.Step.Replaced == nil {
		act.Step.Replaced = map[int64]int{}
	}
	act.Step.Replaced[id] = at
	act.bump = append(act.bump, id)
	e.Counts.Replaces++
}

// countHit counts a resumed request's hit the first time it is scheduled
// (the cache serves, and counts, a hit with the request's first step).
func (e *Engine) countHit(id int64) {
	if t, ok := e.pendingHit[id]; ok {
		delete(e.pendingHit, id)
		e.Counts.Hits++
		e.Counts.HitTokens += int64(t)
	}
}

// scheduleSpec schedules a decoding request 1+k tokens (its token and k
// drafts) of which acc are accepted: only those advance it and fill its
// blocks; the others' rows must never be delivered or hit.
func (e *Engine) scheduleSpec(act *Action, r *request, k, acc, budget int) int {
	n := min(1+k, budget, r.total-r.done)
	if n <= 1 {
		return 0
	}
	acc = min(acc, n)
	e.countHit(r.id)
	act.Step.Sched = append(act.Step.Sched, S{r.id, int64(r.done), int64(n)})
	for p := r.done; p < r.done+n; p++ {
		b := r.blocks[p/e.bs]
		if p < r.done+acc {
			e.filled[b]++
		}
		e.written[b] = true // claimed by a write: a hit over a rejected slot fails as reassigned, not absent
	}
	if act.Step.Accepted == nil {
		act.Step.Accepted = map[int64]int{}
	}
	act.Step.Accepted[r.id] = acc
	r.done += acc
	e.Counts.Drafts += n - acc
	return n
}

// scheduleRunning schedules the running requests, a prefill chunk or one
// decode token each, and returns the step's token budget left.
func (e *Engine) scheduleRunning(act *Action) int {
	budget := e.lim.TokenBudget
	for _, id := range e.running {
		r := e.reqs[id]
		if sp, ok := e.spec[id]; ok && r.done >= r.prompt && r.done < r.total {
			delete(e.spec, id)
			if n := e.scheduleSpec(act, r, sp[0], sp[1], budget); n > 0 {
				budget -= n
				continue
			}
		}
		n := 1
		if r.done < r.prompt {
			n = min(r.prompt-r.done, e.lim.Chunk)
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
func (e *Engine) continuation(act *Action, j int) {
	r := e.reqs[act.Step.Sched[j].ID()]
	if slices.Contains(act.Step.Resumed, r.id) {
		return // with a hit, a resumed request's arrival is a hit (its re-hit)
	}
	act.Step.Arrive = append(act.Step.Arrive, A{ID: r.id, Hit: e.bs, Blocks: []int32{r.blocks[0]}})
	e.Counts.Continued++
}

// admit admits a new request hitting the given blocks and allocates the
// rest of its blocks; it returns nil (and changes nothing) when they do not
// fit.
func (e *Engine) admit(act *Action, prompt, total int, hit []int32) *request {
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
	r := &request{id: e.nextID, prompt: prompt, total: total, done: len(hit) * e.bs, shared: len(hit) * e.bs}
	e.nextID++
	e.Counts.Requests++
	r.blocks = append(append([]int32{}, hit...), fresh...)
	e.reqs[r.id] = r
	e.running = append(e.running, r.id)
	act.assign = append(act.assign, assignment{r.id, r.blocks})
	return r
}

// start lists an admitted request as an arrival (a request without a hit
// may also just be scheduled: an implicit no-hit arrival) and schedules
// its first chunk; it returns the token budget left.
func (e *Engine) start(act *Action, r *request, hitBlocks int, listed bool, budget int) int {
	if listed {
		act.Step.Arrive = append(act.Step.Arrive, A{ID: r.id, Hit: hitBlocks * e.bs})
	} else {
		e.Counts.Implicit++ // scheduled without being listed: a no-hit arrival
	}
	if hitBlocks > 0 {
		e.Counts.Hits++
		e.Counts.HitTokens += int64(hitBlocks * e.bs)
	}
	n := min(r.prompt-r.done, e.lim.Chunk, budget)
	e.schedule(act, r, n)
	return budget - n
}

// endStep notes the requests that are complete (they finish in the next
// plan) and counts the step.
func (e *Engine) endStep(act *Action) {
	for _, id := range e.running {
		if r := e.reqs[id]; r.done == r.total {
			e.complete = append(e.complete, id)
		}
	}
	pure := len(act.Step.Sched) > 0 && len(act.Step.Arrive) == 0 && len(act.Step.Finished) == 0 &&
		len(act.Step.Preempted) == 0 && len(act.Step.Resumed) == 0
	for _, s := range act.Step.Sched {
		pure = pure && s.Count() == 1
	}
	if pure {
		e.Counts.PureSteps++
	}
	if len(act.Step.Sched) == 0 {
		e.Counts.ZeroTokens++
	}
	e.Counts.Steps++
}
