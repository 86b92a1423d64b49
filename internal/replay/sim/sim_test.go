package sim

import (
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"testing"
)

// listSource replays a fixed list of requests.
type listSource struct {
	reqs []Request
	i    int
}

func (l *listSource) Next() (Request, bool, error) {
	if l.i >= len(l.reqs) {
		return Request{}, false, nil
	}
	r := l.reqs[l.i]
	l.i++
	// The simulator owns the prompt: hand it a copy.
	return Request{Prompt: slices.Clone(r.Prompt), OutputLen: r.OutputLen, Replace: r.Replace}, true, nil
}

func randomPrompts(seed uint64, n, shared, in, out int) []Request {
	rng := rand.New(rand.NewPCG(seed, 1))
	prefix := make([]int32, shared)
	for i := range prefix {
		prefix[i] = rng.Int32N(50000)
	}
	reqs := make([]Request, n)
	for i := range reqs {
		p := append([]int32(nil), prefix...)
		for range in {
			p = append(p, rng.Int32N(50000))
		}
		reqs[i] = Request{Prompt: p, OutputLen: out}
	}
	return reqs
}

// drive steps s to the end, checking invariants every step (live and
// finished carry over from steps run before), and calls each (if not nil)
// with every step.
func drive(t *testing.T, s *Sim, live, finished map[int64]bool, each func(*Sim, *Step)) {
	t.Helper()
	for {
		st, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		if st == nil {
			return
		}
		checkStep(t, s, st, live, finished)
		if each != nil {
			each(s, st)
		}
		s.Release()
		s.Advance()
		checkRefs(t, s)
	}
}

// runAll drives the simulator to the end, checking invariants every step,
// and calls each (if not nil) with every step.
func runAll(t *testing.T, cfg Config, reqs []Request, each func(*Sim, *Step)) *Sim {
	t.Helper()
	s, err := New(cfg, &listSource{reqs: reqs})
	if err != nil {
		t.Fatal(err)
	}
	drive(t, s, map[int64]bool{}, map[int64]bool{}, each)
	if s.Finished != int64(len(reqs)) {
		t.Fatalf("finished %d of %d requests", s.Finished, len(reqs))
	}
	if s.KV().NumFree() != s.KV().Len() {
		t.Fatalf("%d of %d blocks free at the end", s.KV().NumFree(), s.KV().Len())
	}
	return s
}

