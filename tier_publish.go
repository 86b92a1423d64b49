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
	// The gather takes copies (its own, recycled once the committer is done
	// with it): the engine's lists keep their memory, and a steady run
	// allocates nothing here.
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
	g.blocks = append(g.blocks[:0], e.pubBlocks[:n]...)
	g.hashes = append(g.hashes[:0], e.pubHashes[:n]...)
	c.path.PushGather(&g.task, g.blocks, g)
	e.pubBlocks = e.pubBlocks[:copy(e.pubBlocks, e.pubBlocks[n:])]
	e.pubHashes = e.pubHashes[:copy(e.pubHashes, e.pubHashes[n:])]
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
// (tier.NewValue), on the committer.
type publishGather struct {
	task   writer.GatherTask // its queue entry: a push allocates nothing
	tl     *tierLink
	blocks []int32
	hashes []uint64
	vals   [][]byte // the block being read, per key
	free   atomic.Bool
}

// pubBlock is one block's values, ready to store.
type pubBlock struct {
	hash uint64
	vals [][]byte
}

// Rows implements writer.Gather: where block j's rows of key ki go, or nil
// (the block is dropped and counted) when the publish queue is full. Only
// the committer sends to the queue, so a block given room here fits it.
func (g *publishGather) Rows(j, ki int) []byte {
	if ki == 0 {
		if len(g.tl.pubQ) == cap(g.tl.pubQ) {
			g.tl.dropped.Add(1)
			return nil
		}
		select {
		case g.vals = <-g.tl.valsFree:
		default:
			g.vals = make([][]byte, g.tl.nkeys)
		}
	}
	val, rows := g.tl.t.NewValue(g.hashes[j], ki)
	g.vals[ki] = val
	return rows
}

// Block implements writer.Gather: block j's values go to the publish
// queue.
func (g *publishGather) Block(j int, ok bool) {
	if !ok {
		g.tl.skipped.Add(1)
		return
	}
	g.tl.pending.Add(1)
	select {
	case g.tl.pubQ <- pubBlock{hash: g.hashes[j], vals: g.vals}:
	default:
		g.tl.pending.Add(-1)
		g.tl.dropped.Add(1)
		g.tl.t.Recycle(g.vals)
		g.tl.freeVals(g.vals)
	}
	g.vals = nil
}

// freeVals hands a block's list of values (not the values) back for the
// next block's gather.
func (tl *tierLink) freeVals(v [][]byte) {
	clear(v)
	select {
	case tl.valsFree <- v:
	default:
	}
}

// Done implements writer.Gather: the committer is done with g, which the
// engine may reuse.
func (g *publishGather) Done(bool) {
	g.vals = nil
	g.free.Store(true)
}

// publish runs on a publisher goroutine until the queue is closed: it
// stores up to PublishBatch queued blocks per pipelined batch.
func (tl *tierLink) publish() {
	var hashes []uint64
	var vals [][]byte
	for b := range tl.pubQ {
		if tl.stopping.Load() {
			tl.pending.Add(-1)
			tl.dropped.Add(1)
			continue
		}
		hashes, vals = append(hashes[:0], b.hash), append(vals[:0], b.vals...)
		tl.freeVals(b.vals)
	fill:
		for len(hashes) < tl.cfg.PublishBatch {
			select {
			case b, ok := <-tl.pubQ:
				if !ok {
					break fill
				}
				hashes, vals = append(hashes, b.hash), append(vals, b.vals...)
				tl.freeVals(b.vals)
			default:
				break fill
			}
		}
		n, err := tl.t.PutValues(context.Background(), hashes, vals)
		tl.bytesPub.Add(n)
		if err != nil {
			tl.pubErrs.Add(int64(len(hashes))) // the batch failed in part or whole
		} else {
			tl.published.Add(int64(len(hashes)))
		}
		tl.pending.Add(-int64(len(hashes)))
		clear(vals) // PutValues recycled them (or left them to the collector)
	}
}
