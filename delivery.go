package omnicache

import (
	"fmt"
	"slices"

	"github.com/omnicache/omnicache/internal/reader"
	"github.com/omnicache/omnicache/internal/scratch"
	"github.com/omnicache/omnicache/soa"
)

// Positions a request's rows are delivered at. A request's length (the
// positions its saved steps cover, engineState.savedLen) bounds a replace; a
// step's rows past what was accepted, or past a replaced position, are
// left out of what Materialize delivers (reader.Step.End).

// rejects reports whether any request accepted fewer tokens than it was
// scheduled.
func rejects(accepted, count []int32) bool {
	for i, a := range accepted {
		if a < count[i] {
			return true
		}
	}
	return false
}

// noteSaved records the saved step's lengths: each request's length grows
// to the end of its accepted rows, and a step that rejected rows delivers
// only the accepted ones. A decode step over the previous step's batch
// only counts itself (decodeSteps, applied by flushLens when the batch
// changes): every request's length grows by one. Engine goroutine, before
// the step is published.
func (c *Cache) noteSaved(rec *reader.Step, accepted []int32) {
	e := &c.eng
	if e.pureDecode && e.sameBatch && len(e.decodeBatch) > 0 && e.floors == 0 {
		e.decodeSteps++
		return
	}
	c.flushLens()
	for i, h := range e.handles[:len(rec.Start)] {
		if e.floors > 0 {
			if pos := e.requests.Pos(h); e.requests.Flags[pos]&flagFloor != 0 {
				lo := rec.Start[i] // its rows start here, or at 0 with a hit prefix
				for _, hit := range e.hits {
					if int(hit.Index) == i {
						lo -= hit.Tokens
					}
				}
				if lo >= e.preemptLen[h] {
					c.dropFloor(h) // saved past what it had: nothing to leave out from here on
				} else {
					rec.Floor = append(rec.Floor, int32(i))
					rec.FloorMax = append(rec.FloorMax, e.preemptLen[h])
				}
			}
		}
		end := rec.Start[i] + rec.Count[i] // the engine's ids, counts and starts moved to the record
		if accepted != nil {
			end = rec.Start[i] + accepted[i]
			if accepted[i] < rec.Count[i] {
				rec.Trim(i, end)
			}
		}
		e.savedLen = scratch.Extend(e.savedLen, int(h)+1)
		e.savedLen[h] = max(e.savedLen[h], end)
	}
	if e.pureDecode {
		e.decodeBatch = append(e.decodeBatch[:0], e.handles...)
	}
}

// flushLens applies the decode steps counted since the batch's last full
// note (noteSaved) to its requests' lengths. Engine goroutine, before any
// request of that batch can leave.
func (c *Cache) flushLens() {
	e := &c.eng
	if e.decodeSteps > 0 {
		for _, h := range e.decodeBatch {
			e.savedLen[h] += e.decodeSteps
		}
	}
	e.decodeSteps = 0
	e.decodeBatch = e.decodeBatch[:0]
}

// checkReplaced validates the plan's replaced prompts: every id live, the
// position within the request's length.
func (c *Cache) checkReplaced(p *Plan) error {
	if len(p.Replaced) != len(p.ReplacedFrom) {
		return fmt.Errorf("%w: %d replaced requests, %d positions", ErrPlan, len(p.Replaced), len(p.ReplacedFrom))
	}
	reqs := c.eng.requests
	for i, id := range p.Replaced {
		h, ok := reqs.Lookup(id)
		if !ok {
			return fmt.Errorf("%w: replace of request %d, which is not live", ErrPlan, id)
		}
		at, n := p.ReplacedFrom[i], c.length(h)
		if at < 0 || at > n {
			return fmt.Errorf("%w: replace of request %d from position %d: outside its %d tokens", ErrPlan, id, at, n)
		}
	}
	return nil
}

// length is the positions request h's saved steps cover.
func (c *Cache) length(h soa.Handle) int32 {
	e := &c.eng
	if int(h) >= len(e.savedLen) {
		return 0
	}
	n := e.savedLen[h]
	if e.decodeSteps > 0 && slices.Contains(e.decodeBatch, h) {
		n += e.decodeSteps
	}
	return n
}

