package cachetest

// The PRNG driver of the model engine (the property test).

// Next generates step i from the PRNG (NewSeededEngine).
func (e *Engine) Next(i int) Action {
	var act Action
	rng := e.rng
	// Every 7th step, another plan the engine could run now is begun and
	// abandoned first (Abort, or a Save that fails, in turn): drawn from
	// a copy of the engine with a PRNG of its own (the schedule's draws
	// stay as they were).
	if i%7 == 3 && !e.noAlt {
		act.failed = append(act.failed, e.abandoned(i, e.seed<<32|uint64(i), (i/7)%numFail))
	}
	quiet := (i/40)%2 == 1 // alternate busy and quiet (decode-heavy) phases
	// An abandoned plan's copy (noAlt) aborts, preempts, resumes and
	// replaces far more often: what its Begin changes must all be undone.
	pAbort, pPreempt, pResume := 0.012, 0.04, 0.3
	if e.noAlt {
		pAbort, pPreempt, pResume = 0.2, 0.5, 0.9
	}

	// 1. Finished: requests that completed last step, plus random aborts.
	e.finishComplete(&act)
	for _, id := range e.live() {
		if rng.Float64() < pAbort {
			e.abort(&act, id)
		}
	}
	// 2. Preemption: blocks freed (still cached), recompute from 0 later.
	if len(e.running) > 0 && rng.Float64() < pPreempt {
		e.preempt(&act, e.running[rng.IntN(len(e.running))])
	}
	// 3. Resume the oldest preempted request if its blocks fit.
	if len(e.preempted) > 0 && len(e.running) < e.lim.MaxRunning && rng.Float64() < pResume {
		e.resume(&act, e.Counts.Resumes%3) // a hit on 0, 1 or 2 cached blocks (no draw: the schedule's draws stay)
	}
	// 3b. Every 17th step a running request's prompt is replaced from a
	// position it computed (every step of an abandoned plan's copy);
	// every 5th, decoding requests schedule drafts (no draws: the
	// schedule's draws stay as they were).
	if (i%17 == 9 || e.noAlt) && len(e.running) > 0 {
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
	if len(act.Step.Sched) > 0 && rng.Float64() < 0.05 {
		e.continuation(&act, rng.IntN(len(act.Step.Sched)))
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
		if len(e.running) >= e.lim.MaxRunning || budget <= 0 || rng.Float64() >= pArr {
			continue
		}
		// Within a block-table row (PropLimits' rows hold all 32 tokens:
		// the bound only binds the smaller blocks of a fuzzer's engine).
		maxTotal := min(e.lim.Stride, e.lim.Blocks) * e.bs
		prompt := min(1+rng.IntN(20), maxTotal-1)
		total := min(prompt+1+rng.IntN(12), maxTotal)
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
				e.Counts.Omitted++
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
	if len(act.Step.Sched) == 0 {
		act.mode = matDiscard
	} else if len(act.Step.Sched) > 1 && rng.Float64() < 0.3 {
		ids := make([]int64, len(act.Step.Sched))
		for j, s := range act.Step.Sched {
			ids[j] = s.ID()
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
		e.Counts.AbortRetries++
		for _, a := range act.Step.Arrive {
			if a.Hit > 0 {
				e.Counts.AbortedHits++
				break
			}
		}
	}
	return act
}

// DrainAll finishes every request left: the last action of a schedule.
func (e *Engine) DrainAll() Action {
	var act Action
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
