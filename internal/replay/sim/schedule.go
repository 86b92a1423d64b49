// The scheduler: the client's requests admitted until Concurrency are in
// flight, and each step's plan (running requests first, preempting from
// the back when blocks run out, then waiting ones).

package sim

import (
	"errors"
	"fmt"
)

// topUp lets the client send requests until Concurrency are in flight.
func (s *Sim) topUp() error {
	for !s.srcDone && s.inFlight < s.cfg.Concurrency {
		rq, ok, err := s.src.Next()
		if errors.Is(err, ErrNoRequestYet) {
			break // asked again at the next step
		}
		if err != nil {
			return err
		}
		if !ok {
			s.srcDone = true
			break
		}
		if len(rq.Prompt) == 0 || rq.OutputLen <= 0 {
			return fmt.Errorf("sim: request %d: empty prompt or output", s.nextID+1)
		}
		total := len(rq.Prompt) + rq.OutputLen
		if total > s.cfg.MaxModelLen || s.blocksFor(total) > s.cfg.NumBlocks {
			return fmt.Errorf("%w: request %d has %d tokens (model length %d, pool %d blocks of %d)",
				ErrTooLarge, s.nextID+1, total, s.cfg.MaxModelLen, s.cfg.NumBlocks, s.cfg.BlockSize)
		}
		s.nextID++
		r := &Req{
			ID:        s.nextID,
			PromptLen: len(rq.Prompt),
			OutputLen: rq.OutputLen,
			Tokens:    rq.Prompt,
			H:         make([]uint64, len(rq.Prompt), total),
			row:       -1,
			Sent:      s.Steps,
			Replace:   rq.Replace,

			NoExternal: rq.NoExternal,
		}
		h := RootHash
		for p, t := range rq.Prompt {
			h = Mix(h, t)
			r.H[p] = h
		}
		s.waiting = append(s.waiting, r)
		s.inFlight++
	}
	return nil
}

func (s *Sim) blocksFor(tokens int) int {
	return (tokens + s.cfg.BlockSize - 1) / s.cfg.BlockSize
}

