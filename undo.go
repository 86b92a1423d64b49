// The begun step's undo log: Abort, and a Save that fails, return the
// cache to the state before the step's Begin. Engine goroutine.

package omnicache

import (
	"fmt"
	"slices"

	"github.com/omnicache/omnicache/internal/reader"
	"github.com/omnicache/omnicache/internal/scratch"
	"github.com/omnicache/omnicache/soa"
)

// undoLog records what Begin changed, each request's state before its
// first change: a replace (its length, its delivered position, a pending
// hit cut, the unconsumed steps' rows left out), a preemption (its flags
// and length), a finish (the whole request: it is restored under its
// handle), a resume's hit, and the hit flags the step's hit plan cleared.
// Requests the Begin made live are in engine.fresh and are removed.
type undoLog struct {
	reqs   []reqSnap
	blocks []int32 // the snapshots' hit block ids
	// mark is, by handle, the Begin (gen) that snapshotted it, at is its
	// snapshot's index (-1: a request the Begin made live, none taken).
	mark   []uint64
	at     []int32
	gen    uint64
	floors int
	trims  []trimSnap
	pos    []posSnap
	cuts   []cutSnap
}

// reqSnap is one live request as it stood before Begin changed it.
type reqSnap struct {
	h            soa.Handle
	id           int64
	hit          int32
	blkOff, blkN int32
	flags        uint32
	aux          int64
	savedLen     int32
	preemptLen   int32
	dl           *delivery
	removed      bool // the Begin finished it: restored under h
}

// trimSnap is an unconsumed step's delivered end of request j before a
// replace cut it.
type trimSnap struct {
	rec     *reader.Step
	id      uint64
	j       int
	end     int32
	trimmed bool
}

// posSnap is a delivered position before a replace moved it back.
type posSnap struct {
	d   *delivery
	pos int32
}

// cutSnap is where a step being read (the Materialize into r, of step)
// would have delivered request d's rows up to (its asked request qi)
// before a replace cut it.
type cutSnap struct {
	r    *Result
	step uint64
	qi   int
	d    *delivery
	hi   int32
}

// startUndo empties the log for the Begin being applied.
func (c *Cache) startUndo() {
	u := &c.eng.undo
	u.gen++
	u.reqs, u.blocks, u.trims, u.pos = u.reqs[:0], u.blocks[:0], u.trims[:0], u.pos[:0]
	clear(u.cuts)
	u.cuts = u.cuts[:0]
	u.floors = c.eng.floors
}

// markHandle makes room for handle h in the log's marks and reports
// whether the Begin being applied marked it already.
func (u *undoLog) markHandle(h soa.Handle) bool {
	for int(h) >= len(u.mark) {
		u.mark = append(u.mark, 0)
		u.at = append(u.at, -1)
	}
	return u.mark[h] == u.gen
}

// snap records live request h before the Begin being applied changes it
// (once per Begin; nothing for a request the Begin made live) and returns
// its snapshot (nil for such a request).
func (c *Cache) snap(h soa.Handle) *reqSnap {
	e := &c.eng
	u := &e.undo
	if u.markHandle(h) {
		if u.at[h] < 0 {
			return nil
		}
		return &u.reqs[u.at[h]]
	}
	u.mark[h], u.at[h] = u.gen, int32(len(u.reqs))
	pos := e.requests.Pos(h)
	bl := e.requests.HitBlocks(h)
	s := reqSnap{h: h, id: e.requests.ID[pos], hit: e.requests.HitTokens[pos], blkOff: int32(len(u.blocks)), blkN: int32(len(bl)),
		flags: e.requests.Flags[pos], aux: e.requests.Aux[pos], dl: e.delivered[h]}
	if int(h) < len(e.savedLen) {
		s.savedLen = e.savedLen[h]
	}
	if int(h) < len(e.preemptLen) {
		s.preemptLen = e.preemptLen[h]
	}
	u.blocks = append(u.blocks, bl...)
	u.reqs = append(u.reqs, s)
	return &u.reqs[len(u.reqs)-1]
}

// markFresh notes that the Begin being applied made request h live: undone,
// it is removed, and no snapshot is taken of it.
func (c *Cache) markFresh(h soa.Handle) {
	u := &c.eng.undo
	if !u.markHandle(h) {
		u.mark[h], u.at[h] = u.gen, -1
	}
}

// snapTrim records unconsumed step rec's end of request j before a
// replace cuts it. Caller holds c.mu.
func (c *Cache) snapTrim(rec *reader.Step, j int) {
	s := trimSnap{rec: rec, id: rec.ID, j: j, trimmed: rec.Trimmed}
	if rec.Trimmed {
		s.end = rec.End[j]
	}
	c.eng.undo.trims = append(c.eng.undo.trims, s)
}