// checkStep verifies the plan against the simulator's state.
func checkStep(t *testing.T, s *Sim, st *Step, live, finished map[int64]bool) {
	t.Helper()
	p := &st.Plan
	bs := s.cfg.BlockSize
	if n := len(p.IDs); len(p.Rows) != n || len(p.Start) != n || len(p.Count) != n || len(st.Reqs) != n {
		t.Fatalf("step %d: ragged plan", st.Index)
	}
	if st.Tokens > s.cfg.MaxBatchedTokens {
		t.Fatalf("step %d: %d tokens over the budget %d", st.Index, st.Tokens, s.cfg.MaxBatchedTokens)
	}
	for _, id := range p.Finished {
		if finished[id] {
			t.Fatalf("step %d: request %d reported finished twice", st.Index, id)
		}
		finished[id] = true
		delete(live, id)
	}
	seen := map[int64]bool{}
	hb := 0
	for i, id := range p.Arrivals {
		resumed := slices.Contains(p.Resumed, id)
		if (live[id] && !resumed) || finished[id] || (resumed && p.HitTokens[i] == 0) {
			// A resumed request arrives again only with a hit.
			t.Fatalf("step %d: request %d arrives twice", st.Index, id)
		}
		live[id] = true
		h := int(p.HitTokens[i])
		if h%bs != 0 {
			t.Fatalf("unaligned hit")
		}
		hb += h / bs
	}
	if hb != len(p.HitBlocks) {
		t.Fatalf("step %d: %d hit blocks for %d hit block count", st.Index, len(p.HitBlocks), hb)
	}
	tokens := 0
	for i, id := range p.IDs {
		r := st.Reqs[i]
		if r.ID != id || seen[id] {
			t.Fatalf("step %d: bad or duplicate id %d", st.Index, id)
		}
		seen[id] = true
		if !live[id] {
			t.Fatalf("step %d: request %d scheduled but not live", st.Index, id)
		}
		start, n := int(p.Start[i]), int(p.Count[i])
		if start != r.computed || n <= 0 || start+n > len(r.Tokens)+s.cfg.SpecTokens {
			t.Fatalf("step %d: request %d span [%d,+%d) computed %d known %d", st.Index, id, start, n, r.computed, len(r.Tokens))
		}
		row := p.Rows[i]
		if row != r.row || row < 0 {
			t.Fatalf("step %d: request %d row %d", st.Index, id, row)
		}
		need := (start + n + bs - 1) / bs
		if len(r.blocks) < need {
			t.Fatalf("step %d: request %d has %d blocks, needs %d", st.Index, id, len(r.blocks), need)
		}
		for b := range need {
			if p.Table[int(row)*p.Stride+b] != r.blocks[b] {
				t.Fatalf("step %d: table row %d disagrees with request %d's blocks", st.Index, row, id)
			}
		}
		tokens += n
	}
	if tokens != st.Tokens {
		t.Fatalf("token count")
	}
	// Arrival hit blocks head the table row.
	off := 0
	for i, id := range p.Arrivals {
		k := slices.Index(p.IDs, id)
		nb := int(p.HitTokens[i]) / bs
		if k < 0 || int(p.Start[k]) != int(p.HitTokens[i]) || int(st.Prefix[k]) != int(p.HitTokens[i]) {
			t.Fatalf("step %d: arrival %d not scheduled from its hit", st.Index, id)
		}
		row := p.Rows[k]
		if !slices.Equal(p.Table[int(row)*p.Stride:int(row)*p.Stride+nb], p.HitBlocks[off:off+nb]) {
			t.Fatalf("step %d: arrival %d hit blocks differ from its table row", st.Index, id)
		}
		off += nb
	}
}

// checkRefs verifies every reference count equals the number of live
// requests holding the block.
func checkRefs(t *testing.T, s *Sim) {
	t.Helper()
	want := make([]int32, s.blocks.Len())
	for _, list := range [][]*Req{s.running, s.finishing, s.reported, s.waiting} {
		for _, r := range list {
			for _, b := range r.blocks {
				want[b]++
			}
		}
	}
	free := 0
	for b := range want {
		if s.blocks.Ref(int32(b)) != want[b] {
			t.Fatalf("block %d: ref %d, held by %d", b, s.blocks.Ref(int32(b)), want[b])
		}
		if want[b] == 0 {
			free++
		}
	}
	if free != s.blocks.NumFree() {
		t.Fatalf("free count %d, want %d", s.blocks.NumFree(), free)
	}
}

func TestBlockHashChain(t *testing.T) {
	const bs = 16
	a := randomPrompts(1, 1, 0, 64, 1)[0].Prompt
	b := slices.Clone(a)
	hashes := func(toks []int32) []uint64 {
		var out []uint64
		h := RootHash
		for i := 0; i+bs <= len(toks); i += bs {
			h = BlockHash(h, toks[i:i+bs])
			out = append(out, h)
		}
		return out
	}
	if !slices.Equal(hashes(a), hashes(b)) {
		t.Fatal("equal prefixes, different hashes")
	}
	b[40]++ // diverge in block 2
	ha, hb := hashes(a), hashes(b)
	for i := range ha {
		if (i < 2) != (ha[i] == hb[i]) {
			t.Fatalf("block %d: equal=%v", i, ha[i] == hb[i])
		}
	}
	// The chain depends on the parent: same block tokens after a different
	// prefix hash differently.
	c := slices.Clone(a)
	c[0]++
	copy(c[16:], a[16:])
	if hashes(c)[1] == ha[1] {
		t.Fatal("block hash ignores its parent")
	}
	// Block hashes equal the rolling hash at the block's end.
	h := RootHash
	for p, tok := range a {
		h = Mix(h, tok)
		if (p+1)%bs == 0 && h != ha[p/bs] {
			t.Fatalf("rolling hash at %d differs from the block hash", p)
		}
	}
}

