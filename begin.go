package omnicache

import (
	"cmp"
	"fmt"
	"slices"

	"unsafe"

	"github.com/omnicache/omnicache/internal/reader"
	"github.com/omnicache/omnicache/slots"
	"github.com/omnicache/omnicache/soa"
)

// request flags (soa.Requests.Flags)
const (
	flagHitPending = 1
	// flagFloor: the request was preempted and has not yet been saved
	// past the length it had then (preLen): its steps may recompute rows
	// it already delivered, which Materialize leaves out.
	flagFloor = 2
)

// engine is the engine goroutine's view of the step: the live request
// table and the begun step. Only Begin, Save, Sync and Close touch it.
type engine struct {
	reqs     *soa.Requests
	begun    bool
	nextStep StepID

	// the begun step
	ids   []int64
	h     []soa.Handle
	count []int32
	start []int32
	same  bool // the batch is the previous step's

	// lens are, by handle, the positions each request's saved steps cover
	// (what a replace may cut back); lenPending decode steps over the
	// batch lenH are not in them yet (see noteSaved).
	lens       []int32
	lenH       []soa.Handle
	lenPending int32

	// dlp is, by handle, the live request's delivery state (delivery.go);
	// batchD the begun batch's, an array shared by the records of the
	// steps over this batch (replaced, never reused, when the batch
	// changes). preLen is, by handle, the length a preempted request had
	// (flagFloor); nFloor counts those requests.
	dlp    []*dlState
	batchD []any
	preLen []int32
	nFloor int
	slots  []int32
	ntok   int
	pure   bool
	hitReq []int32      // positions in the batch of requests whose hit prefix is served this step
	fresh  []soa.Handle // requests this Begin added (removed again if the step fails)

	prevIDs   []int64
	prevH     []soa.Handle // handles of prevIDs (h aliases it while the ids stay the same)
	hbuf      []soa.Handle // spare for the next change of ids
	stamp     []uint64     // per handle: last Begin that marked it (duplicate check)
	stampGen  uint64
	unknown   []int64        // scratch: batch ids not live (duplicate check)
	chk       []soa.Handle   // scratch: checkIDs' handle per batch id (NoHandle: not live then)
	arrived   []int64        // scratch: arrival ids (duplicate check)
	starts    []idStart      // scratch: fresh batch requests by id
	hits      []reader.Hit   // the begun step's hits (planned at Begin)
	rec       *reader.Step   // the begun step's record when made at Begin (a hit step, prefetch on)
	recStash  []*reader.Step // recycled records, taken from Cache.recFreeMu or recFree a list at a time (newRec)
	planned   bool           // rec's hits were planned (and their read queued) at Begin
	blockMark []uint32       // scratch: per block, the markGen of the last hitsOverlapStep
	markGen   uint32
	// blocks are the blocks the begun step writes, one per block a request
	// writes in, when the step is long (validate reads them off the block
	// table); nil for a short step (its slots are few).
	blocks []int32
	blkBuf []int32 // blocks' memory
}

type idStart struct {
	id    int64
	start int32
}

func (e *engine) mark(h soa.Handle, gen uint64) (was uint64) {
	for int(h) >= len(e.stamp) {
		e.stamp = append(e.stamp, 0)
	}
	was, e.stamp[h] = e.stamp[h], gen
	return was
}

