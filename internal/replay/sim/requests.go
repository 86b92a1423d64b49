// A request's way through the simulator: its scheduled spans, prefix
// lookup, block growth and caching, preemption, and the rows and blocks it
// gives back.

package sim

// add appends r's scheduled span to the plan.
func (s *Sim) add(r *Req, n, prefix int) {
	st := &s.step
	st.Plan.IDs = append(st.Plan.IDs, r.ID)
	st.Plan.Rows = append(st.Plan.Rows, r.row)
	st.Plan.Start = append(st.Plan.Start, int32(r.computed))
	st.Plan.Count = append(st.Plan.Count, int32(n))
	st.Reqs = append(st.Reqs, r)
	st.Prefix = append(st.Prefix, int32(prefix))
	st.Tokens += n
	acc := n
	if s.cfg.SpecTokens > 0 {
		acc = s.drafts(r, n)
	}
	st.Accepted = append(st.Accepted, int32(acc))
	if n == 1 && r.computed >= r.PromptLen {
		st.Cost.DecodeSeqs++
	} else {
		st.Cost.PrefillTokens += int64(n)
		st.Cost.Attention += int64(n) * int64(r.computed+n)
	}
}

// lookup returns the longest run of cached full blocks of r's known tokens,
// capped so that at least one token is computed.
func (s *Sim) lookup(r *Req) []int32 {
	if s.cfg.NoPrefixCaching {
		return s.hitBuf[:0]
	}
	bs := s.cfg.BlockSize
	maxBlocks := (len(r.Tokens) - 1) / bs
	hit := s.hitBuf[:0]
	for i := range maxBlocks {
		b, ok := s.blocks.Lookup(r.H[(i+1)*bs-1])
		if !ok {
			break
		}
		hit = append(hit, b)
	}
	s.hitBuf = hit
	return hit
}

// external returns how many of r's full blocks after its local hit of
// nhit blocks the shared KV store can load (a fresh arrival only: a
// resumed request is no arrival, the cache would not import its rows), with
// their hashes in s.extBuf; capped like lookup, so that a token is computed.
func (s *Sim) external(r *Req, nhit int) int {
	s.extBuf = s.extBuf[:0]
	if s.cfg.External == nil || s.cfg.NoPrefixCaching || r.seen || r.NoExternal {
		return 0
	}
	bs := s.cfg.BlockSize
	for i := nhit; i < (len(r.Tokens)-1)/bs; i++ {
		s.extBuf = append(s.extBuf, r.H[(i+1)*bs-1])
	}
	if len(s.extBuf) == 0 {
		return 0
	}
	n := max(0, min(s.cfg.External.Load(s.extBuf), len(s.extBuf)))
	s.extBuf = s.extBuf[:n]
	return n
}

// grow gives r blocks for its first upto tokens; false when the pool is
// short (nothing is allocated then).
func (s *Sim) grow(r *Req, upto int) bool {
	need := s.blocksFor(upto) - len(r.blocks)
	if need <= 0 {
		return true
	}
	if need > s.blocks.NumFree() {
		return false
	}
	if r.row < 0 {
		s.takeRow(r)
		copy(s.table[int(r.row)*s.stride:], r.blocks)
	}
	base := int(r.row) * s.stride
	for range need {
		b := s.blocks.Alloc()
		s.table[base+len(r.blocks)] = b
		r.blocks = append(r.blocks, b)
	}
	return true
}

// cache registers the hashes of r's full blocks within its first upto
// tokens (at allocation, as vLLM does: a request scheduled later in the
// same step may hit them).
func (s *Sim) cache(r *Req, upto int) {
	if s.cfg.NoPrefixCaching {
		return
	}
	bs := s.cfg.BlockSize
	full := min(upto, len(r.Tokens)) / bs
	for i := r.hashed; i < full; i++ {
		h := r.H[(i+1)*bs-1]
		s.blocks.Register(r.blocks[i], h)
		if s.cfg.FullBlocks && i >= r.loaded {
			s.step.Plan.FullBlocks = append(s.step.Plan.FullBlocks, r.blocks[i])
			s.step.Plan.FullHashes = append(s.step.Plan.FullHashes, h)
		}
	}
	if full > r.hashed {
		r.hashed = full
	}
}

// preempt frees r's blocks and puts it at the front of the waiting queue; it
// will recompute from its next prefix lookup.
func (s *Sim) preempt(r *Req) {
	s.freeBlocks(r)
	s.putRow(r)
	r.computed = 0
	r.hashed = 0
	r.loaded = 0
	r.state = stWaiting
	r.preempted = true
	s.waiting = append(s.waiting, nil)
	copy(s.waiting[1:], s.waiting)
	s.waiting[0] = r
	s.step.Plan.Preempted = append(s.step.Plan.Preempted, r.ID)
	s.Preemptions++
}