func TestBlocksLeastRecentlyFreed(t *testing.T) {
	b := NewBlocks(4)
	for want := range int32(4) {
		if got := b.Alloc(); got != want {
			t.Fatalf("fresh pool hands out %d, want %d", got, want)
		}
	}
	if b.Alloc() != -1 {
		t.Fatal("alloc from an empty pool")
	}
	b.Register(0, 100)
	b.Register(2, 102)
	for _, id := range []int32{2, 0, 3, 1} {
		b.Free(id)
	}
	if got := b.FreeOrder(); !slices.Equal(got, []int32{2, 0, 3, 1}) {
		t.Fatalf("free order %v", got)
	}
	// A freed block keeps its hash and can be hit; the hit takes it off the
	// free queue.
	if id, ok := b.Lookup(100); !ok || id != 0 {
		t.Fatal("freed block lost its hash")
	}
	b.Touch(0)
	if b.Ref(0) != 1 || b.NumFree() != 3 || slices.Contains(b.FreeOrder(), 0) {
		t.Fatal("touch of a free block")
	}
	// Reuse evicts: block 2 is the least recently freed.
	if got := b.Alloc(); got != 2 {
		t.Fatalf("reused %d, want 2", got)
	}
	if _, ok := b.Lookup(102); ok || b.Evictions != 1 {
		t.Fatal("reused block still hit")
	}
	if got := b.Alloc(); got != 3 {
		t.Fatalf("reused %d, want 3", got)
	}
	// Duplicate content: the first block stays indexed.
	if b.Register(3, 100) {
		t.Fatal("duplicate hash indexed")
	}
	b.Free(0)
	b.Free(3)
	if got := b.FreeOrder(); !slices.Equal(got, []int32{1, 0, 3}) {
		t.Fatalf("free order %v", got)
	}
}

func TestRefCountsSharedPrefix(t *testing.T) {
	// 8 requests sharing a 64-token prefix (4 blocks), 4 at a time.
	reqs := randomPrompts(2, 8, 64, 40, 4)
	cfg := Config{NumBlocks: 256, Concurrency: 4, MaxModelLen: 256}
	maxRef := int32(0)
	runAll(t, cfg, reqs, func(s *Sim, st *Step) {
		for b := range s.blocks.Len() {
			maxRef = max(maxRef, s.blocks.Ref(int32(b)))
		}
	})
	if maxRef < 2 {
		t.Fatalf("shared prefix never shared a block (max ref %d)", maxRef)
	}
}

func TestPrefixHits(t *testing.T) {
	base := randomPrompts(3, 1, 0, 100, 3)[0]
	// 0: base; 1: same prompt (arrives with 0 running: same-step hit);
	// 2: exactly 96 tokens (hit capped at 80); 3: diverging at 50 (hit 48).
	p96 := slices.Clone(base.Prompt[:96])
	div := slices.Clone(base.Prompt)
	div[50]++
	reqs := []Request{base, base, {Prompt: p96, OutputLen: 2}, {Prompt: div, OutputLen: 2}}
	hits := map[int64]int32{}
	s := runAll(t, Config{NumBlocks: 64, Concurrency: 1, MaxModelLen: 128}, reqs, func(s *Sim, st *Step) {
		for i, id := range st.Plan.Arrivals {
			hits[id] = st.Plan.HitTokens[i]
		}
	})
	want := map[int64]int32{1: 0, 2: 96, 3: 80, 4: 48}
	for id, w := range want {
		if hits[id] != w {
			t.Errorf("request %d hit %d, want %d", id, hits[id], w)
		}
	}
	if s.Queried != 100+100+96+100 || s.Hit != 96+80+48 {
		t.Errorf("queried %d hit %d", s.Queried, s.Hit)
	}

	// Same-step hit: two identical prompts admitted together.
	hits = map[int64]int32{}
	runAll(t, Config{NumBlocks: 64, Concurrency: 2, MaxModelLen: 128}, []Request{base, base}, func(s *Sim, st *Step) {
		for i, id := range st.Plan.Arrivals {
			hits[id] = st.Plan.HitTokens[i]
		}
		if st.Index == 0 && len(st.Plan.Arrivals) != 2 {
			t.Errorf("both should arrive in step 0")
		}
	})
	if hits[2] != 96 {
		t.Errorf("same-step hit %d, want 96", hits[2])
	}
}

