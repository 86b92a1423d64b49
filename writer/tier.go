package writer

import "time"

// Rows that cross the cache's boundary as whole blocks (a shared tier):
// imports write fetched rows into the mirror, gathers read committed rows
// out of it. Both are in-order committer work (InOrder): an import lands
// after every write queued before it and before any queued after it, as a
// write of its own id; a gather sees exactly the rows the writes queued
// before it left. Only immediate keys take part (the root package refuses
// a tier with deferred keys).

// Fetch is an import's source: Wait blocks (bounded by its own timeout)
// until the rows are fetched and returns, per block j and immediate key ki
// (Layout.Imm order), rows[j*nimm+ki] of BlockSize rows, or nil for a block
// that could not be fetched. Applied is called once the import is in the
// mirror (or was skipped after a write failure: failed true), with why
// each block was not written (nil: written).
type Fetch interface {
	Wait() (rows [][]byte, why []error)
	Applied(why []error, failed bool)
}

type importTask struct {
	p      *Path
	id     uint64
	blocks []int32
	f      Fetch
}

// PushImport queues the import of whole blocks' rows as a write with a new
// id, and returns the id. A hit planned after it (its read joins the queue
// up to here) finds the imported rows; a block the fetch could not deliver
// is marked stale (soa.Tenancy), so any read of it fails with ErrReassigned
// until a later write puts rows there: never the block's older rows.
// Engine goroutine.
func (p *Path) PushImport(blocks []int32, f Fetch) uint64 {
	t := &importTask{p: p, id: p.newID(), blocks: blocks, f: f}
	seq := p.q.PushLazy(Task{R: t}) // its fetch runs meanwhile; Materialize's wait for it wakes the committer
	p.logImport(seq, blocks)
	return t.id
}

func (t *importTask) RunInOrder(failed bool) {
	rows, why := t.f.Wait()
	if failed {
		t.f.Applied(why, true)
		return
	}
	p := t.p
	c := p.com
	bs := p.lay.BlockSize
	nimm := len(p.lay.Imm)
	sl := make([]int32, bs)
	neg := make([]int32, bs)
	for i := range neg {
		neg[i] = -1
	}
	t0 := time.Now()
	c.epoch.Add(1)
	for j, b := range t.blocks {
		for i := range sl {
			sl[i] = b*int32(bs) + int32(i)
		}
		if why[j] != nil {
			p.ten.Publish(sl, neg, t.id) // stale: no read finds older rows here
			continue
		}
		for ki, k := range p.lay.Imm {
			p.mirrors.Make(k).WriteSplit(c.workers, sl, rows[j*nimm+ki])
			p.ten.ClearAbsent(ki, sl)
			p.st.Bytes.Add(int64(len(rows[j*nimm+ki])))
		}
		p.ten.Publish(sl, sl, t.id)
		p.st.Rows.Add(int64(bs * nimm))
	}
	c.endScatter()
	p.st.CommitNanos.Add(int64(time.Since(t0)))
	t.f.Applied(why, false)
}

// Gather receives committed blocks' rows. Per block j whose rows are all
// committed (every slot written and none skipped for a newer write;
// required keys are never absent where a slot is written, optional ones
// read as zeros there), Rows(j, ki) gives where its BlockSize rows of
// immediate key ki (Layout.Imm order) go, nil to skip the block, and Block
// (j, true) follows once they are there; a block whose rows are not all
// committed gets Block(j, false) alone. Done follows the last block
// (failed: the path failed, nothing was read).
type Gather interface {
	Rows(j, ki int) []byte
	Block(j int, ok bool)
	Done(failed bool)
}

// GatherTask is a gather's queue entry (PushGather). A caller that
// recycles its Gather keeps one in it, so that a push allocates nothing;
// the task is the committer's until Gather.Done.
type GatherTask struct {
	p      *Path
	blocks []int32
	g      Gather
}

// PushGather queues a read of whole blocks' committed rows into g behind
// every write handed over so far, with t as its queue entry (t's fields
// are set here). Rows of optional keys a write omitted read as zeros.
// Engine goroutine.
func (p *Path) PushGather(t *GatherTask, blocks []int32, g Gather) {
	t.p, t.blocks, t.g = p, blocks, g
	p.q.PushLazy(Task{R: t}) // publishing waits for nobody
}

// RunInOrder implements InOrder (the committer).
func (t *GatherTask) RunInOrder(failed bool) {
	if failed {
		t.g.Done(true)
		return
	}
	p := t.p
	bs := p.lay.BlockSize
	p.gatherSl = grow(p.gatherSl, bs)
	sl := p.gatherSl
	for j, b := range t.blocks {
		for i := range sl {
			sl[i] = b*int32(bs) + int32(i)
		}
		ok := true
		for _, s := range sl {
			if !p.ten.Written(s) || p.ten.Stale(s) {
				ok = false
				break
			}
		}
		if !ok {
			t.g.Block(j, false)
			continue
		}
		skip := false
		for ki, k := range p.lay.Imm {
			buf := t.g.Rows(j, ki)
			if buf == nil {
				skip = true
				break
			}
			rb := p.lay.RowBytes[k]
			if m := p.mirrors.Get(k); m != nil {
				m.Read(buf[:bs*rb], sl)
			} else {
				clear(buf[:bs*rb]) // an optional key no write supplied
			}
			for i, s := range sl {
				if p.ten.Absent(ki, s) {
					clear(buf[i*rb : (i+1)*rb])
				}
			}
		}
		if !skip {
			t.g.Block(j, true)
		}
	}
	t.g.Done(false)
}
