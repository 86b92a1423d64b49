package replay

import (
	"errors"
	"fmt"

	"github.com/omnicache/omnicache"
)

// fakeCache is a deliberately simple, synchronous implementation of the
// engine contract, used to test the replay driver and its verifier before
// (and independently of) the real core: Save writes the step's rows straight
// into a per-key mirror and snapshots the hit prefix rows of the step's
// arrivals right then (a same-step hit reads rows written by this Save).
type fakeCache struct {
	cfg    omnicache.Config
	mirror [][]byte
	begun  bool
	plan   fakePlan
	steps  map[omnicache.StepID]*fakeStep
	next   omnicache.StepID
	stats  omnicache.Stats
	res    fakeRows
	closed bool
	// delivered is, per request, the position its rows were delivered up
	// to: as the real cache, a request that recomputes rows (after a
	// preemption) gets none of them again.
	delivered map[int64]int

	// Faults for testing the verifier.
	corruptStep int  // flip a byte in this step's materialized rows (-1: never)
	skipMirror  bool // never write the mirror (stale/zero prefix rows)
	shiftHits   bool // read hit prefixes from the wrong block
}

type fakePlan struct {
	ids    []int64
	start  []int32
	slots  [][]int32 // per scheduled request, its slots
	hitIDs map[int64][]int32
}

type fakeStep struct {
	index  int
	ids    []int64
	start  map[int64]int
	prefix map[int64][][]byte // per request per key
	rows   map[int64][][]byte // this step's rows per request per key
}

func newFakeCache(cfg omnicache.Config) (*fakeCache, error) {
	if cfg.NumBlocks <= 0 || cfg.BlockSize <= 0 || len(cfg.Keys) == 0 {
		return nil, fmt.Errorf("fake: %w", omnicache.ErrConfig)
	}
	f := &fakeCache{cfg: cfg, steps: map[omnicache.StepID]*fakeStep{}, corruptStep: -1, delivered: map[int64]int{}}
	for _, k := range cfg.Keys {
		f.mirror = append(f.mirror, make([]byte, cfg.NumBlocks*cfg.BlockSize*k.RowBytes))
	}
	return f, nil
}

func (f *fakeCache) Begin(p *omnicache.Plan) error {
	if f.closed {
		return omnicache.ErrClosed
	}
	if f.begun {
		return omnicache.ErrSequence
	}
	bs := f.cfg.BlockSize
	f.plan = fakePlan{hitIDs: map[int64][]int32{}}
	off := 0
	for i, id := range p.Arrivals {
		h := int(p.HitTokens[i])
		if h%bs != 0 {
			return omnicache.ErrUnalignedHit
		}
		if off+h/bs > len(p.HitBlocks) {
			return omnicache.ErrHitBlocks
		}
		var sl []int32
		for _, b := range p.HitBlocks[off : off+h/bs] {
			for j := range bs {
				sl = append(sl, b*int32(bs)+int32(j))
			}
		}
		off += h / bs
		if h > 0 {
			f.plan.hitIDs[id] = sl
		}
	}
	if off != len(p.HitBlocks) {
		return omnicache.ErrHitBlocks
	}
	for i, id := range p.IDs {
		var sl []int32
		for pos := p.Start[i]; pos < p.Start[i]+p.Count[i]; pos++ {
			b := p.Table[int(p.Rows[i])*p.Stride+int(pos)/bs]
			sl = append(sl, b*int32(bs)+pos%int32(bs))
		}
		f.plan.ids = append(f.plan.ids, id)
		f.plan.start = append(f.plan.start, p.Start[i])
		f.plan.slots = append(f.plan.slots, sl)
	}
	f.begun = true
	return nil
}