func TestChunkedPrefillBudget(t *testing.T) {
	reqs := randomPrompts(4, 6, 0, 1000, 5)
	cfg := Config{NumBlocks: 1024, Concurrency: 3, MaxModelLen: 1024, MaxBatchedTokens: 256}
	chunks := 0
	runAll(t, cfg, reqs, func(s *Sim, st *Step) {
		if st.Tokens > 256 {
			t.Fatalf("step %d: %d tokens", st.Index, st.Tokens)
		}
		for i := range st.Plan.IDs {
			if st.Plan.Count[i] > 1 && st.Plan.Start[i] > 0 {
				chunks++
			}
		}
	})
	if chunks == 0 {
		t.Fatal("no continued prefill chunk")
	}
}

func TestPreemptionTinyPool(t *testing.T) {
	// 4 in flight, each growing to 40+60 tokens = 7 blocks; 12 blocks hold
	// fewer than two of them.
	reqs := randomPrompts(5, 10, 0, 40, 60)
	cfg := Config{NumBlocks: 12, Concurrency: 4, MaxModelLen: 128}
	preempted := map[int64]int{}
	resumed := map[int64]int{}
	resumedHits := 0
	s := runAll(t, cfg, reqs, func(s *Sim, st *Step) {
		for _, id := range st.Plan.Preempted {
			if slices.Contains(st.Plan.IDs, id) {
				t.Fatalf("step %d: preempted %d is scheduled", st.Index, id)
			}
			preempted[id]++
		}
		for i, id := range st.Plan.IDs {
			if slices.Contains(st.Plan.Resumed, id) {
				if preempted[id] != resumed[id]+1 {
					t.Fatalf("request %d resumed without a preemption", id)
				}
				resumed[id]++
				if k := slices.Index(st.Plan.Arrivals, id); k >= 0 {
					// With a hit on its own cached blocks, scheduled
					// from it (runAll checks the hit blocks).
					if st.Plan.HitTokens[k] == 0 || st.Prefix[i] != st.Plan.HitTokens[k] {
						t.Fatalf("step %d: resumed request %d listed as an arrival without its hit", st.Index, id)
					}
					resumedHits++
				}
			}
		}
	})
	if s.Preemptions == 0 {
		t.Fatal("no preemption with a tiny pool")
	}
	if int64(resumedHits) != s.ResumedHits {
		t.Fatalf("%d resumes with a hit in the plans, counter %d", resumedHits, s.ResumedHits)
	}
	for id, n := range preempted {
		if resumed[id] != n {
			t.Errorf("request %d preempted %d times, resumed %d", id, n, resumed[id])
		}
	}

	// A request that can never fit is an error, not a hang.
	big := randomPrompts(6, 1, 0, 300, 4)
	sm, _ := New(Config{NumBlocks: 8, Concurrency: 1, MaxModelLen: 400}, &listSource{reqs: big})
	if _, err := sm.Next(); err == nil {
		t.Fatal("oversized request accepted")
	}
}