// schedule builds s.step: running requests first (preempting from the back
// when blocks run out), then waiting requests if nothing was preempted.
func (s *Sim) schedule() error {
	st := &s.step
	st.Index = s.Steps
	p := &st.Plan
	p.IDs, p.Rows, p.Start, p.Count = p.IDs[:0], p.Rows[:0], p.Start[:0], p.Count[:0]
	p.Arrivals, p.HitTokens, p.HitBlocks = p.Arrivals[:0], p.HitTokens[:0], p.HitBlocks[:0]
	p.Finished, p.Preempted, p.Resumed = p.Finished[:0], p.Preempted[:0], p.Resumed[:0]
	p.Replaced, p.ReplacedFrom = p.Replaced[:0], p.ReplacedFrom[:0]
	p.FullBlocks, p.FullHashes, p.TierBlocks, p.TierHashes = p.FullBlocks[:0], p.FullHashes[:0], p.TierBlocks[:0], p.TierHashes[:0]
	p.Table, p.Stride = s.table, s.stride
	clear(st.Reqs)
	st.Reqs, st.Prefix, st.Accepted = st.Reqs[:0], st.Prefix[:0], st.Accepted[:0]
	st.RowH, st.Rejected = st.RowH[:0], 0
	if s.cfg.SpecTokens <= 0 {
		st.RowH = nil
	}
	st.Tokens, st.Queried, st.Hit, st.ExtHit = 0, 0, 0, 0
	st.Cost = Work{Steps: 1}
	s.dropAll(&s.reported) // not released by the caller: release now
	s.reported, s.finishing = s.finishing, s.reported
	for _, r := range s.reported {
		p.Finished = append(p.Finished, r.ID)
	}

	s.replaceTokens()
	budget := s.cfg.MaxBatchedTokens
	preempted := false
	for i := 0; i < len(s.running) && budget > 0; {
		r := s.running[i]
		n := min(len(r.Tokens)-r.computed, budget)
		if n == 1 && s.cfg.SpecTokens > 0 && r.computed >= r.PromptLen {
			// A decode: the next token and drafts, as many as the
			// budget and the output length leave.
			n += max(0, min(s.cfg.SpecTokens, budget-1, r.OutputLen-r.generated-1))
		}
		ok := false
		for {
			if s.grow(r, r.computed+n) {
				ok = true
				break
			}
			if s.releaseEarly() {
				continue
			}
			victim := s.running[len(s.running)-1]
			s.running[len(s.running)-1] = nil
			s.running = s.running[:len(s.running)-1]
			s.preempt(victim)
			preempted = true
			if victim == r {
				break
			}
		}
		if !ok {
			break // r itself was preempted; it was the last running request
		}
		s.cache(r, r.computed+n)
		s.add(r, n, 0)
		budget -= n
		i++
	}

	for !preempted && budget > 0 && len(s.waiting) > 0 && len(s.running) < s.cfg.Concurrency {
		r := s.waiting[0]
		hit := s.lookup(r)
		ext := s.external(r, len(hit))
		hitTokens := (len(hit) + ext) * s.cfg.BlockSize
		n := min(len(r.Tokens)-hitTokens, budget)
		need := s.blocksFor(hitTokens+n) - len(hit)
		evictable := 0
		for _, b := range hit {
			if s.blocks.Ref(b) == 0 {
				evictable++
			}
		}
		if need > s.blocks.NumFree()-evictable {
			if s.releaseEarly() {
				continue
			}
			break
		}
		s.waiting[0] = nil
		s.waiting = s.waiting[1:]
		for _, b := range hit {
			s.blocks.Touch(b)
		}
		s.takeRow(r)
		r.blocks = append(r.blocks[:0], hit...)
		copy(s.table[int(r.row)*s.stride:], hit)
		r.hashed = len(hit)
		r.loaded = len(hit) + ext // grow allocates the loaded blocks, cache registers them
		r.computed = hitTokens
		if !s.grow(r, hitTokens+n) {
			panic("sim: allocation failed after the free check")
		}
		s.cache(r, hitTokens+n)
		r.state = stRunning
		s.running = append(s.running, r)
		prefix := 0
		switch {
		case !r.seen:
			r.seen = true
			r.ArrivalHit = hitTokens
			prefix = hitTokens
			p.Arrivals = append(p.Arrivals, r.ID)
			p.HitTokens = append(p.HitTokens, int32(hitTokens))
			p.HitBlocks = append(p.HitBlocks, r.blocks[:len(hit)+ext]...)
			if s.cfg.External != nil {
				p.TierBlocks = append(p.TierBlocks, int32(ext))
				p.TierHashes = append(p.TierHashes, s.extBuf...)
			}
			st.Queried += r.PromptLen
			st.Hit += hitTokens
			st.ExtHit += ext * s.cfg.BlockSize
			s.Arrived++
		case r.preempted:
			r.preempted = false
			p.Resumed = append(p.Resumed, r.ID)
			if hitTokens > 0 {
				// It hit its own cached blocks: an arrival with that
				// hit too, scheduled from it.
				prefix = hitTokens
				p.Arrivals = append(p.Arrivals, r.ID)
				p.HitTokens = append(p.HitTokens, int32(hitTokens))
				p.HitBlocks = append(p.HitBlocks, r.blocks[:len(hit)]...)
				if s.cfg.External != nil {
					p.TierBlocks = append(p.TierBlocks, 0)
				}
				s.ResumedHits++
			}
		}
		s.add(r, n, prefix)
		budget -= n
	}

	st.PureDecode = len(p.Arrivals) == 0 && len(p.Finished) == 0 &&
		len(p.Preempted) == 0 && len(p.Resumed) == 0 && len(p.Replaced) == 0 && st.Tokens == len(p.IDs)
	if st.Tokens == 0 {
		return fmt.Errorf("sim: step %d scheduled nothing (%d waiting, %d running, %d free blocks)",
			st.Index, len(s.waiting), len(s.running), s.blocks.NumFree())
	}
	s.Steps++
	s.Work.Add(st.Cost)
	s.TokensTotal += int64(st.Tokens)
	s.Queried += int64(st.Queried)
	s.Hit += int64(st.Hit)
	s.ExtHit += int64(st.ExtHit)
	s.Rejected += int64(st.Rejected)
	if len(p.TierHashes) == 0 {
		p.TierBlocks = p.TierBlocks[:0] // no import this step
	}
	return nil
}
