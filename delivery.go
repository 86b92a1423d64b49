package omnicache

import (
	"fmt"
	"slices"

	"github.com/omnicache/omnicache/reader"
	"github.com/omnicache/omnicache/soa"
)

// Positions a request's rows are delivered at. A request's length (the
// positions its saved steps cover, engine.lens) bounds a replace; a
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
// only counts itself (lenPending, applied by flushLens when the batch
// changes): every request's length grows by one. Engine goroutine, before
// the step is published.
func (c *Cache) noteSaved(rec *reader.Step, accepted []int32) {
	e := &c.eng
	if e.pure && e.same && len(e.lenH) > 0 {
		e.lenPending++
		return
	}
	c.flushLens()
	for i, h := range e.h {
		end := rec.Start[i] + rec.Count[i] // the engine's ids, counts and starts moved to the record
		if accepted != nil {
			end = rec.Start[i] + accepted[i]
			if accepted[i] < rec.Count[i] {
				rec.Trim(i, end)
			}
		}
		e.lens = growLens(e.lens, h)
		e.lens[h] = max(e.lens[h], end)
	}
	if e.pure {
		e.lenH = append(e.lenH[:0], e.h...)
	}
}

// flushLens applies the decode steps counted since the batch's last full
// note (noteSaved) to its requests' lengths. Engine goroutine, before any
// request of that batch can leave.
func (c *Cache) flushLens() {
	e := &c.eng
	if e.lenPending > 0 {
		for _, h := range e.lenH {
			e.lens[h] += e.lenPending
		}
	}
	e.lenPending = 0
	e.lenH = e.lenH[:0]
}

// growLens makes lens hold handle h.
func growLens(lens []int32, h soa.Handle) []int32 {
	for int(h) >= len(lens) {
		lens = append(lens, 0)
	}
	return lens
}

// checkReplaced validates the plan's replaced prompts: every id live, the
// position within the request's length.
func (c *Cache) checkReplaced(p *Plan) error {
	if len(p.Replaced) != len(p.ReplacedFrom) {
		return fmt.Errorf("%w: %d replaced requests, %d positions", ErrPlan, len(p.Replaced), len(p.ReplacedFrom))
	}
	reqs := c.eng.reqs
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
	if int(h) >= len(e.lens) {
		return 0
	}
	n := e.lens[h]
	if e.lenPending > 0 && slices.Contains(e.lenH, h) {
		n += e.lenPending
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
	reqs := e.reqs
	bs := int32(c.cfg.BlockSize)
	for i, id := range p.Replaced {
		at := p.ReplacedFrom[i]
		h, _ := reqs.Lookup(id)
		pos := reqs.Pos(h)
		e.lens = growLens(e.lens, h)
		e.lens[h] = at
		if reqs.Flags[pos]&flagHitPending != 0 && reqs.HitTokens[pos] > at {
			reqs.HitTokens[pos] = at / bs * bs
			reqs.HitN[pos] = at / bs
		}
	}
	c.mu.Lock()
	for _, rec := range c.steps {
		for i, id := range p.Replaced {
			if j := rec.Find(id); j >= 0 {
				lo := rec.Start[j] - rec.Prefix(j)
				rec.Trim(j, max(lo, p.ReplacedFrom[i]))
			}
		}
	}
	c.mu.Unlock()
}