func digest(t *testing.T, seed uint64) uint64 {
	reqs := randomPrompts(seed, 12, 32, 70, 9)
	f := fnv.New64a()
	var buf [8]byte
	put := func(v int64) {
		for i := range buf {
			buf[i] = byte(v >> (8 * i))
		}
		f.Write(buf[:])
	}
	runAll(t, Config{NumBlocks: 40, Concurrency: 5, MaxModelLen: 128, MaxBatchedTokens: 100}, reqs, func(s *Sim, st *Step) {
		p := &st.Plan
		for i := range p.IDs {
			put(p.IDs[i])
			put(int64(p.Start[i]))
			put(int64(p.Count[i]))
			put(int64(p.Table[int(p.Rows[i])*p.Stride]))
			put(int64(st.Reqs[i].H[p.Start[i]+p.Count[i]-1])) // the content
		}
		for _, l := range [][]int64{p.Arrivals, p.Finished, p.Preempted, p.Resumed} {
			put(-1)
			for _, id := range l {
				put(id)
			}
		}
	})
	return f.Sum64()
}

func TestDeterministic(t *testing.T) {
	if first, again := digest(t, 7), digest(t, 7); first != again {
		t.Fatal("same seed, different schedules")
	}
	if digest(t, 7) == digest(t, 8) {
		t.Fatal("different seeds, same schedule")
	}
}

// TestNoPrefixCaching: with the KV prefix cache off nothing hits, every
// prompt token is computed, and the step work adds up: prefill tokens +
// decodes = scheduled tokens, with the attention sum of each prefill chunk.
func TestNoPrefixCaching(t *testing.T) {
	reqs := randomPrompts(3, 10, 64, 40, 6) // a shared 64-token prefix
	for _, caching := range []bool{true, false} {
		cfg := Config{NumBlocks: 200, Concurrency: 3, MaxModelLen: 128, MaxBatchedTokens: 64, NoPrefixCaching: !caching}
		var sum Work
		var tokens int64
		s := runAll(t, cfg, reqs, func(s *Sim, st *Step) {
			var w Work
			w.Steps = 1
			for i, r := range st.Reqs {
				start, n := int64(st.Plan.Start[i]), int64(st.Plan.Count[i])
				if n == 1 && start >= int64(r.PromptLen) {
					w.DecodeSeqs++
				} else {
					w.PrefillTokens += n
					w.Attention += n * (start + n)
				}
			}
			if w != st.Cost {
				t.Fatalf("step %d: work %+v, want %+v", st.Index, st.Cost, w)
			}
			sum.Add(w)
			tokens += int64(st.Tokens)
		})
		if s.Work != sum || sum.PrefillTokens+sum.DecodeSeqs != tokens || sum.Steps != int64(s.Steps) {
			t.Fatalf("run work %+v, steps summed %+v, %d tokens", s.Work, sum, tokens)
		}
		all := int64(0)
		for _, r := range reqs {
			all += int64(len(r.Prompt) + r.OutputLen - 1)
		}
		switch {
		case !caching && (s.Hit != 0 || s.KV().Cached() != 0 || tokens != all):
			t.Fatalf("prefix caching off: %d hit tokens, %d cached blocks, %d computed of %d", s.Hit, s.KV().Cached(), tokens, all)
		case caching && (s.Hit == 0 || tokens != all-s.Hit):
			t.Fatalf("prefix caching on: %d hit tokens, %d computed of %d", s.Hit, tokens, all)
		}
	}
}

// checkHashes: every hashed block a live request holds carries the
// request's own prefix hash at the block's end.
func checkHashes(t *testing.T, s *Sim, st *Step) {
	t.Helper()
	bs := s.cfg.BlockSize
	for _, r := range s.running {
		for i, b := range r.blocks {
			if h, ok := s.blocks.Hash(b); ok && ((i+1)*bs > len(r.H) || h != r.H[(i+1)*bs-1]) {
				t.Fatalf("step %d: request %d block %d (%d) holds a hash not of its prefix", st.Index, r.ID, i, b)
			}
		}
	}
}

