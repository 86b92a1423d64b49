// Reading a taken step into a Result: the layout of its requests, the
// read, and the rows left out after it.

package omnicache

import (
	"fmt"
	"time"

	"github.com/omnicache/omnicache/internal/reader"
)

// read fills dst with the rows of the taken step rec for reqs (nil:
// every request), leaving out what openDelivery left out at the front
// and what a trim cut at the end, and releases rec. A sticky write
// failure, or a Reset since the step was saved, fails it whole.
func (c *Cache) read(rec *reader.Step, reqs []int64, dst *Result) error {
	if err := c.readable(rec); err != nil {
		return err
	}
	all, nq := c.layout(rec, reqs, dst)
	trimmed := rec.Trimmed // set under c.mu until take: stable until the record is released
	if !all || !rec.Prefetched() || rec.ReadsInto() || !dst.adopts() {
		dst.size() // else the read adopts the prefetched buffers (the cache's, never the engine's)
	}
	var err error
	switch {
	case c.hitWait == nil || !rec.HasHits():
		err = c.rd.Read(rec, all, nq, dest{dst})
	case c.parts.Progress.Reached(rec.WaitSeq()):
		// Nothing to wait for (the usual case: the prefetch ran during
		// the forward): observed as no wait, with no clock read.
		c.hitWait.Observe(0)
		err = c.rd.Read(rec, all, nq, dest{dst})
	default:
		t0 := time.Now()
		err = c.rd.Read(rec, all, nq, dest{dst})
		c.hitWait.Observe(int64(time.Since(t0)))
	}
	c.drop(rec)
	if err != nil {
		return err
	}
	c.cutRows(trimmed, dst)
	return c.check()
}

// readable releases the taken step rec and says why when it cannot be
// read: a sticky write failure, or a Reset since it was saved.
func (c *Cache) readable(rec *reader.Step) error {
	if err := c.path.Err(); err != nil {
		c.drop(rec)
		return err
	}
	if rec.ID <= c.resetFence.Load() {
		c.drop(rec)
		return fmt.Errorf("%w: step %d", ErrReset, rec.ID)
	}
	return nil
}

// layout lays dst out for the taken step rec's requests reqs (nil: every
// request): per request its id, prefix, rows and first position, the rows
// one request after another as laid out in the step (trimmed rows
// included, left out by cutRows). It returns whether every request is asked,
// and how many.
func (c *Cache) layout(rec *reader.Step, reqs []int64, dst *Result) (all bool, nq int) {
	all, nq = reqs == nil, len(reqs)
	if all {
		nq = len(rec.IDs)
	}
	dst.reset(c.lay.RowBytes)
	dst.keep = dst.keep[:0]
	for qi := 0; qi < nq; qi++ {
		i := qi
		if !all {
			i = int(rec.Qidx[qi])
		}
		pre := rec.Prefix(i)
		lo := rec.Start[i] - pre
		dst.add(rec.IDs[i], pre, pre+rec.Count[i], lo)
		if rec.Trimmed { // set under c.mu until take: stable now
			// Rows past End (rejected drafts, a replaced prompt's tail)
			// are read as laid out, then left out of the result.
			dst.keep = append(dst.keep, rec.End[i]-lo)
		}
	}
	return all, nq
}

// cutRows leaves out of dst the rows openDelivery left out at the front
// and, when the step read was trimmed (its Trimmed, taken before its
// record was released), those a trim cut at the end. Views only.
func (c *Cache) cutRows(trimmed bool, dst *Result) {
	// A request whose rows could not be served keeps its whole shape
	// (zeros, Result.Err set): nothing of it was delivered.
	for qi, skip := range dst.skip {
		if skip > 0 && dst.errs[qi] == nil {
			dst.trimFront(qi, skip) // rows the request already had (it resumed)
		}
	}
	if trimmed {
		for qi, n := range dst.keep {
			if dst.errs[qi] == nil {
				dst.trim(qi, n-dst.skip[qi])
			}
		}
	}
}