// applyReplaced applies validated replacements (after flushLens): the request's length
// becomes the position; a hit not served yet is cut to the blocks before
// it; and every saved step not consumed yet delivers none of the request's
// rows from it on. Engine goroutine, inside Begin's apply.
func (c *Cache) applyReplaced(p *Plan) {
	if len(p.Replaced) == 0 {
		return
	}
	e := &c.eng
	reqs := e.requests
	bs := int32(c.cfg.BlockSize)
	for i, id := range p.Replaced {
		at := p.ReplacedFrom[i]
		h, _ := reqs.Lookup(id)
		c.snap(h)
		pos := reqs.Pos(h)
		e.savedLen = scratch.Extend(e.savedLen, int(h)+1)
		e.savedLen[h] = at
		if reqs.Flags[pos]&flagHitPending != 0 && reqs.HitTokens[pos] > at {
			reqs.HitTokens[pos] = at / bs * bs
			reqs.HitN[pos] = at / bs
		}
	}
	c.mu.Lock()
	for i, id := range p.Replaced {
		at := p.ReplacedFrom[i]
		h, _ := reqs.Lookup(id)
		d := e.delivered[h]
		if d.pos > at {
			e.undo.pos = append(e.undo.pos, posSnap{d, d.pos})
			d.pos = at // delivery restarts there
		}
		// A step being read delivers its rows (taken before the replace,
		// they were not cut), but its delivery counts only up to there.
		for _, r := range c.reading {
			for qi, rd := range r.dl {
				if rd == d && r.dlHi[qi] > at {
					e.undo.cuts = append(e.undo.cuts, cutSnap{r: r, step: r.dlStep, qi: qi, d: d, hi: r.dlHi[qi]})
					r.dlHi[qi] = at
				}
			}
		}
		if int(h) < len(e.preemptLen) {
			e.preemptLen[h] = min(e.preemptLen[h], at)
		}
	}
	for _, sv := range c.steps {
		rec := sv.rec
		for i, id := range p.Replaced {
			if j := rec.Find(id); j >= 0 {
				lo := rec.Start[j] - rec.Prefix(j)
				c.snapTrim(rec, j)
				rec.Trim(j, max(lo, p.ReplacedFrom[i]))
			}
		}
	}
	c.mu.Unlock()
}

// ---- delivery positions ----
//
// The cache knows, per request, up to which position its rows were
// delivered: a delivery per request (made when it arrives; saved steps
// point to it, so a step consumed after its request finished still finds
// it), read and written under c.mu. A Materialize takes its step, reads
// it, then records once what it delivered (deliver): each request it
// served advances to the end of its rows; one it could not serve keeps
// its position; a Discard delivers nothing. A preempted request
// (flagFloor) that resumes recomputes rows: Materialize of such a step
// leaves out every row below the request's delivered position and below
// what its older steps, not consumed yet or being read, will deliver, so
// the concatenation of what it received has no gap and no repeat when a
// request's steps are consumed in order. A replace moves the position
// back, and cuts what the steps being read will record.

// delivery is one request's delivered position (guarded by Cache.mu).
type delivery struct{ pos int32 }

// cutRead is a Materialize that recorded a delivery a replace had cut
// while it read: the Abort of that replace's Begin delivers it whole
// (unbegin). Guarded by c.mu; kept until the Begin is saved or undone.
type cutRead struct {
	d      *delivery
	step   uint64
	served bool
}

// freshReq resets the engine's state of handle h, which names a new
// request. Engine goroutine, inside Begin's apply.
func (c *Cache) freshReq(h soa.Handle) {
	e := &c.eng
	c.markFresh(h)
	e.savedLen = scratch.Extend(e.savedLen, int(h)+1)
	e.savedLen[h] = 0
	e.delivered = scratch.Extend(e.delivered, int(h)+1)
	e.delivered[h] = &delivery{}
}

// newBatch makes the begun batch's delivery states the array its steps'
// records point to: a new array, since records of older steps still point
// to the old one. Engine goroutine.
func (c *Cache) newBatch() {
	e := &c.eng
	e.batchDelivered = make([]*delivery, len(e.handles))
	for i, h := range e.handles {
		e.batchDelivered[i] = e.delivered[h]
	}
}