// Begin registers a step plan: it validates the whole plan, then writes
// out the decode buffer unless this step continues it, processes finished
// requests, registers arrivals and maps the batch to slots. A plan that
// fails validation (a nil plan is ErrPlan) changes nothing. Engine
// goroutine only; the plan is borrowed for the call.
func (c *Cache) Begin(p *Plan) error {
	if err := c.check(); err != nil {
		return err
	}
	if p == nil {
		return fmt.Errorf("%w: nil plan", ErrPlan)
	}
	e := &c.eng
	if e.begun {
		return fmt.Errorf("%w: Begin twice without Save (the begun step stays begun)", ErrSequence)
	}
	ntok, pure, same, err := c.validate(p)
	if err != nil {
		return err
	}
	if err := c.checkTierPlan(p); err != nil {
		return err
	}
	if err := c.checkReplaced(p); err != nil {
		return err
	}
	// Apply. Validation and the request table are the engine's own memory;
	// a Begin that may write out the decode buffer, finish requests or plan
	// hits reaches the write path, and registers as a call in flight first
	// (Close frees nothing under it). Only a decode step over the previous
	// step's batch (pure and same: it plans no hit and cannot flush) stays
	// off the gate's atomics: it reads nothing Close releases.
	if !(pure && same) || len(p.Finished) > 0 || len(p.HitBlocks) > 0 || len(p.Replaced) > 0 {
		if err := c.enter(); err != nil {
			return err
		}
		defer c.leave()
		if err := c.check(); err != nil {
			return err // closed or failed since the check above: nothing applied
		}
		c.flushLens() // before a request of the counted batch can leave
	}
	// Anything but a buffered decode step writes the buffer first, before
	// hits are registered, finishes escalate or blocks are reused.
	if !pure && c.path.Buffered() > 0 {
		if err := c.path.FlushBuffer(); err != nil {
			return err
		}
	}
	c.applyReplaced(p) // before finishes: a replaced request may finish too
	c.applyPreempted(p)
	for _, id := range p.Finished {
		if h, ok := e.reqs.Lookup(id); ok {
			c.path.Finish(h)
			c.dropFloor(h)
			e.reqs.Remove(h)
			same = false
		}
	}
	c.path.FlushFinished()
	e.fresh = e.fresh[:0]
	used, tierUsed := 0, 0
	for i, id := range p.Arrivals {
		ht := p.HitTokens[i]
		nb := int(ht) / c.cfg.BlockSize
		blocks := p.HitBlocks[used : used+nb]
		used += nb
		h, fresh := e.reqs.Add(id, ht, blocks)
		rehit := !fresh && ht > 0 && slices.Contains(p.Resumed, id)
		if rehit {
			// A preempted request resuming with a hit: the hit is served as
			// an arrival's (delivery leaves out what it already had).
			e.reqs.SetHit(h, ht, blocks)
		}
		if fresh || rehit {
			same = false
			if fresh {
				e.fresh = append(e.fresh, h)
				c.freshReq(h)
			}
			if ht > 0 {
				e.reqs.Flags[e.reqs.Pos(h)] |= flagHitPending
			}
			if len(p.TierBlocks) > 0 && p.TierBlocks[i] > 0 {
				n := int(p.TierBlocks[i])
				c.tl.NoteImport(p.Arrivals[i], blocks, p.TierHashes[tierUsed:tierUsed+n], tierLeft(p.TierBlocks[i:]), len(p.Arrivals)-i)
			}
		}
		if len(p.TierBlocks) > 0 {
			tierUsed += int(p.TierBlocks[i])
		}
	}
	if c.tl != nil {
		c.tl.StartImport(c.path) // ahead of the hit read planned below
	}
	e.ids = append(e.ids[:0], p.IDs...)
	e.count = append(e.count[:0], p.Count...)
	e.start = append(e.start[:0], p.Start...)
	e.hitReq = e.hitReq[:0]
	if same {
		e.h = e.prevH // read-only until the ids change
	} else {
		e.h = e.hbuf[:0]
		// checkIDs ran (the ids changed) and looked every id up: a request
		// live then, and not finished, keeps its handle (removals do not
		// move others); only the rest are looked up again.
		for i, id := range p.IDs {
			h := e.chk[i]
			if h == soa.NoHandle {
				var ok bool
				if h, ok = e.reqs.Lookup(id); !ok {
					h, _ = e.reqs.Add(id, 0, nil)
					e.fresh = append(e.fresh, h)
					c.freshReq(h)
				}
			}
			e.h = append(e.h, h)
		}
		for i, h := range e.h {
			if e.reqs.Flags[e.reqs.Pos(h)]&flagHitPending != 0 {
				e.hitReq = append(e.hitReq, int32(i))
			}
		}
		c.newBatch()
		e.prevIDs = append(e.prevIDs[:0], p.IDs...)
		e.hbuf, e.prevH = e.prevH, e.h
		c.live.Store(int64(e.reqs.Len())) // the table changes only with the ids
	}
	e.ntok = ntok
	e.pure = pure
	e.same = same
	e.begun = true
	e.hits = e.hits[:0]
	if c.tl != nil {
		c.tl.Begin(p.FullBlocks, p.FullHashes)
	}
	if len(e.hitReq) > 0 {
		// Plan the hits now, behind the rows handed over so far (the buffer
		// was flushed above): with prefetch their rows move while the
		// engine runs its forward.
		for _, i := range e.hitReq {
			h := e.h[i]
			pos := e.reqs.Pos(h)
			e.reqs.Flags[pos] &^= flagHitPending
			e.hits = append(e.hits, reader.Hit{Index: i, Tokens: e.reqs.HitTokens[pos], Blocks: e.reqs.HitBlocks(h)})
		}
		// Prefetched steps are planned now. A step that reads its own rows
		// (a hit on blocks it writes) is planned at Save, behind its own
		// writes, and its prefetch queued there; one the read-ahead budget
		// cannot hold is planned at Save as without prefetch (its plan's
		// pins then come after Save's reservation).
		if !c.cfg.DisablePrefetch {
			e.rec = c.newRec()
			if c.rd.Charge(e.rec, e.hits) && !c.hitsOverlapStep() {
				c.rd.Plan(e.rec, e.hits)
				e.planned = true
			}
		}
	}
	return nil
}

