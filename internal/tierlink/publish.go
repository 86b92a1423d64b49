// Tier publishing: full blocks the engine computed go to the tier once
// their rows are committed, gathered by the committer, stored by the
// publishers; a full queue drops and counts.

package tierlink

import (
	"context"

	"github.com/omnicache/omnicache/internal/writer"
)

// engine is the engine goroutine's tier state: the begun step's import and
// the full blocks not yet handed to the committer for publishing (their
// rows are parked in the decode buffer, or the step is only begun).
type engine struct {
	begun     bool // a step is begun (Begin .. Saved or Unbegin)
	imp       *Import
	pubBlocks []int32
	pubHashes []uint64
	pubMark   int // len(pubBlocks) before the begun step noted its own
}

// Begin notes the begun step's full blocks for publishing. Engine
// goroutine.
func (l *Link) Begin(fullBlocks []int32, fullHashes []uint64) {
	e := &l.eng
	e.begun = true
	e.pubMark = len(e.pubBlocks)
	e.pubBlocks = append(e.pubBlocks, fullBlocks...)
	e.pubHashes = append(e.pubHashes, fullHashes...)
	if l.bar != nil {
		l.bar.note(fullHashes)
	}
}

// Unbegin drops the begun step's import and full blocks (its queued
// import still writes the rows it fetched: they are the blocks' rows).
// Engine goroutine.
func (l *Link) Unbegin() {
	e := &l.eng
	e.begun = false
	e.imp = nil
	if e.pubMark < len(e.pubBlocks) {
		if l.bar != nil {
			l.bar.unnote(e.pubHashes[e.pubMark:])
		}
		e.pubBlocks, e.pubHashes = e.pubBlocks[:e.pubMark], e.pubHashes[:e.pubMark]
	}
}

// Rider is the link's writer.Rider (Config.Rider of the write path).
func (l *Link) Rider() writer.Rider { return rider{l} }

// Gather returns the link's writer.Gather (Config.Gather of the write
// path: the committer's only).
func (l *Link) Gather() writer.Gather { return &publishGather{tl: l} }

// rider is the link's writer.Rider: the noted full blocks ride on the
// write that completes their rows, and the committer gathers them once it
// landed, before any later write can reuse the blocks (see writer.Rider).
type rider struct{ l *Link }

// Ride implements writer.Rider: every noted block when w carries the step
// being saved (own) or no step is begun, else (a flush of earlier steps
// between Begin and Save) those noted before the begun step: the begun
// step's rows come with its own write. Engine goroutine.
func (r rider) Ride(blocks []int32, hashes []uint64, own bool) ([]int32, []uint64) {
	e := &r.l.eng
	n := len(e.pubBlocks)
	if !own && e.begun {
		n = e.pubMark
	}
	switch {
	case n == 0:
		return blocks, hashes
	case n == len(e.pubBlocks) && len(blocks) == 0:
		// All of them, the usual case: the lists swap, the engine keeping
		// the write's old ones (the committer copies a write's lists out
		// before the write can be recycled).
		blocks, e.pubBlocks = e.pubBlocks, blocks
		hashes, e.pubHashes = e.pubHashes, hashes
	default:
		blocks = append(blocks, e.pubBlocks[:n]...)
		hashes = append(hashes, e.pubHashes[:n]...)
		e.pubBlocks = e.pubBlocks[:copy(e.pubBlocks, e.pubBlocks[n:])]
		e.pubHashes = e.pubHashes[:copy(e.pubHashes, e.pubHashes[n:])]
	}
	e.pubMark = max(0, e.pubMark-n)
	return blocks, hashes
}

// publishGather is the link's writer.Gather, the committer's only: it
// reads committed full blocks straight into tier values (tier.NewValue)
// and hands them to the publishers in batches of up to PublishBatch
// blocks: one send (and at most one wake of a parked publisher) per batch,
// not one per block.
type publishGather struct {
	tl  *Link
	cur *pubBatch // the batch being filled (nil: none yet)
}

// pubBatch is blocks' values, ready to store: block i's value of key k is
// vals[i*nkeys+k].
type pubBatch struct {
	hashes []uint64
	vals   [][]byte
	epoch  uint64 // Link.epoch when it was sent: older ones are dropped (Reset)
}

