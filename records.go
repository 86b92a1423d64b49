// Saved steps' records: recycled through the cache's own lists, and taken
// by the one call that consumes the step (Discard, Materialize). newRec runs
// on the engine goroutine; freeRec, take and drop on any.

package omnicache

import (
	"fmt"

	"github.com/omnicache/omnicache/internal/reader"
)

// newRec prepares the record of the step being saved (not yet published).
// It takes the step's ids and counts (Begin copied them out of the
// borrowed plan); the engine refills the record's old slices next Begin.
//
// Records come from the engine's stash, which takes a whole list of freed
// records at a time: those Discard recycled under c.mu (recFreeMu, taken
// under the c.mu Save holds anyway), else those the read path freed
// elsewhere (Materialize, the committer's end of a read ahead).
func (c *Cache) newRec() *reader.Step {
	e := &c.eng
	if len(e.recStash) == 0 {
		e.recStash = c.rd.Freed(e.recStash)
	}
	var r *reader.Step
	if n := len(e.recStash); n > 0 {
		r = e.recStash[n-1]
		e.recStash[n-1] = nil
		e.recStash = e.recStash[:n-1]
	} else {
		r = &reader.Step{}
	}
	r.Reset(len(c.cfg.Keys))
	e.nextStep++
	r.ID = uint64(e.nextStep)
	r.IDs, e.ids = e.ids, r.IDs[:0]
	r.Count, e.count = e.count, r.Count[:0]
	r.Start, e.start = e.start, r.Start[:0]
	return r
}

// take removes an unconsumed step record, validating reqs first.
func (c *Cache) take(id StepID, reqs []int64) (*reader.Step, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.takeLocked(id, reqs)
}

func (c *Cache) takeLocked(id StepID, reqs []int64) (*reader.Step, error) {
	for i, r := range c.steps {
		if r.ID != uint64(id) {
			continue
		}
		r.Qidx = r.Qidx[:0]
		for _, q := range reqs {
			j := r.Find(q)
			if j < 0 {
				return nil, fmt.Errorf("%w: request %d in step %d", ErrNotInStep, q, id)
			}
			r.Qidx = append(r.Qidx, int32(j))
		}
		c.steps = append(c.steps[:i], c.steps[i+1:]...)
		return r, nil
	}
	return nil, fmt.Errorf("%w: %d", ErrUnknownStep, id)
}

// StepRows returns how many requests, and how many rows per key at most,
// Materialize(id, reqs, ...) returns, without consuming the step: per asked
// request its hit prefix and its scheduled tokens. The Result may hold
// fewer rows (rejected drafts, replaced rows, rows a resumed request had
// already are left out), never more: size the buffers of Result.Into with
// it. ErrUnknownStep and ErrNotInStep as Materialize. Any goroutine.
func (c *Cache) StepRows(id StepID, reqs []int64) (n, rows int, err error) {
	if err := c.enter(); err != nil {
		return 0, 0, err
	}
	defer c.leave()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.steps {
		if r.ID != uint64(id) {
			continue
		}
		if reqs == nil {
			for i := range r.IDs {
				rows += int(r.Prefix(i) + r.Count[i])
			}
			return len(r.IDs), rows, nil
		}
		for _, q := range reqs {
			j := r.Find(q)
			if j < 0 {
				return 0, 0, fmt.Errorf("%w: request %d in step %d", ErrNotInStep, q, id)
			}
			rows += int(r.Prefix(j) + r.Count[j])
		}
		return len(reqs), rows, nil
	}
	return 0, 0, fmt.Errorf("%w: %d", ErrUnknownStep, id)
}

// drop releases a consumed step: its record is recycled, and its pins
// dropped, once its prefetch (if any) is done with it too.
func (c *Cache) drop(r *reader.Step) { c.rd.Release(r) }
