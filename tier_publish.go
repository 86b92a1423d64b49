// Tier publishing: full blocks the engine computed go to the tier once
// their rows are committed, gathered by the committer, stored by the
// publishers; a full queue drops and counts.

package omnicache

import (
	"context"
	"sync/atomic"

	"github.com/omnicache/omnicache/writer"
)

// tierEng is the engine goroutine's tier state: the begun step's import and
// the full blocks not yet handed to the committer for publishing (their
// rows are parked in the decode buffer, or the step is only begun).
type tierEng struct {
	imp       *importJob
	pubBlocks []int32
	pubHashes []uint64
	pubMark   int // len(pubBlocks) before the begun step noted its own
	// gathers are the engine's publish gathers, oldest push first, each
	// reused once the committer is done with it (free). The committer runs
	// them in push order, so only the oldest is worth asking: one read of a
	// line the committer wrote per push, not one per gather. (A sync.Pool
	// here cost a cross-P steal per Save, Put on the committer and Get on
	// the engine: ~0.2 µs.)
	gathers []*publishGather
}

// notePublishes records the begun step's full blocks for publishing.
// Engine goroutine.
func (c *Cache) notePublishes(p *Plan) {
	if c.tl == nil {
		return
	}
	e := &c.te
	e.pubMark = len(e.pubBlocks)
	e.pubBlocks = append(e.pubBlocks, p.FullBlocks...)
	e.pubHashes = append(e.pubHashes, p.FullHashes...)
}

// pushPublishes queues the gather of the first n full blocks noted behind
// the writes handed over: called once their rows are handed to the
// committer (not parked in the decode buffer), before any later write can
// reuse the blocks. Between Begin and Save only the blocks noted before
// the begun step qualify (n = pubMark): the begun step's rows come with its
// Save. Engine goroutine.
func (c *Cache) pushPublishes(n int) {
	e := &c.te
	if c.tl == nil || n == 0 || c.path.Buffered() > 0 {
		return
	}
	// The gather takes the noted blocks: the engine's lists when it takes
	// them all (the lists swap, the engine keeping the gather's old memory),
	// else copies. Gathers are recycled once the committer is done with
	// them: a steady run allocates nothing here.
	var g *publishGather
	if n := len(e.gathers); n > 0 && e.gathers[0].free.Load() {
		g = e.gathers[0] // the oldest is done: it becomes the newest
		copy(e.gathers, e.gathers[1:])
		e.gathers[n-1] = g
	} else {
		g = &publishGather{tl: c.tl}
		e.gathers = append(e.gathers, g)
	}
	g.free.Store(false)
	if n == len(e.pubBlocks) {
		g.blocks, e.pubBlocks = e.pubBlocks, g.blocks[:0]
		g.hashes, e.pubHashes = e.pubHashes, g.hashes[:0]
	} else {
		g.blocks = append(g.blocks[:0], e.pubBlocks[:n]...)
		g.hashes = append(g.hashes[:0], e.pubHashes[:n]...)
		e.pubBlocks = e.pubBlocks[:copy(e.pubBlocks, e.pubBlocks[n:])]
		e.pubHashes = e.pubHashes[:copy(e.pubHashes, e.pubHashes[n:])]
	}
	c.path.PushGather(&g.task, g.blocks, g)
	e.pubMark = max(0, e.pubMark-n)
}

// publishable is how many noted full blocks may be gathered now: all of
// them, or between Begin and Save those noted before the begun step.
func (c *Cache) publishable() int {
	if c.eng.begun {
		return c.te.pubMark
	}
	return len(c.te.pubBlocks)
}

// publishGather reads committed full blocks straight into tier values
// (tier.NewValue), on the committer, and hands them to the publishers in
// batches of up to PublishBatch blocks: one send (and at most one wake of a
// parked publisher) per batch, not one per block.
type publishGather struct {
	task   writer.GatherTask // its queue entry: a push allocates nothing
	tl     *tierLink
	blocks []int32
	hashes []uint64
	cur    *pubBatch // the batch being filled (nil: none yet)
	free   atomic.Bool
}

// pubBatch is blocks' values, ready to store: block i's value of key k is
// vals[i*nkeys+k].
type pubBatch struct {
	hashes []uint64
	vals   [][]byte
}