// releaseEarly frees the finishing requests' blocks before Begin when the
// pool is otherwise exhausted (vLLM's own order: the cache still sees them in
// this step's Finished, in the same Begin that may reuse their blocks).
func (s *Sim) releaseEarly() bool {
	if len(s.reported) == 0 {
		return false
	}
	s.dropAll(&s.reported)
	return true
}

func (s *Sim) dropAll(list *[]*Req) {
	for _, r := range *list {
		s.drop(r)
	}
	clear(*list)
	*list = (*list)[:0]
}

// drop ends a finished request: its blocks and row are released.
func (s *Sim) drop(r *Req) {
	if r.state == stDone {
		return
	}
	s.freeBlocks(r)
	s.putRow(r)
	r.state = stDone
	r.blocks = nil
}

func (s *Sim) freeBlocks(r *Req) {
	// Tail first, so a request's last blocks are reused before its prefix.
	for i := len(r.blocks) - 1; i >= 0; i-- {
		s.blocks.Free(r.blocks[i])
	}
	r.blocks = r.blocks[:0]
}

func (s *Sim) takeRow(r *Req) {
	if r.row >= 0 {
		return
	}
	r.row = s.rows[len(s.rows)-1]
	s.rows = s.rows[:len(s.rows)-1]
}

func (s *Sim) putRow(r *Req) {
	if r.row < 0 {
		return
	}
	s.rows = append(s.rows, r.row)
	r.row = -1
}

// drafts appends the prefix hashes the forward sees over r's n scheduled
// tokens to the step's RowH and returns how many are accepted. Past the
// request's known tokens (a speculative decode: one known token, then
// drafts) each draft is the true next token with SpecAcceptPct percent
// probability, else another one; drafts are accepted up to the first
// wrong one.
func (s *Sim) drafts(r *Req, n int) int {
	st := &s.step
	known := min(n, len(r.Tokens)-r.computed)
	st.RowH = append(st.RowH, r.H[r.computed:r.computed+known]...)
	acc := known
	h := r.H[r.computed+known-1]
	right := true
	for range n - known {
		s.rng += 0x9e3779b97f4a7c15
		draw := SplitMix64(s.rng)
		t := int32(SplitMix64(h) % uint64(s.cfg.Vocab))
		if draw%100 >= uint64(s.cfg.SpecAcceptPct) {
			t = int32((uint64(t) + 1 + (draw>>8)%uint64(s.cfg.Vocab-1)) % uint64(s.cfg.Vocab))
			right = false
		}
		if right {
			acc++
		}
		h = Mix(h, t)
		st.RowH = append(st.RowH, h)
	}
	s.Drafts += int64(n - known)
	st.Rejected += n - acc
	return acc
}

// replaceTokens applies the replacements that are due: a running request
// that has computed its replacement's At positions is rolled back to From
// (its blocks past From's block freed, the hash of the block From falls in
// dropped) with its new tokens, and the plan names it in Replaced.
func (s *Sim) replaceTokens() {
	bs := s.cfg.BlockSize
	for _, r := range s.running {
		rp := r.Replace
		if rp == nil || r.state != stRunning || r.computed < rp.At {
			continue
		}
		r.Replace = nil
		from := min(rp.From, r.computed)
		keep := s.blocksFor(from)
		if from%bs != 0 && s.blocks.Ref(r.blocks[from/bs]) > 1 {
			// From falls in a block others share: it cannot be
			// rewritten, recompute it whole.
			from -= from % bs
			keep = from / bs
		}
		for i := len(r.blocks) - 1; i >= keep; i-- {
			s.blocks.Free(r.blocks[i])
		}
		r.blocks = r.blocks[:keep]
		if from%bs != 0 {
			s.blocks.Unregister(r.blocks[from/bs]) // its tail is rewritten
		}
		r.hashed = min(r.hashed, from/bs)
		r.loaded = min(r.loaded, from/bs)
		// New slices: records of earlier steps keep reading the old ones
		// (equal below From).
		tokens := make([]int32, from, from+len(rp.Tokens)+r.OutputLen)
		copy(tokens, r.Tokens)
		tokens = append(tokens, rp.Tokens...)
		hs := make([]uint64, from, cap(tokens))
		copy(hs, r.H)
		h := RootHash
		if from > 0 {
			h = hs[from-1]
		}
		for _, t := range rp.Tokens {
			h = Mix(h, t)
			hs = append(hs, h)
		}
		r.Tokens, r.H = tokens, hs
		r.PromptLen = len(tokens)
		r.generated = 0
		r.computed = from
		s.step.Plan.Replaced = append(s.step.Plan.Replaced, r.ID)
		s.step.Plan.ReplacedFrom = append(s.step.Plan.ReplacedFrom, int32(from))
		s.Replaces++
	}
}