// Abort abandons the begun step when its forward failed after Begin: the
// cache returns to the state before that Begin, as if it had not been
// called: the requests it finished, preempted, resumed or replaced, its
// arrivals and their hits are as they were (begin the step again, or
// another: a request the engine dropped must be finished by a later plan).
// What Begin wrote out stays written: the decode buffer, and the deferred
// rows of the requests it finished, as a budget flush writes them early.
// A step saved before and consumed between that Begin and Abort was
// delivered under its replaces. ErrSequence without a begun step. Engine
// goroutine only.
func (c *Cache) Abort() error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	if !c.eng.begun {
		return fmt.Errorf("%w: Abort without a begun step", ErrSequence)
	}
	c.unbegin()
	return nil
}

// unbegin undoes the begun step (Abort, or its Save failed), newest change
// first: the requests the Begin made live are removed, and every request
// it changed gets back the state its snapshot holds.
func (c *Cache) unbegin() {
	e := &c.eng
	u := &e.undo
	if c.tl != nil {
		c.tl.Unbegin()
	}
	if e.hitRec != nil {
		c.rd.Cancel(e.hitRec) // a prefetch not started is skipped
		e.hitRec, e.hitsPlanned = nil, false
	}
	e.into, e.resultInto = scratch.Empty(e.into), scratch.Empty(e.resultInto)
	e.resultDev = scratch.Empty(e.resultDev)
	for i := len(e.added) - 1; i >= 0; i-- {
		if h := e.added[i]; e.requests.Pos(h) >= 0 {
			e.requests.Remove(h)
		}
	}
	e.added = e.added[:0]
	for i := len(u.reqs) - 1; i >= 0; i-- {
		s := &u.reqs[i]
		blocks := u.blocks[s.blkOff : s.blkOff+s.blkN]
		if s.removed {
			if !e.requests.AddAt(s.h, s.id, s.hit, blocks) {
				panic(fmt.Sprintf("omnicache: undo: request %d cannot return under handle %d", s.id, s.h))
			}
		} else if pos := e.requests.Pos(s.h); e.requests.HitTokens[pos] != s.hit || !slices.Equal(e.requests.HitBlocks(s.h), blocks) {
			e.requests.SetHit(s.h, s.hit, blocks)
		}
		pos := e.requests.Pos(s.h)
		e.requests.Flags[pos], e.requests.Aux[pos] = s.flags, s.aux
		e.savedLen = scratch.Extend(e.savedLen, int(s.h)+1)
		e.savedLen[s.h] = s.savedLen
		if int(s.h) < len(e.preemptLen) {
			e.preemptLen[s.h] = s.preemptLen
		}
		e.delivered[s.h] = s.dl
	}
	e.floors = u.floors
	if len(u.pos) > 0 || len(u.trims) > 0 || len(u.cuts) > 0 {
		c.mu.Lock()
		for i := len(u.cuts) - 1; i >= 0; i-- {
			s := &u.cuts[i]
			if slices.Contains(c.reading, s.r) && s.r.dlStep == s.step {
				s.r.dlHi[s.qi] = max(s.r.dlHi[s.qi], s.hi) // still being read: delivers it whole if served
			} else if slices.ContainsFunc(c.cut, func(x cutRead) bool { return x.d == s.d && x.step == s.step && x.served }) {
				s.d.pos = max(s.d.pos, s.hi) // served since, its delivery cut: it counts as before the cut
			}
		}
		clear(c.cut)
		c.cut = c.cut[:0]
		for i := len(u.pos) - 1; i >= 0; i-- {
			// A Materialize since may have moved it on: never back.
			u.pos[i].d.pos = max(u.pos[i].d.pos, u.pos[i].pos)
		}
		for i := len(u.trims) - 1; i >= 0; i-- {
			t := &u.trims[i]
			if !slices.ContainsFunc(c.steps, func(sv saved) bool { return sv.rec == t.rec && sv.rec.ID == t.id }) {
				continue // consumed since: delivered as it was cut
			}
			if t.trimmed {
				t.rec.End[t.j] = t.end
			} else {
				t.rec.Trimmed = false
			}
		}
		c.mu.Unlock()
	}
	u.reqs, u.blocks, u.trims, u.pos = u.reqs[:0], u.blocks[:0], u.trims[:0], u.pos[:0]
	clear(u.cuts)
	u.cuts = u.cuts[:0]
	u.gen++ // the marks of this Begin no longer hold
	e.prevIDs = e.prevIDs[:0]
	e.prevHandles = e.prevHandles[:0] // an empty batch next is "the same" as none: no stale handles
	e.begun = false
	c.live.Store(int64(e.requests.Len()))
}