// Rows implements writer.Gather: where block j's rows of key ki go, or nil:
// the tier stored the block within its recent window (not gathered,
// counted), or the publish queue holds PublishQueue blocks (dropped,
// counted). Only the committer adds to the queue, so a block
// given room here fits it.
func (g *publishGather) Rows(j, ki int) []byte {
	tl := g.tl
	if ki == 0 {
		if tl.t.StoredRecently(g.hashes[j]) {
			tl.recent.Add(1)
			return nil
		}
		n := 0
		if g.cur != nil {
			n = len(g.cur.hashes)
		}
		if tl.queued.Load()+int64(n) >= int64(tl.cfg.PublishQueue) {
			tl.dropped.Add(1)
			return nil
		}
		if g.cur == nil {
			select {
			case g.cur = <-tl.batchFree:
			default:
				g.cur = &pubBatch{}
			}
		}
		g.cur.vals = append(g.cur.vals, make([][]byte, tl.nkeys)...)
	}
	val, rows := tl.t.NewValue(g.hashes[j], ki)
	g.cur.vals[len(g.cur.hashes)*tl.nkeys+ki] = val
	return rows
}

// Block implements writer.Gather: block j's values join the batch, which
// goes to the publishers once it holds PublishBatch blocks.
func (g *publishGather) Block(j int, ok bool) {
	if !ok {
		g.tl.skipped.Add(1)
		return
	}
	g.cur.hashes = append(g.cur.hashes, g.hashes[j])
	if len(g.cur.hashes) >= g.tl.cfg.PublishBatch {
		g.send()
	}
}

// send hands the batch being filled to the publishers.
func (g *publishGather) send() {
	b, tl := g.cur, g.tl
	g.cur = nil
	if b == nil {
		return
	}
	n := int64(len(b.hashes))
	if n == 0 {
		tl.freeBatch(b)
		return
	}
	tl.pending.Add(n)
	tl.queued.Add(n)
	select {
	case tl.pubQ <- b: // never full: it holds at most PublishQueue batches of a block or more
	default:
		tl.queued.Add(-n)
		tl.pending.Add(-n)
		tl.dropped.Add(n)
		tl.t.Recycle(b.vals)
		tl.freeBatch(b)
	}
}

// freeBatch hands a batch (not its values) back for a later gather.
func (tl *tierLink) freeBatch(b *pubBatch) {
	clear(b.vals)
	b.hashes, b.vals = b.hashes[:0], b.vals[:0]
	select {
	case tl.batchFree <- b:
	default:
	}
}

// Done implements writer.Gather: the batch being filled goes to the
// publishers, and the committer is done with g, which the engine may
// reuse.
func (g *publishGather) Done(bool) {
	g.send()
	g.free.Store(true)
}

// publish runs on a publisher goroutine until the queue is closed: it
// stores the queued batches, PublishBatch blocks per pipelined store at
// most, taking as many queued batches as fit one store.
func (tl *tierLink) publish() {
	var hashes []uint64
	var vals [][]byte
	nk := tl.nkeys
	take := func(b *pubBatch) {
		tl.queued.Add(-int64(len(b.hashes)))
		hashes, vals = append(hashes, b.hashes...), append(vals, b.vals...)
		tl.freeBatch(b)
	}
	for b := range tl.pubQ {
		if tl.stopping.Load() {
			n := int64(len(b.hashes))
			tl.queued.Add(-n)
			tl.pending.Add(-n)
			tl.dropped.Add(n)
			tl.freeBatch(b)
			continue
		}
		hashes, vals = hashes[:0], vals[:0]
		take(b)
	fill:
		for len(hashes) < tl.cfg.PublishBatch {
			select {
			case b, ok := <-tl.pubQ:
				if !ok {
					break fill
				}
				take(b)
			default:
				break fill
			}
		}
		for i := 0; i < len(hashes); i += tl.cfg.PublishBatch {
			h := hashes[i:min(len(hashes), i+tl.cfg.PublishBatch)]
			v := vals[i*nk : (i+len(h))*nk]
			n, err := tl.t.PutValues(context.Background(), h, v)
			tl.bytesPub.Add(n)
			if err != nil {
				tl.pubErrs.Add(int64(len(h))) // the store failed in part or whole
			} else {
				tl.published.Add(int64(len(h)))
			}
			tl.pending.Add(-int64(len(h)))
		}
		clear(vals) // PutValues recycled them (or left them to the collector)
	}
}