// hitsOverlapStep reports whether a hit block of the begun step is also
// written by the step itself: such a hit reads the step's own rows, so it
// is planned at Save, once they were handed over.
func (c *Cache) hitsOverlapStep() bool {
	e := &c.eng
	bs := c.cfg.BlockSize
	if len(e.blockMark) < c.cfg.NumBlocks {
		e.blockMark = make([]uint32, c.cfg.NumBlocks)
	}
	e.markGen++
	if e.markGen == 0 { // wrapped: start the marks afresh
		clear(e.blockMark)
		e.markGen = 1
	}
	for _, h := range e.hits {
		for _, b := range h.Blocks {
			e.blockMark[b] = e.markGen
		}
	}
	if e.blocks != nil { // a long step: its blocks, read off the block table
		for _, b := range e.blocks {
			if e.blockMark[b] == e.markGen {
				return true
			}
		}
		return false
	}
	for _, s := range e.slots {
		if e.blockMark[int(s)/bs] == e.markGen {
			return true
		}
	}
	return false
}

// validate checks the whole plan before Begin applies any of it, and maps
// the batch to slots (into the engine's scratch). same reports that the
// batch is the previous step's (its handles can be reused).
func (c *Cache) validate(p *Plan) (ntok int, pure, same bool, err error) {
	e := &c.eng
	bs := c.cfg.BlockSize
	n := len(p.IDs)
	if len(p.Rows) != n || len(p.Start) != n || len(p.Count) != n {
		return 0, false, false, fmt.Errorf("%w: %d ids, %d rows, %d starts, %d counts", ErrPlan, n, len(p.Rows), len(p.Start), len(p.Count))
	}
	if len(p.HitTokens) != len(p.Arrivals) {
		return 0, false, false, fmt.Errorf("%w: %d arrivals, %d hit lengths", ErrPlan, len(p.Arrivals), len(p.HitTokens))
	}
	used := 0
	for i, ht := range p.HitTokens {
		if ht < 0 {
			return 0, false, false, fmt.Errorf("%w: request %d: negative hit length %d", ErrPlan, p.Arrivals[i], ht)
		}
		if int(ht)%bs != 0 {
			return 0, false, false, fmt.Errorf("%w: request %d: %d hit tokens, block size %d", ErrUnalignedHit, p.Arrivals[i], ht, bs)
		}
		nb := int(ht) / bs
		if used+nb > len(p.HitBlocks) {
			return 0, false, false, fmt.Errorf("%w: request %d hits %d tokens but %d block ids remain", ErrHitBlocks, p.Arrivals[i], ht, len(p.HitBlocks)-used)
		}
		for _, b := range p.HitBlocks[used : used+nb] {
			if b < 0 || int(b) >= c.cfg.NumBlocks {
				return 0, false, false, fmt.Errorf("%w: request %d: hit block %d outside [0,%d)", ErrPlan, p.Arrivals[i], b, c.cfg.NumBlocks)
			}
		}
		used += nb
	}
	if used != len(p.HitBlocks) {
		return 0, false, false, fmt.Errorf("%w: %d block ids left over after the arrivals' hits", ErrHitBlocks, len(p.HitBlocks)-used)
	}
	pure = !c.cfg.DisableDecodeBuffer && n > 0 && len(p.Arrivals) == 0 && len(p.Finished) == 0 &&
		len(p.Preempted) == 0 && len(p.Resumed) == 0 && len(p.Replaced) == 0
	// slots.Map checks the whole batch (negative starts and counts, rows,
	// columns, the total against len(dst)) before it writes, so the plan is
	// walked once here; the error path finds the culprit. The scratch holds
	// a full page (StagingCapacityTokens): nothing is sized from the plan.
	e.slots = grow(e.slots, c.cfg.StagingCapacityTokens)
	ntok, err = slots.Map(e.slots, slots.Batch{Rows: p.Rows, Start: p.Start, Count: p.Count, Table: p.Table, Stride: p.Stride}, bs)
	if err != nil {
		return 0, false, false, c.mapError(p, err)
	}
	if pure {
		pure = allOne(p.Count)
	}
	e.slots = e.slots[:ntok]
	// Block ids beyond NumBlocks: one branch-free pass (a value outside
	// [0, n) makes v or n-1-v negative), then find it for the error. A
	// step of a few tokens a request checks its slots; a longer one the
	// table entries its requests use (Map checked rows and columns), one
	// per block instead of one per token.
	nslots := c.cfg.NumBlocks * bs
	var bad bool
	last := int32(nslots - 1)
	e.blocks = nil
	if ntok <= 4*n {
		bad = outside(e.slots, last)
	} else {
		e.blocks = e.blkBuf[:0]
		lastB, bs32 := int32(c.cfg.NumBlocks-1), int32(bs)
		for i, cnt := range p.Count {
			if cnt == 0 {
				continue
			}
			row := p.Table[int(p.Rows[i])*p.Stride:]
			bl := row[p.Start[i]/bs32 : (p.Start[i]+cnt-1)/bs32+1]
			if outside(bl, lastB) {
				bad = true
				break
			}
			e.blocks = append(e.blocks, bl...) // the write path's join log takes them (writer.Step.Blocks)
		}
		e.blkBuf = e.blocks[:0]
	}
	if bad {
		for _, s := range e.slots {
			if s < 0 || s > last {
				return 0, false, false, fmt.Errorf("%w: slot %d outside [0,%d): block table names a block beyond NumBlocks", ErrPlan, s, nslots)
			}
		}
	}
	same = equalIDs(p.IDs, e.prevIDs)
	// A non-empty buffer holds the previous step (any other step flushes
	// it), so the same ids continue it.
	if pure && !same && !c.path.BufferContinues(p.IDs) {
		pure = false
	}
	if same && len(p.Arrivals) == 0 && len(p.Finished) == 0 {
		return ntok, pure, true, nil // the previous step's ids, already checked
	}
	return ntok, pure, same, c.checkIDs(p)
}

