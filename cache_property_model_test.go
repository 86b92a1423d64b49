package omnicache_test

// The property test's model engine: scheduler, KV block manager and step generation.

import "math/rand/v2"

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
	bogus                     int           // arrivals hitting never-written blocks (FuzzCache)
	reuses                    int           // cached blocks handed to a new tenant on purpose (FuzzCache)
	resumeHits                int           // resumes with a hit
	pendingHit                map[int64]int // resumed with a hit, not scheduled since: its hit tokens
	replaces, drafts          int           // replaced prompts; rejected draft tokens
	// spec: requests to schedule with drafts this step: {k drafts, accepted}
	spec map[int64][2]int

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
		lim:        lim,
		bs:         lim.bs,
		nkeys:      nkeys,
		ref:        make([]int, lim.blocks),
		filled:     make([]int, lim.blocks),
		written:    make([]bool, lim.blocks),
		reqs:       map[int64]*propReq{},
		spec:       map[int64][2]int{},
		pendingHit: map[int64]int{},
		nextID:     1,
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
	e.countHit(r.id)
	act.st.Sched = append(act.st.Sched, S{r.id, r.done, n})
	for p := r.done; p < r.done+n; p++ {
		b := r.blocks[p/e.bs]
		e.filled[b]++
		e.written[b] = true
	}
	r.done += n
}

func (e *propEngine) finish(act *propAction, id int64) {
	delete(e.pendingHit, id)
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
	delete(e.pendingHit, id) // a hit not served is replaced at the next resume
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
func (e *propEngine) resume(act *propAction, hitK int) {
	id := e.preempted[0]
	if containsID(act.st.Preempted, id) {
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
		act.st.Resumed = append(act.st.Resumed, id)
		if len(hit) > 0 {
			act.st.Arrive = append(act.st.Arrive, A{ID: id, Hit: len(hit) * e.bs})
			e.resumeHits++
			e.pendingHit[id] = len(hit) * e.bs // counted once scheduled, as the cache counts it
		}
		act.assign = append(act.assign, propAssign{id, bl})
		act.bump = append(act.bump, id)
		e.resumes++
	}
}

// replace replaces request id's tokens from a position in [0, done] (by
// pick) on: the plan says so, it recomputes from there with new content.
func (e *propEngine) replace(act *propAction, id int64, pick int) {
	r := e.reqs[id]
	if r.done <= r.shared || containsID(act.st.Resumed, id) {
		return
	}
	// From a position in its own blocks: the blocks it hit are shared
	// (an engine copies a shared block before it rewrites it).
	at := r.shared + pick%(r.done-r.shared+1)
	for pos := at; pos < r.done; pos++ {
		e.filled[r.blocks[pos/e.bs]]--
	}
	r.done = at
	if act.st.Replaced == nil {
		act.st.Replaced = map[int64]int{}
	}
	act.st.Replaced[id] = at
	act.bump = append(act.bump, id)
	e.replaces++
}

// countHit counts a resumed request's hit the first time it is scheduled
// (the cache serves, and counts, a hit with the request's first step).
func (e *propEngine) countHit(id int64) {
	if t, ok := e.pendingHit[id]; ok {
		delete(e.pendingHit, id)
		e.hits++
		e.hitTokens += int64(t)
	}
}

// scheduleSpec schedules a decoding request 1+k tokens (its token and k
// drafts) of which acc are accepted: only those advance it and fill its
// blocks; the others' rows must never be delivered or hit.
func (e *propEngine) scheduleSpec(act *propAction, r *propReq, k, acc, budget int) int {
	n := min(1+k, budget, r.total-r.done)
	if n <= 1 {
		return 0
	}
	acc = min(acc, n)
	e.countHit(r.id)
	act.st.Sched = append(act.st.Sched, S{r.id, r.done, n})
	for p := r.done; p < r.done+n; p++ {
		b := r.blocks[p/e.bs]
		if p < r.done+acc {
			e.filled[b]++
		}
		e.written[b] = true // claimed by a write: a hit over a rejected slot fails as reassigned, not absent
	}
	if act.st.Accepted == nil {
		act.st.Accepted = map[int64]int{}
	}
	act.st.Accepted[r.id] = acc
	r.done += acc
	e.drafts += n - acc
	return n
}

// scheduleRunning schedules the running requests, a prefill chunk or one
// decode token each, and returns the step's token budget left.
func (e *propEngine) scheduleRunning(act *propAction) int {
	budget := e.lim.tokenBudget
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
	if containsID(act.st.Resumed, r.id) {
		return // with a hit, a resumed request's arrival is a hit (its re-hit)
	}
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
	r := &propReq{id: e.nextID, prompt: prompt, total: total, done: len(hit) * e.bs, shared: len(hit) * e.bs}
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
		e.resume(&act, e.resumes%3) // a hit on 0, 1 or 2 cached blocks (no draw: the schedule's draws stay)
	}
	// 3b. Every 17th step a running request's prompt is replaced from a
	// position it computed; every 5th, decoding requests schedule drafts
	// (no draws: the schedule's draws stay as they were).
	if i%17 == 9 && len(e.running) > 0 {
		e.replace(&act, e.running[i%len(e.running)], i)
	}
	if i%5 == 2 {
		for j, id := range e.running {
			e.spec[id] = [2]int{1 + (i+j)%3, (i + 2*j) % 4}
		}
	}
	// 4. Schedule the running requests: a prefill chunk or one decode token.
	budget := e.scheduleRunning(&act)
	clear(e.spec)
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
	act.nilArgs = i%31 == 7 // nil arguments first: typed errors that change nothing
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
