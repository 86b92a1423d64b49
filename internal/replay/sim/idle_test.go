package sim

import (
	"errors"
	"slices"
	"testing"
)

// gatedSource hands out its requests only as far as open says, answering
// ErrNoRequestYet past it until closed.
type gatedSource struct {
	reqs   []Request
	i      int
	open   int
	closed bool
}

func (g *gatedSource) Next() (Request, bool, error) {
	switch {
	case g.i < g.open && g.i < len(g.reqs):
		r := g.reqs[g.i]
		g.i++
		return Request{Prompt: slices.Clone(r.Prompt), OutputLen: r.OutputLen, NoExternal: r.NoExternal}, true, nil
	case g.closed:
		return Request{}, false, nil
	}
	return Request{}, false, ErrNoRequestYet
}

// step runs one step to its end (Release and Advance), checking it.
func stepOnce(t *testing.T, s *Sim, live, finished map[int64]bool) *Step {
	t.Helper()
	st, err := s.Next()
	if err != nil || st == nil {
		t.Fatalf("Next: %v, %v", st, err)
	}
	checkStep(t, s, st, live, finished)
	s.Release()
	s.Advance()
	checkRefs(t, s)
	return st
}

// A source with nothing ready idles the simulator without changing it; a
// request finished before the idle is reported by the next real step.
func TestIdleUntilReady(t *testing.T) {
	reqs := randomPrompts(1, 3, 0, 20, 2)
	src := &gatedSource{reqs: reqs}
	s, err := New(Config{NumBlocks: 64, Concurrency: 2, MaxModelLen: 64, BlockSize: 4}, src)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := s.Next(); !errors.Is(err, ErrIdle) || st != nil || s.Steps != 0 {
		t.Fatalf("nothing ready: %v, %v, %d steps; want ErrIdle", st, err, s.Steps)
	}
	live, finished := map[int64]bool{}, map[int64]bool{}
	src.open = 1
	for s.Finished == 0 {
		stepOnce(t, s, live, finished)
	}
	steps := s.Steps
	if _, err := s.Next(); !errors.Is(err, ErrIdle) || s.Steps != steps || s.Live() != 1 || s.Pending() != 0 {
		t.Fatalf("after the only request finished: %v, %d steps (was %d), live %d, pending %d", err, s.Steps, steps, s.Live(), s.Pending())
	}
	src.open = 2
	st := stepOnce(t, s, live, finished)
	if !slices.Equal(st.Plan.Finished, []int64{1}) || !slices.Equal(st.Plan.Arrivals, []int64{2}) {
		t.Fatalf("finished %v, arrivals %v; want the first request reported, the second arriving", st.Plan.Finished, st.Plan.Arrivals)
	}
	src.open, src.closed = 3, true
	drive(t, s, live, finished, nil)
	if s.Finished != 3 || s.KV().NumFree() != s.KV().Len() {
		t.Fatalf("%d finished, %d of %d blocks free", s.Finished, s.KV().NumFree(), s.KV().Len())
	}
}

// loadAll is an External that loads every block asked.
type loadAll struct{ asked int }

func (l *loadAll) Load(hashes []uint64) int { l.asked++; return len(hashes) }

// Abort reports a running request finished in the next step and frees its
// blocks there; the client's next request takes its place. A NoExternal
// request loads nothing through External.
func TestAbortAndNoExternal(t *testing.T) {
	reqs := randomPrompts(2, 3, 0, 21, 8)
	reqs[2].NoExternal = true
	ext := &loadAll{}
	src := &gatedSource{reqs: reqs, open: 3, closed: true}
	s, err := New(Config{NumBlocks: 64, Concurrency: 2, MaxModelLen: 64, BlockSize: 4, External: ext}, src)
	if err != nil {
		t.Fatal(err)
	}
	live, finished := map[int64]bool{}, map[int64]bool{}
	st := stepOnce(t, s, live, finished)
	// Both arrivals loaded their 5 full blocks (20 of 21 tokens).
	if !slices.Equal(st.Plan.TierBlocks, []int32{5, 5}) || len(st.Plan.TierHashes) != 10 || !slices.Equal(st.Plan.HitTokens, []int32{20, 20}) {
		t.Fatalf("tier blocks %v, %d hashes, hits %v", st.Plan.TierBlocks, len(st.Plan.TierHashes), st.Plan.HitTokens)
	}
	if !s.Abort(1) || s.Abort(1) || s.Abort(99) {
		t.Fatal("Abort: want true for a running request, false again and for an unknown one")
	}
	st = stepOnce(t, s, live, finished)
	if !slices.Equal(st.Plan.Finished, []int64{1}) || !slices.Equal(st.Plan.Arrivals, []int64{3}) {
		t.Fatalf("finished %v, arrivals %v; want 1 aborted, 3 arriving", st.Plan.Finished, st.Plan.Arrivals)
	}
	if len(st.Plan.TierBlocks) != 0 || len(st.Plan.TierHashes) != 0 || st.Plan.HitTokens[0] != 0 || ext.asked != 2 {
		t.Fatalf("a NoExternal request: tier blocks %v, hit %v, External asked %d times", st.Plan.TierBlocks, st.Plan.HitTokens, ext.asked)
	}
	drive(t, s, live, finished, nil)
	if s.Finished != 2 || s.Aborted != 1 || s.KV().NumFree() != s.KV().Len() {
		t.Fatalf("%d finished, %d aborted, %d of %d blocks free", s.Finished, s.Aborted, s.KV().NumFree(), s.KV().Len())
	}
}