func (f *fakeCache) Save(o *omnicache.Outputs) (omnicache.StepID, error) {
	if !f.begun {
		return 0, omnicache.ErrSequence
	}
	f.begun = false
	n := 0
	for _, sl := range f.plan.slots {
		n += len(sl)
	}
	if o.Tokens != n {
		return 0, omnicache.ErrTokenCount
	}
	st := &fakeStep{index: int(f.next), start: map[int64]int{}, prefix: map[int64][][]byte{}, rows: map[int64][][]byte{}}
	j := 0
	for i, id := range f.plan.ids {
		st.ids = append(st.ids, id)
		per := make([][]byte, len(f.cfg.Keys))
		for k, kk := range f.cfg.Keys {
			rb := kk.RowBytes
			src := o.Tensors[k].Host[j*rb : (j+len(f.plan.slots[i]))*rb]
			per[k] = append([]byte(nil), src...)
			if !f.skipMirror {
				for t, s := range f.plan.slots[i] {
					copy(f.mirror[k][int(s)*rb:], src[t*rb:(t+1)*rb])
				}
			}
			f.stats.RowsWritten += int64(len(f.plan.slots[i]))
			f.stats.BytesWritten += int64(len(src))
		}
		st.rows[id] = per
		st.start[id] = int(f.plan.start[i])
		j += len(f.plan.slots[i])
	}
	for id, sl := range f.plan.hitIDs {
		if f.shiftHits {
			n := int32(f.cfg.NumBlocks * f.cfg.BlockSize)
			sl = append([]int32(nil), sl...)
			for i := range sl {
				sl[i] = (sl[i] + int32(f.cfg.BlockSize)) % n
			}
		}
		st.prefix[id] = f.read(sl)
	}
	f.next++
	f.steps[f.next] = st
	f.stats.Steps++
	return f.next, nil
}

func (f *fakeCache) read(sl []int32) [][]byte {
	out := make([][]byte, len(f.cfg.Keys))
	for k, kk := range f.cfg.Keys {
		rb := kk.RowBytes
		for _, s := range sl {
			out[k] = append(out[k], f.mirror[k][int(s)*rb:int(s+1)*rb]...)
		}
	}
	return out
}

func (f *fakeCache) Materialize(id omnicache.StepID, reqs []int64) (Rows, error) {
	st, ok := f.steps[id]
	if !ok {
		return nil, omnicache.ErrUnknownStep
	}
	delete(f.steps, id)
	f.res = fakeRows{}
	for _, r := range reqs {
		rows, ok := st.rows[r]
		if !ok {
			return nil, omnicache.ErrNotInStep
		}
		pre := st.prefix[r]
		n := len(rows[0]) / f.cfg.Keys[0].RowBytes
		p := 0
		if pre != nil {
			p = len(pre[0]) / f.cfg.Keys[0].RowBytes
		}
		keys := make([][]byte, len(f.cfg.Keys))
		for k := range keys {
			if pre != nil {
				keys[k] = append(keys[k], pre[k]...)
			}
			keys[k] = append(keys[k], rows[k]...)
		}
		if st.index == f.corruptStep && len(keys[0]) > 0 {
			keys[0][len(keys[0])-1] ^= 1
		}
		lo := st.start[r] - p
		skip := max(0, min(f.delivered[r]-lo, p+n))
		for k := range keys {
			keys[k] = keys[k][skip*f.cfg.Keys[k].RowBytes:]
		}
		if p+n-skip > 0 {
			f.delivered[r] = max(f.delivered[r], st.start[r]+n)
		}
		f.res.ids = append(f.res.ids, r)
		f.res.prefix = append(f.res.prefix, max(0, p-skip))
		f.res.tokens = append(f.res.tokens, p+n-skip)
		f.res.from = append(f.res.from, lo+skip)
		f.res.keys = append(f.res.keys, keys)
	}
	return &f.res, nil
}

func (f *fakeCache) Discard(id omnicache.StepID) error {
	if _, ok := f.steps[id]; !ok {
		return omnicache.ErrUnknownStep
	}
	delete(f.steps, id)
	return nil
}

func (f *fakeCache) Sync() error { return nil }

func (f *fakeCache) Peek(k int, slots []int32, dst []byte) error {
	rb := f.cfg.Keys[k].RowBytes
	if len(dst) != len(slots)*rb {
		return errors.New("fake: peek size")
	}
	for i, s := range slots {
		copy(dst[i*rb:(i+1)*rb], f.mirror[k][int(s)*rb:])
	}
	return nil
}

func (f *fakeCache) Stats() omnicache.Stats {
	s := f.stats
	s.PagesInUse = len(f.steps)
	return s
}

func (f *fakeCache) Close() error { f.closed = true; return nil }

type fakeRows struct {
	ids    []int64
	prefix []int
	tokens []int
	from   []int
	keys   [][][]byte
}

func (r *fakeRows) Len() int         { return len(r.ids) }
func (r *fakeRows) ID(i int) int64   { return r.ids[i] }
func (r *fakeRows) Prefix(i int) int { return r.prefix[i] }
func (r *fakeRows) Tokens(i int) int { return r.tokens[i] }
func (r *fakeRows) From(i int) int {
	if r.from == nil {
		return 0
	}
	return r.from[i]
}
func (r *fakeRows) Rows(i, k int) []byte { return r.keys[i][k] }