// applyPreempted flags the preempted requests: their later steps may
// recompute rows they delivered. Engine goroutine (Begin's apply, after
// flushLens).
func (c *Cache) applyPreempted(p *Plan) {
	e := &c.eng
	for _, id := range p.Preempted {
		h, ok := e.requests.Lookup(id)
		if !ok {
			continue
		}
		c.snap(h)
		pos := e.requests.Pos(h)
		// A hit not served yet goes with the KV it came from: the request
		// resumes with a hit of its own, or none.
		e.requests.Flags[pos] &^= flagHitPending
		if e.requests.Flags[pos]&flagFloor == 0 {
			e.requests.Flags[pos] |= flagFloor
			e.floors++
		}
		e.preemptLen = scratch.Extend(e.preemptLen, int(h)+1)
		e.preemptLen[h] = c.length(h)
	}
}

// dropFloor clears request h's flagFloor (it finished, or caught up).
func (c *Cache) dropFloor(h soa.Handle) {
	e := &c.eng
	if pos := e.requests.Pos(h); e.requests.Flags[pos]&flagFloor != 0 {
		e.requests.Flags[pos] &^= flagFloor
		e.floors--
	}
}

// openDelivery works out, for each request the taken step sv serves (the
// first ones asked of Materialize, sv.rec.Qidx when subset, else all), the
// rows Materialize leaves out at the front (dst.skip) and where its rows
// end if it is served (dst.dlHi), and registers dst as being read: a
// Materialize of a later step of the request counts those rows as
// delivered, and a replace meanwhile cuts them. Nothing is recorded yet
// (deliver does, once the read is done). Caller holds c.mu.
func (c *Cache) openDelivery(sv saved, subset bool, dst *Result) {
	rec := sv.rec
	nq := len(rec.IDs)
	if subset {
		nq = len(rec.Qidx)
	}
	dst.skip, dst.dl, dst.dlHi, dst.dlFull = dst.skip[:0], dst.dl[:0], dst.dlHi[:0], dst.dlFull[:0]
	for qi := 0; qi < nq; qi++ {
		i := qi
		if subset {
			i = int(rec.Qidx[qi])
		}
		var skip, hi int32
		var d *delivery
		if i < len(sv.dl) {
			d = sv.dl[i]
			lo := rec.Start[i] - rec.Prefix(i)
			hi = rec.Hi(i)
			if f := slices.Index(rec.Floor, int32(i)); f >= 0 {
				// Rows below what it was delivered, or will be by its older
				// steps, and that it had before its preemption.
				skip = max(0, min(c.floorLocked(rec, i, d), rec.FloorMax[f], hi)-lo)
			}
			if lo+skip >= hi {
				d = nil // nothing to deliver
			}
		}
		dst.skip = append(dst.skip, skip)
		dst.dl = append(dst.dl, d)
		dst.dlHi = append(dst.dlHi, hi)
		dst.dlFull = append(dst.dlFull, hi)
	}
	dst.dlStep = rec.ID
	c.reading = append(c.reading, dst)
}

// floorLocked is the position request i of rec (its delivery d) was
// delivered up to, or will be once its older steps not consumed yet and
// those being read are. Caller holds c.mu.
func (c *Cache) floorLocked(rec *reader.Step, i int, d *delivery) int32 {
	floor := d.pos
	for _, o := range c.steps {
		if o.rec.ID < rec.ID {
			if j := o.rec.Find(rec.IDs[i]); j >= 0 && o.rec.Count[j] > 0 {
				floor = max(floor, o.rec.Hi(j))
			}
		}
	}
	for _, r := range c.reading {
		if r.dlStep < rec.ID {
			for qi, rd := range r.dl {
				if rd == d {
					floor = max(floor, r.dlHi[qi])
				}
			}
		}
	}
	return floor
}

// deliver records, once, what the Materialize into dst delivered, its
// read done: each request it served (ok, and no error of its own)
// advances its position to the end of its rows (as a replace since cut
// them); the others keep theirs. dst is no longer being read. Any
// goroutine.
func (c *Cache) deliver(dst *Result, ok bool) {
	c.mu.Lock()
	for qi, d := range dst.dl {
		if d == nil {
			continue
		}
		served := ok && dst.errs[qi] == nil
		if served {
			d.pos = max(d.pos, dst.dlHi[qi])
		}
		if dst.dlHi[qi] < dst.dlFull[qi] {
			c.cut = append(c.cut, cutRead{d: d, step: dst.dlStep, served: served})
		}
	}
	if i := slices.Index(c.reading, dst); i >= 0 {
		last := len(c.reading) - 1
		c.reading[i] = c.reading[last]
		c.reading[last] = nil
		c.reading = c.reading[:last]
	}
	c.mu.Unlock()
	clear(dst.dl) // keeps no request's state alive
}
