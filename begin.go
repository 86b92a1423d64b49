package omnicache

import (
	"fmt"
	"slices"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/reader"
	"github.com/omnicache/omnicache/internal/scratch"
	"github.com/omnicache/omnicache/soa"
)

// Begin registers a step plan: it validates the whole plan, then writes
// out the decode buffer unless this step continues it, processes finished
// requests, registers arrivals and maps the batch to slots. A plan that
// fails validation (a nil plan is ErrPlan) changes nothing. Engine
// goroutine only; the plan is borrowed for the call.
func (c *Cache) Begin(p *Plan) error {
	if err := c.check(); err != nil {
		return err
	}
	if p == nil {
		return fmt.Errorf("%w: nil plan", ErrPlan)
	}
	e := &c.eng
	if e.begun {
		return fmt.Errorf("%w: Begin twice without Save (the begun step stays begun)", ErrSequence)
	}
	// Validate the whole plan (validate.go): nothing is applied yet.
	ntok, pure, same, err := c.validatePlan(p)
	if err != nil {
		return err
	}
	// Apply. Validation and the request table are the engine's own memory;
	// a Begin that may write out the decode buffer, finish requests or plan
	// hits reaches the write path, and registers as a call in flight first
	// (Close frees nothing under it). Only a decode step over the previous
	// step's batch (pure and same: it plans no hit and cannot flush) stays
	// off the gate's atomics: it reads nothing Close releases.
	if !(pure && same) || len(p.Finished) > 0 || len(p.HitBlocks) > 0 || len(p.Replaced) > 0 {
		if err := c.enter(); err != nil {
			return err
		}
		defer c.leave()
		if err := c.check(); err != nil {
			return err // closed or failed since the check above: nothing applied
		}
		c.flushLens() // before a request of the counted batch can leave
	}
	c.startUndo()      // Abort and a failed Save undo what follows
	c.applyReplaced(p) // before finishes: a replaced request may finish too
	c.applyPreempted(p)
	if c.finish(p.Finished) {
		same = false
	}
	// Anything but a buffered decode step writes the buffer out, then the
	// finished requests' deferred rows, before hits are planned or blocks
	// are reused (a buffered step finishes nothing).
	if !pure {
		c.path.Flush(true, e.finished)
	}
	if c.arrive(p) {
		same = false
	}
	if c.tl != nil {
		c.tl.StartImport(c.path) // ahead of the hit read planned below
	}
	c.setBatch(p, same)
	e.tokens, e.pureDecode, e.sameBatch, e.begun = ntok, pure, same, true
	if c.tl != nil {
		c.tl.Begin(p.FullBlocks, p.FullHashes)
	}
	c.planHits(p.ResultInto, p.ResultDev)
	e.resultInto = append(scratch.Empty(e.resultInto), p.ResultInto...)
	c.intoForSave(p.ResultInto)
	return nil
}

// finish drops the finished requests (their open writes still land; Begin
// hands their deferred rows over) and reports whether any was live.
// Engine goroutine.
func (c *Cache) finish(finished []int64) (changed bool) {
	e := &c.eng
	e.finished = e.finished[:0]
	for _, id := range finished {
		if h, ok := e.requests.Lookup(id); ok {
			if s := c.snap(h); s != nil {
				s.removed = true
			}
			e.finished = append(e.finished, h)
			c.dropFloor(h)
			e.requests.Remove(h)
			changed = true
		}
	}
	return changed
}

// arrive registers the plan's arrivals (and the resumed requests' hits),
// noting their tier imports, and reports whether any changed the table.
func (c *Cache) arrive(p *Plan) (changed bool) {
	e := &c.eng
	e.added = e.added[:0]
	used, tierUsed := 0, 0
	for i, id := range p.Arrivals {
		ht := p.HitTokens[i]
		nb := int(ht) / c.cfg.BlockSize
		blocks := p.HitBlocks[used : used+nb]
		used += nb
		h, fresh := e.requests.Add(id, ht, blocks)
		rehit := !fresh && ht > 0 && slices.Contains(p.Resumed, id)
		if rehit {
			// A preempted request resuming with a hit: the hit is served as
			// an arrival's (delivery leaves out what it already had).
			c.snap(h)
			e.requests.SetHit(h, ht, blocks)
		}
		if fresh || rehit {
			changed = true
			if fresh {
				e.added = append(e.added, h)
				c.freshReq(h)
			}
			if ht > 0 {
				e.requests.Flags[e.requests.Pos(h)] |= flagHitPending
			}
			if len(p.TierBlocks) > 0 && p.TierBlocks[i] > 0 {
				n := int(p.TierBlocks[i])
				c.tl.NoteImport(p.Arrivals[i], blocks, p.TierHashes[tierUsed:tierUsed+n], p.TierBlocks[i:])
			}
		}
		if len(p.TierBlocks) > 0 {
			tierUsed += int(p.TierBlocks[i])
		}
	}
	return changed
}