// outside reports whether a value of xs lies outside [0, last]: x or
// last-x is negative. Branch-free, four accumulators (a single one chains
// every OR through one register).
func outside(xs []int32, last int32) bool {
	var b0, b1, b2, b3 int32
	for len(xs) >= 4 {
		x := xs[:4:4]
		b0 |= x[0] | (last - x[0])
		b1 |= x[1] | (last - x[1])
		b2 |= x[2] | (last - x[2])
		b3 |= x[3] | (last - x[3])
		xs = xs[4:]
	}
	for _, x := range xs {
		b0 |= x | (last - x)
	}
	return b0|b1|b2|b3 < 0
}

// allOne reports whether every count is 1 (a pure decode step). Written
// apart from outside on purpose: a pure decode Begin is the hot path, and
// serving both through outside(xs, lo, hi) makes it measurably slower
// (BenchmarkStep shape=decode64 shows the Begin cost).
func allOne(xs []int32) bool {
	var b0, b1, b2, b3 int32
	for len(xs) >= 4 {
		x := xs[:4:4]
		b0 |= x[0] ^ 1
		b1 |= x[1] ^ 1
		b2 |= x[2] ^ 1
		b3 |= x[3] ^ 1
		xs = xs[4:]
	}
	for _, x := range xs {
		b0 |= x ^ 1
	}
	return b0|b1|b2|b3 == 0
}

