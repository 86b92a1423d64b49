// Saved steps' records: made by the engine goroutine (newRec, from the
// read path's pool) and taken by the one call that consumes the step
// (Discard, Materialize); takeLocked runs on any goroutine.

package omnicache

import (
	"fmt"

	"github.com/omnicache/omnicache/internal/reader"
)

// saved is a step saved and not consumed yet: the read path's record and
// its requests' delivery states (by step index: the batch's array, shared
// by the steps over the same batch).
type saved struct {
	rec *reader.Step
	dl  []*delivery
}

// newRec prepares the record of the step being saved (not yet published).
// It takes the step's ids and counts (Begin copied them out of the
// borrowed plan); the engine refills the record's old slices next Begin.
// Engine goroutine.
func (c *Cache) newRec() *reader.Step {
	e := &c.eng
	r := c.rd.NewStep(len(c.cfg.Keys))
	e.nextStep++
	r.ID = uint64(e.nextStep)
	r.IDs, e.ids = e.ids, r.IDs[:0]
	r.Count, e.counts = e.counts, r.Count[:0]
	r.Start, e.starts = e.starts, r.Start[:0]
	return r
}

// takeLocked removes an unconsumed step, validating reqs first, and for a
// Materialize (dst set) that its buffers do not clash with the step's
// Plan.ResultInto buffers. Caller holds c.mu.
func (c *Cache) takeLocked(id StepID, reqs []int64, dst *Result) (saved, error) {
	for i, sv := range c.steps {
		r := sv.rec
		if r.ID != uint64(id) {
			continue
		}
		if dst != nil && r.IntoClash(dst.into, reqs == nil) {
			return saved{}, fmt.Errorf("%w: step %d: Result.Into buffers overlap the step's Plan.ResultInto buffers "+
				"other than as the same buffer per key for the whole step (rows would move across one another): "+
				"materialize the whole step into them, or into other buffers; the step stays unconsumed", ErrOutputs, id)
		}
		r.Qidx = r.Qidx[:0]
		for _, q := range reqs {
			j := r.Find(q)
			if j < 0 {
				return saved{}, fmt.Errorf("%w: request %d in step %d", ErrNotInStep, q, id)
			}
			r.Qidx = append(r.Qidx, int32(j))
		}
		c.steps = append(c.steps[:i], c.steps[i+1:]...)
		return sv, nil
	}
	return saved{}, fmt.Errorf("%w: %d", ErrUnknownStep, id)
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
	for _, sv := range c.steps {
		r := sv.rec
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
