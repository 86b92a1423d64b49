package omnicache

import (
	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/soa"
)

// decodeBuf parks pure-decode steps (every request decodes one token, same
// requests in the same order, nothing arrives, finishes or is preempted).
// Up to BlockSize parked steps are written as one task, bounded by the
// staging page (steps*n ≤ capacity) and the device byte budget.
type decodeBuf struct {
	k   int     // steps parked
	ids []int64 // the requests of the parked steps, in order
	p   *producer
}

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
	if c.buf.k > 0 && (c.buf.k+1)*n > c.cap {
		if err := c.flushBuffer(); err != nil {
			return err
		}
	}
	need := c.deviceNeed(o)
	if need > 0 {
		ok, err := c.budget.TryReserve(need)
		if err == nil && !ok {
			// Budget pressure: the buffer is the oldest pending write.
			if c.buf.k > 0 {
				c.st.budgetFlushes.Add(1)
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
	if c.buf.k == 0 {
		pg, err := c.claimPage()
		if err != nil {
			c.budget.Release(need)
			return err
		}
		p := c.newProducer(pg, n)
		m := c.bs * len(c.imm)
		p.host = grow(p.host, m)
		p.dev = grow(p.dev, m)
		p.staged = grow(p.staged, m)
		c.buf.p = p
		c.buf.ids = append(c.buf.ids[:0], c.cur.ids...)
		c.mu.Lock()
		p.owners = 1
		c.mu.Unlock()
	}
	p, j := c.buf.p, c.buf.k
	c.mu.Lock()
	p.devCharge += need
	c.mu.Unlock()
	for _, k := range c.imm {
		if err := c.stage(p, &o.Tensors[k], k, j, false); err != nil {
			return err
		}
	}
	p.rows.AppendSlots(c.cur.slots, int32(j), int32(j*n))
	c.mu.Lock()
	for _, k := range c.imm {
		rec.src[k], rec.srcOff[k] = p, int32(j*n)
	}
	rec.pin(p)
	p.steps = j + 1
	c.mu.Unlock()
	c.buf.k++
	c.st.buffered.Add(1)
	if c.buf.k == c.bs {
		return c.flushBuffer()
	}
	return nil
}

// flushBuffer writes the parked steps as one task: device-parked rows are
// copied into the buffer's page, then the committer scatters them.
func (c *Cache) flushBuffer() error {
	p := c.buf.p
	if c.buf.k == 0 || p == nil {
		return nil
	}
	c.buf.k, c.buf.p = 0, nil
	for i, b := range p.dev[:p.steps*len(c.imm)] {
		if !b.IsZero() {
			if err := c.dev.CopyDtoH(p.staged[i], b, 0); err != nil {
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
	p.seq = c.q.Push(task{p: p, ev: ev})
	c.st.tasks.Add(1)
	c.st.flushes.Add(1)
	return nil
}

// pushDead hands a producer whose write failed to the committer so that its
// owner reference is dropped in order (the committer skips work once failed).
func (c *Cache) pushDead(p *producer) { c.q.Push(task{p: p}) }

// ---- deferred keys ----

// segTable holds the pending deferred rows of every request: runs of a
// clone's rows, one singly linked list per request handle.
type segTable struct {
	prod []*producer
	off  []int32
	n    []int32
	next []int32
	free []int32
	head []int32 // per handle, -1 when empty
	tail []int32
	out  []seg // segments collected for the next deferred task
}

func (t *segTable) ensure(h soa.Handle) {
	for int(h) >= len(t.head) {
		t.head = append(t.head, -1)
		t.tail = append(t.tail, -1)
	}
}

func (t *segTable) push(h soa.Handle, p *producer, off, n int32) {
	t.ensure(h)
	var i int32
	if k := len(t.free); k > 0 {
		i = t.free[k-1]
		t.free = t.free[:k-1]
		t.prod[i], t.off[i], t.n[i], t.next[i] = p, off, n, -1
	} else {
		i = int32(len(t.prod))
		t.prod = append(t.prod, p)
		t.off = append(t.off, off)
		t.n = append(t.n, n)
		t.next = append(t.next, -1)
	}
	if t.head[h] < 0 {
		t.head[h] = i
	} else {
		t.next[t.tail[h]] = i
	}
	t.tail[h] = i
}

// take moves h's segments, in order, to t.out.
func (t *segTable) take(h soa.Handle) {
	if int(h) >= len(t.head) {
		return
	}
	for i := t.head[h]; i >= 0; {
		t.out = append(t.out, seg{p: t.prod[i], off: t.off[i], n: t.n[i]})
		nx := t.next[i]
		t.prod[i] = nil
		t.free = append(t.free, i)
		i = nx
	}
	t.head[h], t.tail[h] = -1, -1
}

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
		p := &producer{id: c.newID(), deferred: true, key: k, charge: int64(nb)}
		switch {
		case t.Owned && t.Host != nil:
			p.buf, p.own = gpu.HostBuffer(t.Host[:nb:nb]), true
		case t.Owned:
			p.buf, p.own = t.Dev, true
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
			p.buf = b
			c.st.cloned.Add(int64(nb))
		}
		p.slots = append([]int32(nil), c.cur.slots...)
		owners := int32(0)
		tokOff := rec.offsets()
		for i, h := range c.cur.h {
			cnt := c.cur.count[i]
			if cnt == 0 {
				continue
			}
			c.openDeferred(h)
			c.segs.push(h, p, tokOff[i], cnt)
			owners++
		}
		c.mu.Lock()
		c.keys[k].occ.Claim(p.slots, p.id, 0)
		p.owners = owners
		if owners > 0 {
			c.prod[p.id] = p
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
	c.segs.take(h)
}

// flushDeferred hands the collected deferred rows to the committer as one
// task and returns its queue sequence (0 when there was nothing).
func (c *Cache) flushDeferred() uint64 {
	if len(c.segs.out) == 0 {
		return 0
	}
	segs := append([]seg(nil), c.segs.out...)
	clear(c.segs.out)
	c.segs.out = c.segs.out[:0]
	c.st.defWrites.Add(1)
	c.st.tasks.Add(1)
	return c.q.Push(task{segs: segs})
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
