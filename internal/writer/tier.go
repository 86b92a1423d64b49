package writer

import (
	"time"

	"github.com/omnicache/omnicache/internal/scratch"
)

// Rows that cross the cache's boundary as whole blocks (a shared tier):
// imports write fetched rows into the mirror, gathers read committed rows
// out of it. Both run on the committer in queue order: an import is
// in-order work (InOrder) that lands after every write queued before it
// and before any queued after it, as a write of its own id; a gather rides
// on the write that completes its blocks (Rider) and sees exactly the rows
// the writes up to that one left. Only immediate keys take part (the root
// package refuses a tier with deferred keys).

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
	c.prog.BeginScatter()
	for j, b := range t.blocks {
		for i := range sl {
			sl[i] = b*int32(bs) + int32(i)
		}
		if why[j] == nil {
			why[j] = p.prepare(sl) // a chunk the OS refused: the block is not imported
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
	c.prog.EndScatter()
	p.st.CommitNanos.Add(int64(time.Since(t0)))
	t.f.Applied(why, false)
}

// prepare makes the mirror memory of slots for every immediate key
// (mirror.Mirror.Prepare): a chunk the OS refuses is an error rather than
// a panic in the scatter. Committer goroutine.
func (p *Path) prepare(sl []int32) error {
	for _, k := range p.lay.Imm {
		if err := p.mirrors.Make(k).Prepare(sl); err != nil {
			return err
		}
	}
	return nil
}

// Gather receives committed blocks' rows, on the committer (Config.Gather).
// Full blocks ride on the writes that complete their rows (Rider): once
// such a write landed, per block whose rows are all committed (every slot
// written and none skipped for a newer write; required keys are never
// absent where a slot is written, optional ones read as zeros there),
// Rows(key, ki) gives where its BlockSize rows of immediate key ki
// (Layout.Imm order) go, nil to skip the block, and Block(key, true)
// follows once they are there; a block whose rows are not all committed
// gets Block(key, false) alone. Done follows the write's last block
// (failed: the path failed, nothing was read).
type Gather interface {
	Rows(key uint64, ki int) []byte
	Block(key uint64, ok bool)
	Done(failed bool)
}

// Rider names the full blocks that ride on a write handed over (engine
// goroutine, Config.Rider): Ride appends to blocks and keys the blocks
// whose rows are all handed over once this write is, with their keys (the
// engine's chained block hashes), and returns them. own says the write
// carries the rows of the step being saved (its own write, or a decode
// buffer flushed because that step filled it); any other write (a flush
// of earlier steps) completes only blocks noted before that step. A write
// that leaves steps parked in the decode buffer carries none.
//
// The blocks are gathered right after the write lands, before any write
// queued behind it: the committer's scan of newer writes stops at such a
// write (see Committer.scanQueued), so no later write (one that reuses a
// block) makes it skip rows the gather reads. Riding on the write costs
// the engine goroutine no queue entry, no lock and no line of its own (a
// separate gather task per Save spent most of its push reading the
// gather's free flag, a line the committer had just written; BenchmarkTierStep
// times the engine goroutine's side).
type Rider interface {
	Ride(blocks []int32, keys []uint64, own bool) ([]int32, []uint64)
}

// gather reads the committed rows of blocks (keys[j] naming block j) into
// the gather (CommitterConfig.Gather), or reports failed. Committer.
func (c *Committer) gather(blocks []int32, keys []uint64, failed bool) {
	g := c.cfg.Gather
	if failed {
		// The write failed: its rows never landed, so no block is
		// published (each one counted, and told to a publish barrier).
		for _, key := range keys {
			g.Block(key, false)
		}
		g.Done(true)
		return
	}
	ten := c.cfg.Tenancy
	bs := c.cfg.BlockSize
	c.gatherSl = scratch.Grow(c.gatherSl, bs)
	sl := c.gatherSl
	for j, b := range blocks {
		key := keys[j]
		for i := range sl {
			sl[i] = b*int32(bs) + int32(i)
		}
		ok := true
		for _, s := range sl {
			if !ten.Written(s) || ten.Stale(s) {
				ok = false
				break
			}
		}
		if !ok {
			g.Block(key, false)
			continue
		}
		skip := false
		for ki, k := range c.cfg.Imm {
			buf := g.Rows(key, ki)
			if buf == nil {
				skip = true
				break
			}
			rb := c.cfg.RowBytes[k]
			if m := c.cfg.Mirrors.Get(k); m != nil {
				m.Read(buf[:bs*rb], sl)
			} else {
				clear(buf[:bs*rb]) // an optional key no write supplied
			}
			for i, s := range sl {
				if ten.Absent(ki, s) {
					clear(buf[i*rb : (i+1)*rb])
				}
			}
		}
		if !skip {
			g.Block(key, true)
		}
	}
	g.Done(false)
}