// mapError names the cause of a plan slots.Map rejected: a negative start
// or count, a step larger than a staging page, else Map's own error.
func (c *Cache) mapError(p *Plan, err error) error {
	var tot int64
	for i, cnt := range p.Count {
		if cnt < 0 || p.Start[i] < 0 {
			return fmt.Errorf("%w: request %d: start %d, count %d", ErrPlan, p.IDs[i], p.Start[i], cnt)
		}
		tot += int64(cnt)
	}
	if tot > int64(c.cfg.StagingCapacityTokens) {
		return fmt.Errorf("%w: %d tokens, a page holds %d", ErrStepTooLarge, tot, c.cfg.StagingCapacityTokens)
	}
	return fmt.Errorf("%w: %w", ErrPlan, err)
}

// checkIDs rejects a request scheduled twice, an arrival listed twice, and
// a fresh arrival scheduled from a position other than its hit length, as
// the table will be once the finished requests are dropped. It changes
// nothing but scratch and stamps.
func (c *Cache) checkIDs(p *Plan) error {
	e := &c.eng
	e.stampGen += 2
	finGen, batchGen := e.stampGen-1, e.stampGen
	for _, id := range p.Finished {
		if h, ok := e.reqs.Lookup(id); ok {
			e.mark(h, finGen)
		}
	}
	finished := func(h soa.Handle) bool { return int(h) < len(e.stamp) && e.stamp[h] == finGen }
	// live reports whether id is live once the finished are dropped.
	live := func(id int64) (soa.Handle, bool) {
		h, ok := e.reqs.Lookup(id)
		return h, ok && !finished(h)
	}
	e.unknown = e.unknown[:0]
	e.starts = e.starts[:0]
	e.chk = e.chk[:0]
	// A batch position that holds the previous step's id holds its handle
	// too (prevH is valid while prevIDs is: unbegin clears it), unless the
	// request finished in this plan: a decode batch, where a few ids change
	// per step, looks up only those.
	for i, id := range p.IDs {
		var h soa.Handle
		var ok bool
		if i < len(e.prevIDs) && e.prevIDs[i] == id {
			h = e.prevH[i]
			ok = !finished(h)
		} else {
			h, ok = live(id)
		}
		if !ok {
			e.chk = append(e.chk, soa.NoHandle)
			e.unknown = append(e.unknown, id)
			e.starts = append(e.starts, idStart{id, p.Start[i]})
			continue
		}
		if e.mark(h, batchGen) == batchGen {
			return fmt.Errorf("%w: request %d scheduled twice", ErrPlan, id)
		}
		e.chk = append(e.chk, h)
	}
	slices.Sort(e.unknown)
	for i := 1; i < len(e.unknown); i++ {
		if e.unknown[i] == e.unknown[i-1] {
			return fmt.Errorf("%w: request %d scheduled twice", ErrPlan, e.unknown[i])
		}
	}
	if len(p.Arrivals) == 0 {
		return nil
	}
	e.arrived = append(e.arrived[:0], p.Arrivals...)
	slices.Sort(e.arrived)
	for i := 1; i < len(e.arrived); i++ {
		if e.arrived[i] == e.arrived[i-1] {
			return fmt.Errorf("%w: request %d arrives twice", ErrPlan, e.arrived[i])
		}
	}
	slices.SortFunc(e.starts, func(a, b idStart) int { return cmp.Compare(a.id, b.id) })
	for i, id := range p.Arrivals {
		if _, ok := live(id); ok {
			if p.HitTokens[i] == 0 || !slices.Contains(p.Resumed, id) {
				continue // a streamed continuation: not a hit
			}
			// A resumed request with a hit: scheduled from its hit length.
			if j := slices.Index(p.IDs, id); j >= 0 && p.Start[j] != p.HitTokens[i] {
				return fmt.Errorf("%w: request %d resumes with %d hit tokens but is scheduled from position %d", ErrPlan, id, p.HitTokens[i], p.Start[j])
			}
			continue
		}
		j, found := slices.BinarySearchFunc(e.starts, id, func(s idStart, id int64) int { return cmp.Compare(s.id, id) })
		if found && e.starts[j].start != p.HitTokens[i] {
			return fmt.Errorf("%w: request %d arrives with %d hit tokens but is scheduled from position %d", ErrPlan, id, p.HitTokens[i], e.starts[j].start)
		}
	}
	return nil
}

