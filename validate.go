// Plan validation: Begin checks the whole plan here before it applies any
// of it, and maps the batch to slots into the engine's scratch. Engine
// goroutine.

package omnicache

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/omnicache/omnicache/internal/scratch"
	"github.com/omnicache/omnicache/slots"
	"github.com/omnicache/omnicache/soa"
)

// validatePlan checks every part of the plan: the batch (validate), the
// tier fields and the replaced prompts.
func (c *Cache) validatePlan(p *Plan) (ntok int, pure, same bool, err error) {
	if ntok, pure, same, err = c.validate(p); err != nil {
		return 0, false, false, err
	}
	if err := c.checkTierPlan(p); err != nil {
		return 0, false, false, err
	}
	if err := c.checkReplaced(p); err != nil {
		return 0, false, false, err
	}
	if len(p.ResultInto) != 0 && len(p.ResultInto) != len(c.cfg.Keys) {
		return 0, false, false, fmt.Errorf("%w: %d ResultInto buffers for %d keys", ErrPlan, len(p.ResultInto), len(c.cfg.Keys))
	}
	if err := c.checkResultDev(p); err != nil {
		return 0, false, false, err
	}
	return ntok, pure, same, nil
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
	e.slots = scratch.Grow(e.slots, c.cfg.StagingCapacityTokens)
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
	e.stepBlocks = nil
	if ntok <= 4*n {
		bad = outside(e.slots, last)
	} else {
		e.stepBlocks = e.stepBlockBuf[:0]
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
			e.stepBlocks = append(e.stepBlocks, bl...) // the write path's join log takes them (writer.Step.Blocks)
		}
		e.stepBlockBuf = e.stepBlocks[:0]
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
	e.seenGen += 2
	finGen, batchGen := e.seenGen-1, e.seenGen
	for _, id := range p.Finished {
		if h, ok := e.requests.Lookup(id); ok {
			e.markSeen(h, finGen)
		}
	}
	finished := func(h soa.Handle) bool { return int(h) < len(e.seen) && e.seen[h] == finGen }
	// live reports whether id is live once the finished are dropped.
	live := func(id int64) (soa.Handle, bool) {
		h, ok := e.requests.Lookup(id)
		return h, ok && !finished(h)
	}
	e.notLive = e.notLive[:0]
	e.notLiveStarts = e.notLiveStarts[:0]
	e.liveHandles = e.liveHandles[:0]
	// A batch position that holds the previous step's id holds its handle
	// too (prevHandles is valid while prevIDs is: unbegin clears it), unless the
	// request finished in this plan: a decode batch, where a few ids change
	// per step, looks up only those.
	for i, id := range p.IDs {
		var h soa.Handle
		var ok bool
		if i < len(e.prevIDs) && e.prevIDs[i] == id {
			h = e.prevHandles[i]
			ok = !finished(h)
		} else {
			h, ok = live(id)
		}
		if !ok {
			e.liveHandles = append(e.liveHandles, soa.NoHandle)
			e.notLive = append(e.notLive, id)
			e.notLiveStarts = append(e.notLiveStarts, idStart{id, p.Start[i]})
			continue
		}
		if e.markSeen(h, batchGen) == batchGen {
			return fmt.Errorf("%w: request %d scheduled twice", ErrPlan, id)
		}
		e.liveHandles = append(e.liveHandles, h)
	}
	slices.Sort(e.notLive)
	for i := 1; i < len(e.notLive); i++ {
		if e.notLive[i] == e.notLive[i-1] {
			return fmt.Errorf("%w: request %d scheduled twice", ErrPlan, e.notLive[i])
		}
	}
	if len(p.Arrivals) == 0 {
		return nil
	}
	e.arrivalIDs = append(e.arrivalIDs[:0], p.Arrivals...)
	slices.Sort(e.arrivalIDs)
	for i := 1; i < len(e.arrivalIDs); i++ {
		if e.arrivalIDs[i] == e.arrivalIDs[i-1] {
			return fmt.Errorf("%w: request %d arrives twice", ErrPlan, e.arrivalIDs[i])
		}
	}
	slices.SortFunc(e.notLiveStarts, func(a, b idStart) int { return cmp.Compare(a.id, b.id) })
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
		j, found := slices.BinarySearchFunc(e.notLiveStarts, id, func(s idStart, id int64) int { return cmp.Compare(s.id, id) })
		if found && e.notLiveStarts[j].start != p.HitTokens[i] {
			return fmt.Errorf("%w: request %d arrives with %d hit tokens but is scheduled from position %d", ErrPlan, id, p.HitTokens[i], e.notLiveStarts[j].start)
		}
	}
	return nil
}

// checkTierPlan validates the plan's tier fields.
func (c *Cache) checkTierPlan(p *Plan) error {
	if len(p.FullBlocks) != len(p.FullHashes) {
		return fmt.Errorf("%w: %d full blocks, %d full hashes", ErrPlan, len(p.FullBlocks), len(p.FullHashes))
	}
	for _, b := range p.FullBlocks {
		if b < 0 || int(b) >= c.cfg.NumBlocks {
			return fmt.Errorf("%w: full block %d outside [0,%d)", ErrPlan, b, c.cfg.NumBlocks)
		}
	}
	if len(p.TierBlocks) == 0 {
		if len(p.TierHashes) > 0 {
			return fmt.Errorf("%w: %d tier hashes without TierBlocks", ErrPlan, len(p.TierHashes))
		}
		return nil
	}
	if c.tl == nil {
		return fmt.Errorf("%w: the plan imports tier blocks but the cache has no tier", ErrConfig)
	}
	if len(p.TierBlocks) != len(p.Arrivals) {
		return fmt.Errorf("%w: %d tier block counts for %d arrivals", ErrPlan, len(p.TierBlocks), len(p.Arrivals))
	}
	used := 0
	for i, n := range p.TierBlocks {
		if nb := int(p.HitTokens[i]) / c.cfg.BlockSize; n < 0 || int(n) > nb {
			return fmt.Errorf("%w: request %d imports %d tier blocks of its %d hit blocks", ErrPlan, p.Arrivals[i], n, nb)
		}
		used += int(n)
	}
	if used != len(p.TierHashes) {
		return fmt.Errorf("%w: %d tier blocks, %d tier hashes", ErrPlan, used, len(p.TierHashes))
	}
	return nil
}