// Rows implements writer.Gather: where the rows of key ki of the block of
// hash h go, or nil: the tier stored the block within its recent window
// (not gathered, counted), the block was seen fewer than AdmitAfter times
// (counted), or the publish queue holds PublishQueue blocks
// (dropped, counted). Only the committer adds to the queue, so a block
// given room here fits it.
func (g *publishGather) Rows(h uint64, ki int) []byte {
	tl := g.tl
	if ki == 0 {
		if tl.t.StoredRecently(h) {
			tl.recent.Add(1)
			tl.resolve(h, nil)
			return nil
		}
		if tl.cfg.AdmitAfter > 1 && tl.t.Sightings().See(h) < tl.cfg.AdmitAfter {
			tl.unadmitted.Add(1)
			tl.resolve(h, ErrPublishUnadmitted)
			return nil
		}
		n := 0
		if g.cur != nil {
			n = len(g.cur.hashes)
		}
		if tl.queued.Load()+int64(n) >= int64(tl.cfg.PublishQueue) {
			tl.dropped.Add(1)
			tl.resolve(h, ErrPublishDropped)
			return nil
		}
		if g.cur == nil {
			select {
			case g.cur = <-tl.batchFree:
			default:
				g.cur = &pubBatch{}
			}
		}
		g.cur.vals = append(g.cur.vals, make([][]byte, tl.cfg.NKeys)...)
	}
	val, rows := tl.t.NewValue(h, ki)
	g.cur.vals[len(g.cur.hashes)*tl.cfg.NKeys+ki] = val
	return rows
}

// Block implements writer.Gather: the block's values join the batch, which
// goes to the publishers once it holds PublishBatch blocks.
func (g *publishGather) Block(h uint64, ok bool) {
	if !ok {
		g.tl.skipped.Add(1)
		g.tl.resolve(h, ErrPublishSkipped)
		return
	}
	g.cur.hashes = append(g.cur.hashes, h)
	if len(g.cur.hashes) >= g.tl.cfg.PublishBatch {
		g.send()
	}
}

// Done implements writer.Gather: the batch being filled goes to the
// publishers.
func (g *publishGather) Done(bool) { g.send() }

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
	b.epoch = tl.epoch.Load()
	tl.pending.Add(n)
	tl.queued.Add(n)
	select {
	case tl.pubQ <- b: // never full: it holds at most PublishQueue batches of a block or more
	default:
		tl.queued.Add(-n)
		tl.pending.Add(-n)
		tl.dropped.Add(n)
		if tl.bar != nil {
			tl.bar.resolve(b.hashes, ErrPublishDropped, nil)
		}
		tl.t.Recycle(b.vals)
		tl.freeBatch(b)
	}
}

// resolve records block h's outcome for the barrier (if any).
func (tl *Link) resolve(h uint64, err error) {
	if tl.bar != nil {
		tl.bar.resolve([]uint64{h}, err, nil)
	}
}

// freeBatch hands a batch (not its values) back for a later gather.
func (tl *Link) freeBatch(b *pubBatch) {
	clear(b.vals)
	b.hashes, b.vals = b.hashes[:0], b.vals[:0]
	select {
	case tl.batchFree <- b:
	default:
	}
}

// publish runs on a publisher goroutine until the queue is closed: it
// stores the queued batches, PublishBatch blocks per pipelined store at
// most, taking as many queued batches as fit one store.
func (tl *Link) publish() {
	var hashes []uint64
	var vals [][]byte
	nk := tl.cfg.NKeys
	// drop discards a batch: the cache is closing, or it was gathered
	// before a Reset.
	drop := func(b *pubBatch) {
		n := int64(len(b.hashes))
		tl.queued.Add(-n)
		tl.pending.Add(-n)
		tl.dropped.Add(n)
		if tl.bar != nil {
			tl.bar.resolve(b.hashes, ErrPublishAbandoned, nil)
		}
		tl.t.Recycle(b.vals)
		tl.freeBatch(b)
	}
	take := func(b *pubBatch) {
		if b.epoch != tl.epoch.Load() {
			drop(b)
			return
		}
		tl.queued.Add(-int64(len(b.hashes)))
		hashes, vals = append(hashes, b.hashes...), append(vals, b.vals...)
		tl.freeBatch(b)
	}
	for b := range tl.pubQ {
		if tl.stopping.Load() {
			drop(b)
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
			if tl.bar != nil {
				tl.bar.resolve(h, err, tl.observeLag)
			}
			tl.pending.Add(-int64(len(h)))
		}
		clear(vals) // PutValues recycled them (or left them to the collector)
	}
}