// setBatch records the begun batch: its ids, counts and starts, and its
// handles (the previous step's when same).
func (c *Cache) setBatch(p *Plan, same bool) {
	e := &c.eng
	e.ids = append(e.ids[:0], p.IDs...)
	e.counts = append(e.counts[:0], p.Count...)
	e.starts = append(e.starts[:0], p.Start...)
	e.hitPos = e.hitPos[:0]
	if same {
		e.handles = e.prevHandles // read-only until the ids change
	} else {
		e.handles = e.spareHandles[:0]
		// checkIDs ran (the ids changed) and looked every id up: a request
		// live then, and not finished, keeps its handle (removals do not
		// move others); only the rest are looked up again.
		for i, id := range p.IDs {
			h := e.liveHandles[i]
			if h == soa.NoHandle {
				var ok bool
				if h, ok = e.requests.Lookup(id); !ok {
					h, _ = e.requests.Add(id, 0, nil)
					e.added = append(e.added, h)
					c.freshReq(h)
				}
			}
			e.handles = append(e.handles, h)
		}
		for i, h := range e.handles {
			if e.requests.Flags[e.requests.Pos(h)]&flagHitPending != 0 {
				e.hitPos = append(e.hitPos, int32(i))
			}
		}
		c.newBatch()
		e.prevIDs = append(e.prevIDs[:0], p.IDs...)
		e.spareHandles, e.prevHandles = e.prevHandles, e.handles
		c.live.Store(int64(e.requests.Len())) // the table changes only with the ids
	}
}

// planHits plans the begun step's hits behind the rows handed over so far
// (the buffer was flushed above): with prefetch their rows move while the
// engine runs its forward, into the engine's buffers when it gave them
// (into: Plan.ResultInto); dev, the Plan.ResultDev buffers, are kept for
// Save and the committer when they hold the step's rows.
func (c *Cache) planHits(into [][]byte, dev []gpu.Buffer) {
	e := &c.eng
	e.hits = e.hits[:0]
	if len(e.hitPos) == 0 {
		c.resultDevFor(dev)
	} else {
		// Plan the hits now, behind the rows handed over so far (the buffer
		// was flushed above): with prefetch their rows move while the
		// engine runs its forward.
		for _, i := range e.hitPos {
			h := e.handles[i]
			c.snap(h)
			pos := e.requests.Pos(h)
			e.requests.Flags[pos] &^= flagHitPending
			e.hits = append(e.hits, reader.Hit{Index: i, Tokens: e.requests.HitTokens[pos], Blocks: e.requests.HitBlocks(h)})
		}
		c.resultDevFor(dev) // the step's rows are known with its hits
		// Prefetched steps are planned now. A step that reads its own rows
		// (a hit on blocks it writes) is planned at Save, behind its own
		// writes, and its prefetch queued there; one the read-ahead budget
		// cannot hold is planned at Save as without prefetch (its plan's
		// pins then come after Save's reservation).
		if !c.cfg.DisablePrefetch {
			e.hitRec = c.newRec()
			e.hitRec.SetResultDev(e.resultDev) // before its read is queued: the committer copies it up
			if c.rd.Charge(e.hitRec, e.hits, into) && !c.hitsOverlapStep() {
				c.rd.Plan(e.hitRec, e.hits)
				e.hitsPlanned = true
			}
		}
	}
}

// hitsOverlapStep reports whether a hit block of the begun step is also
// written by the step itself: such a hit reads the step's own rows, so it
// is planned at Save, once they were handed over.
func (c *Cache) hitsOverlapStep() bool {
	e := &c.eng
	bs := c.cfg.BlockSize
	if len(e.blockMark) < c.cfg.NumBlocks {
		e.blockMark = make([]uint32, c.cfg.NumBlocks)
	}
	e.blockGen++
	if e.blockGen == 0 { // wrapped: start the marks afresh
		clear(e.blockMark)
		e.blockGen = 1
	}
	for _, h := range e.hits {
		for _, b := range h.Blocks {
			e.blockMark[b] = e.blockGen
		}
	}
	if e.stepBlocks != nil { // a long step: its blocks, read off the block table
		for _, b := range e.stepBlocks {
			if e.blockMark[b] == e.blockGen {
				return true
			}
		}
		return false
	}
	for _, s := range e.slots {
		if e.blockMark[int(s)/bs] == e.blockGen {
			return true
		}
	}
	return false
}

// intoForSave keeps, per key, the region of the begun step's
// Plan.ResultInto buffers that its own rows take in the Result (after
// its first request's hit prefix), for Save to copy them there
// (writer.Step.Into): only when no other request has a hit prefix (the
// step's rows are then one run, as in a staging page) and every buffer
// holds them.
func (c *Cache) intoForSave(into [][]byte) {
	e := &c.eng
	e.into = scratch.Empty(e.into)
	if len(into) == 0 {
		return
	}
	off := 0
	for _, h := range e.hits {
		if h.Index != 0 {
			return
		}
		off = int(h.Tokens)
	}
	for k, key := range c.cfg.Keys {
		lo, hi := off*key.RowBytes, (off+e.tokens)*key.RowBytes
		if len(into[k]) < hi {
			e.into = scratch.Empty(e.into)
			return
		}
		e.into = append(e.into, into[k][lo:hi:hi])
	}
}