// Abort abandons the begun step when its forward failed after Begin: the
// cache returns to the state before that Begin, except that the requests it
// finished stay dropped (the engine dropped them, and their open writes
// still land); begin the step again, or another. ErrSequence without a
// begun step. Engine goroutine only.
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

// unbegin undoes the begun step (Abort, or its Save failed): the requests the
// Begin added are dropped again (a retry of the same plan registers them,
// and their hits, afresh); finished requests stay dropped, as the engine
// dropped them.
func (c *Cache) unbegin() {
	e := &c.eng
	for _, h := range e.fresh {
		if e.reqs.Pos(h) >= 0 {
			e.reqs.Remove(h)
		}
	}
	e.fresh = e.fresh[:0]
	e.prevIDs = e.prevIDs[:0]
	e.prevH = e.prevH[:0] // an empty batch next is "the same" as none: no stale handles
	e.begun = false
	if c.tl != nil {
		c.tl.Unbegin()
	}
	if e.rec != nil {
		c.rd.Cancel(e.rec) // a prefetch not started is skipped
		e.rec, e.planned = nil, false
	}
	c.live.Store(int64(e.reqs.Len()))
}

// equalIDs is slices.Equal for request ids, as one memequal over the
// bytes (the runtime's vectorised compare: a decode batch of hundreds of
// ids is compared every step).
func equalIDs(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 {
		return true
	}
	ab := unsafe.Slice((*byte)(unsafe.Pointer(&a[0])), len(a)*8)
	bb := unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), len(b)*8)
	return string(ab) == string(bb) // no conversion: compared in place
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n, n+n/4)
	}
	return s[:n]
}

// tierLeft is the tier blocks of the plan's arrivals from one on.
func tierLeft(tb []int32) int {
	n := 0
	for _, m := range tb {
		n += int(m)
	}
	return n
}
