package omnicache

import (
	"fmt"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/soa"
	"github.com/omnicache/omnicache/writer"
)

// deviceNeed is the device bytes the step's immediate tensors need for
// clones (non-owned device tensors).
func (c *Cache) deviceNeed(o *Outputs) int64 {
	var need int64
	for _, k := range c.imm {
		t := &o.Tensors[k]
		if t.Host == nil && !t.Owned {
			need += int64(c.cur.ntok * c.rowB[k])
		}
	}
	return need
}

// park parks this pure-decode step's immediate rows in the decode buffer.
func (c *Cache) park(o *Outputs, rec *stepRec) error {
	if len(c.imm) == 0 {
		return nil
	}
	n := c.cur.ntok
	if c.buf.K > 0 && !c.buf.Fits(n, c.cap) {
		if err := c.flushBuffer(); err != nil {
			return err
		}
	}
	need := c.deviceNeed(o)
	if need > 0 {
		ok, err := c.budget.TryReserve(need)
		if err != nil {
			err = fmt.Errorf("%w: %w", ErrBudget, err)
		} else if !ok {
			// Budget pressure: the buffer is the oldest pending write.
			if c.buf.K > 0 {
				c.st.BudgetFlushes.Add(1)
				if err := c.flushBuffer(); err != nil {
					return err
				}
			}
			err = c.reserve(need)
		}
		if err != nil {
			return err
		}
	}
	if c.buf.K == 0 {
		pg, err := c.claimPage()
		if err != nil {
			c.budget.Release(need)
			return err
		}
		p := c.newWrite(pg, n)
		m := c.bs * len(c.imm)
		p.Host = grow(p.Host, m)
		p.Dev = grow(p.Dev, m)
		p.Staged = grow(p.Staged, m)
		c.buf.Open(rec.ids, p)
		p.Owners = 1 // not published yet: no lock needed
	}
	p, j := c.buf.W, c.buf.K
	if need > 0 {
		c.mu.Lock()
		p.DevCharge += need // the write owns the reservation from here on
		c.mu.Unlock()
	}
	for _, k := range c.imm {
		if err := c.stage(p, &o.Tensors[k], k, j, false); err != nil {
			return err
		}
	}
	p.Rows.AppendSlots(c.cur.slots, int32(j), int32(j*n))
	c.mu.Lock()
	for _, k := range c.imm {
		rec.src[k], rec.srcOff[k] = p, int32(j*n)
	}
	rec.pin(p)
	p.Steps = j + 1
	c.mu.Unlock()
	c.buf.K++
	c.st.Buffered.Add(1)
	if c.buf.K == c.bs {
		return c.flushBuffer()
	}
	return nil
}

// flushBuffer writes the parked steps as one task: device-parked rows are
// copied into the buffer's page, then the committer scatters them.
func (c *Cache) flushBuffer() error {
	p := c.buf.Take()
	if p == nil {
		return nil
	}
	for i, b := range p.Dev[:p.Steps*len(c.imm)] {
		if !b.IsZero() {
			if err := c.dev.CopyDtoH(p.Staged[i], b, 0); err != nil {
				c.pushDead(p)
				return c.fail(err)
			}
		}
	}
	ev, err := c.dev.Record()
	if err == nil {
		err = c.join(ev)
	}
	if err != nil {
		c.pushDead(p)
		return c.fail(err)
	}
	p.Seq = c.q.Push(writer.Task{W: p, Ev: ev})
	c.st.Tasks.Add(1)
	c.st.Flushes.Add(1)
	return nil
}

// pushDead hands a write that failed to the committer so that its
// owner reference is dropped in order (the committer skips work once failed).
func (c *Cache) pushDead(p *writer.Write) { c.q.Push(writer.Task{W: p}) }

// ---- deferred keys ----

// saveDeferred clones this step's deferred rows (one clone per key, shared
// by the step's requests) and appends each request's run to its pending
// deferred write.
func (c *Cache) saveDeferred(o *Outputs, rec *stepRec) error {
	n := c.cur.ntok
	if n == 0 || len(c.def) == 0 {
		return nil
	}
	for _, k := range c.def {
		t := &o.Tensors[k]
		nb := n * c.rowB[k]
		if err := c.reserve(int64(nb)); err != nil {
			return err
		}
		p := &writer.Write{ID: c.newID(), Deferred: true, Key: k, Charge: int64(nb)}
		switch {
		case t.Owned && t.Host != nil:
			p.Buf, p.Own = gpu.HostBuffer(t.Host[:nb:nb]), true
			p.Owned = append(p.Owned, t.Host)
		case t.Owned:
			p.Buf, p.Own = t.Dev, true
		default:
			b, err := c.dev.Alloc(nb)
			if err != nil {
				c.budget.Release(int64(nb))
				return c.fail(err)
			}
			if t.Host != nil {
				err = c.dev.CopyHtoD(b, 0, t.Host[:nb])
			} else {
				err = c.dev.CopyDtoD(b, 0, t.Dev, 0, nb)
			}
			if err != nil {
				c.dev.Free(b)
				c.budget.Release(int64(nb))
				return c.fail(err)
			}
			p.Buf = b
			c.st.Cloned.Add(int64(nb))
		}
		p.Slots = append([]int32(nil), c.cur.slots...)
		owners := int32(0)
		tokOff := rec.offsets()
		for i, h := range c.cur.h {
			cnt := rec.count[i]
			if cnt == 0 {
				continue
			}
			c.openDeferred(h)
			c.segs.Push(h, p, tokOff[i], cnt)
			owners++
		}
		c.mu.Lock()
		c.keys[k].occ.Claim(p.Slots, p.ID, 0)
		p.Owners = owners
		if owners > 0 {
			c.clones[p.ID] = p
		}
		rec.src[k], rec.srcOff[k] = p, 0
		rec.pin(p)
		c.mu.Unlock()
	}
	return nil
}

// openDeferred notes that h has a pending deferred write (oldest first for
// budget pressure).
func (c *Cache) openDeferred(h soa.Handle) {
	for int(h) >= len(c.defOpen) {
		c.defOpen = append(c.defOpen, 0)
	}
	if c.defOpen[h] == 0 {
		c.defSeq++
		c.defOpen[h] = c.defSeq
		c.defFIFO = append(c.defFIFO, openRef{h: h, seq: c.defSeq})
	}
}

// closeDeferred collects h's pending deferred rows for the next deferred
// task; the next append opens a new pending write.
func (c *Cache) closeDeferred(h soa.Handle) {
	if int(h) < len(c.defOpen) {
		c.defOpen[h] = 0
	}
	c.segs.Take(h)
}

// flushDeferred hands the collected deferred rows to the committer as one
// task and returns its queue sequence (0 when there was nothing).
func (c *Cache) flushDeferred() uint64 {
	if len(c.segs.Out) == 0 {
		return 0
	}
	segs := append([]writer.Seg(nil), c.segs.Out...)
	clear(c.segs.Out)
	c.segs.Out = c.segs.Out[:0]
	c.st.DeferredWrites.Add(1)
	c.st.Tasks.Add(1)
	return c.q.Push(writer.Task{Segs: segs})
}

// forceOldestDeferred writes the oldest open deferred write and waits for it
// to land; it reports whether there was one.
func (c *Cache) forceOldestDeferred() bool {
	for len(c.defFIFO) > 0 {
		r := c.defFIFO[0]
		c.defFIFO = c.defFIFO[1:]
		if int(r.h) < len(c.defOpen) && c.defOpen[r.h] == r.seq {
			c.closeDeferred(r.h)
			c.q.Wait(c.flushDeferred())
			return true
		}
	}
	return false
}