func TestReplaceRollsBack(t *testing.T) {
	reqs := randomPrompts(8, 10, 32, 40, 12)
	rng := rand.New(rand.NewPCG(9, 1))
	for i := range reqs {
		from := 1 + rng.IntN(len(reqs[i].Prompt)+5)
		tail := make([]int32, 20)
		for j := range tail {
			tail[j] = rng.Int32N(50000)
		}
		reqs[i].Replace = &Replace{At: from + rng.IntN(len(reqs[i].Prompt)+10-from), From: from, Tokens: tail}
	}
	cfg := Config{NumBlocks: 64, Concurrency: 3, MaxModelLen: 128, MaxBatchedTokens: 32}
	computed := map[int64]int{}
	replaced := 0
	s := runAll(t, cfg, reqs, func(s *Sim, st *Step) {
		checkHashes(t, s, st)
		for i, id := range st.Plan.Replaced {
			from := int(st.Plan.ReplacedFrom[i])
			k := slices.Index(st.Plan.IDs, id)
			if k < 0 || from > computed[id] || int(st.Plan.Start[k]) != from {
				t.Fatalf("step %d: request %d replaced from %d (computed %d) not recomputed from there", st.Index, id, from, computed[id])
			}
			r := st.Reqs[k]
			if !slices.Equal(r.Tokens[from:from+20], reqs[id-1].Replace.Tokens) || r.PromptLen != from+20 {
				t.Fatalf("step %d: request %d tokens from %d are not its replacement", st.Index, id, from)
			}
			replaced++
		}
		for i, id := range st.Plan.IDs {
			computed[id] = int(st.Plan.Start[i] + st.Plan.Count[i])
		}
	})
	if replaced != len(reqs) || s.Replaces != int64(replaced) {
		t.Fatalf("%d replaced (counter %d), want %d", replaced, s.Replaces, len(reqs))
	}
}

func TestSpecDecode(t *testing.T) {
	reqs := randomPrompts(10, 8, 0, 30, 40)
	cfg := Config{NumBlocks: 64, Concurrency: 4, MaxModelLen: 128, SpecTokens: 3, SpecAcceptPct: 60, SpecSeed: 11}
	type span struct {
		r        *Req
		start, n int
		rowH     []uint64
	}
	var prev []span
	check := func() {
		for _, sp := range prev {
			// Accepted rows are the request's own: its prefix hashes.
			if !slices.Equal(sp.r.H[sp.start:sp.start+sp.n], sp.rowH) {
				t.Fatalf("request %d: accepted rows [%d,+%d) not of its prefix", sp.r.ID, sp.start, sp.n)
			}
		}
		prev = prev[:0]
	}
	rejected, drafts := 0, 0
	s := runAll(t, cfg, reqs, func(s *Sim, st *Step) {
		check()
		checkHashes(t, s, st)
		j := 0
		for i, r := range st.Reqs {
			n, acc := int(st.Plan.Count[i]), int(st.Accepted[i])
			if acc < 1 || acc > n {
				t.Fatalf("step %d: request %d accepts %d of %d", st.Index, r.ID, acc, n)
			}
			if n > 1 && r.computed >= r.PromptLen {
				drafts += n - 1
				rejected += n - acc
				if n-acc > 0 && slices.Equal(st.RowH[j:j+n], r.H[r.computed:min(len(r.H), r.computed+n)]) {
					t.Fatalf("step %d: request %d's rejected rows have its prefix", st.Index, r.ID)
				}
			}
			prev = append(prev, span{r, int(st.Plan.Start[i]), acc, slices.Clone(st.RowH[j : j+acc])})
			j += n
		}
		if st.PureDecode && st.Tokens != len(st.Plan.IDs) {
			t.Fatalf("step %d: pure decode with drafts", st.Index)
		}
	})
	check()
	if drafts == 0 || rejected == 0 || rejected == drafts || s.Rejected != int64(rejected) || s.Drafts != int64(drafts) {
		t.Fatalf("%d drafts, %d rejected (counters %d, %d)", drafts, rejected, s.Drafts, s.Rejected)
	}
}
