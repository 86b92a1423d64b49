package cachetest

// Begins that fail: a step's forward fails after Begin (Abort), or its Save
// fails, and the cache must return to the state before that Begin, exactly.
// The model does the same (saveModel, restoreModel), and a Runner begins
// plans the engine could have run instead of the real step and abandons
// them (Action.failed): an oracle that never saw them then checks every
// later row.

import (
	"maps"
	"math/rand/v2"
	"slices"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
)

// modelUndo is the delivery model as it stood before a Begin: its maps, and
// the saved steps' expectations a replace changed.
type modelUndo struct {
	live         map[int64]bool
	lens, preLen map[int64]int
	pendingHit   map[int64][]int32
	rws          []rwSnap
	saved        bool
}

// rwSnap is a step's expectation of one request before a replace changed it.
type rwSnap struct {
	rw  *reqWant
	old reqWant
}

// saveModel records the delivery model before a Begin changes it.
func (h *Harness) saveModel() modelUndo {
	h.dmu.Lock()
	defer h.dmu.Unlock()
	return modelUndo{live: maps.Clone(h.live), lens: maps.Clone(h.lens), preLen: maps.Clone(h.preLen),
		pendingHit: maps.Clone(h.pendingHit), saved: true}
}

// restoreModel puts the delivery model back as saveModel found it (the
// Begin was aborted, or its Save failed), the last change undone first.
func (h *Harness) restoreModel(u *modelUndo) {
	if !u.saved {
		return
	}
	h.dmu.Lock()
	defer h.dmu.Unlock()
	h.live, h.lens, h.preLen, h.pendingHit = u.live, u.lens, u.preLen, u.pendingHit
	for i := len(u.rws) - 1; i >= 0; i-- {
		*u.rws[i].rw = u.rws[i].old
	}
	*u = modelUndo{}
}

// Failed begins (failedBegin.save).
const (
	failAbort     = iota // the forward fails: Abort
	failSaveToken        // Save with one token too many: ErrTokenCount
	failSaveRows         // Save with a tensor a row short: ErrOutputs
	failSaveNil          // Save(nil): ErrOutputs
	failSaveOmit         // Save omitting the required hidden key: ErrOutputs
	numFail
)

// failedBegin is a step begun and abandoned before the real one: a plan the
// engine could have run instead (generated from a copy of its state), with
// its own block-table changes, whose forward fails (Abort) or whose Save
// fails. The cache must come out as if it never was begun.
type failedBegin struct {
	step     Step
	unassign []int64
	assign   []assignment
	bump     []int64
	save     int // failAbort, failSave*
}

// tableState is the harness's block table and content versions.
type tableState struct {
	rowOf    map[int64]int32
	table    [][]int32
	freeRows []int32
	ver      map[int64]int
}

func (h *Harness) saveTable() tableState {
	t := make([][]int32, len(h.table))
	for i, r := range h.table {
		t[i] = slices.Clone(r)
	}
	return tableState{rowOf: maps.Clone(h.rowOf), table: t, freeRows: slices.Clone(h.freeRows), ver: maps.Clone(h.ver)}
}

// applyTable applies a step's block-table changes: the rows of finished
// requests returned, new rows assigned, content versions bumped.
func (h *Harness) applyTable(unassign []int64, assign []assignment, bump []int64) {
	for _, id := range unassign {
		h.Unassign(id)
	}
	for _, as := range assign {
		h.Assign(as.id, as.blocks...)
	}
	for _, id := range bump {
		h.Bump(id)
	}
}

func (h *Harness) restoreTable(s tableState) {
	h.rowOf, h.table, h.freeRows, h.ver = s.rowOf, s.table, s.freeRows, s.ver
}

// abortStats are the Stats fields that are the cache's state: an abandoned
// Begin leaves them as they were. (What it wrote out stays written: the
// decode buffer, the deferred rows of the requests it finished; counters
// of that work may move.)
func abortStats(st omnicache.Stats) [4]int64 {
	return [4]int64{st.Steps, st.HitRequests, st.HitTokens, int64(st.LiveRequests)}
}

// failBegin begins fb's plan on the harness's table with fb's changes,
// abandons it as fb says, and checks that the cache's state did not move;
// the harness's table and model never saw it. A replace of a request that
// an asynchronous Materialize in flight may read is left out (that read
// could take its step while the replace holds: the documented window).
func (r *Runner) failBegin(fb failedBegin) {
	h := r.h
	h.T.Helper()
	saved := h.saveTable()
	defer h.restoreTable(saved)
	h.applyTable(fb.unassign, fb.assign, fb.bump)
	st := fb.step
	if len(st.Replaced) > 0 && len(h.asyncOpen) > 0 {
		st.Replaced = maps.Clone(st.Replaced)
		for sid := range h.asyncOpen {
			for _, rw := range h.want(sid).reqs {
				delete(st.Replaced, rw.id)
			}
		}
	}
	before := h.Stats()
	require.NoError(h.T, h.BeginPlan(h.Plan(st)), "%sBegin of a plan abandoned before step %d", h.prefix(), r.i)
	what := "Abort"
	if fb.save == failAbort {
		require.NoError(h.T, Guard(h.T, h.prefix()+"Abort", h.C.Abort), "%sAbort", h.prefix())
	} else {
		o, want := h.failingOutputs(st, fb.save)
		res := Guard(h.T, h.prefix()+"Save", func() saveResult {
			id, err := h.C.Save(o)
			return saveResult{id, err}
		})
		require.ErrorIs(h.T, res.err, want, "%sa failing Save (%d) of a plan abandoned before step %d", h.prefix(), fb.save, r.i)
		what = "a failed Save"
	}
	require.Equal(h.T, abortStats(before), abortStats(h.Stats()), "%s%s changed the cache (steps, hits, hit tokens, live requests)", h.prefix(), what)
	r.stepAborts++
}

// failingOutputs are outputs for st's plan that Save refuses (kind
// failSave*) with the error it must return: non-owned host tensors.
func (h *Harness) failingOutputs(st Step, kind int) (*omnicache.Outputs, error) {
	n := 0
	for _, s := range st.Sched {
		n += s.Count()
	}
	o := &omnicache.Outputs{Tokens: n, Padded: n}
	for _, k := range h.Cfg.Keys {
		o.Tensors = append(o.Tensors, omnicache.Tensor{Host: make([]byte, n*k.RowBytes), Rows: n})
	}
	switch kind {
	case failSaveToken:
		o.Tokens++
		return o, omnicache.ErrTokenCount
	case failSaveRows:
		if n == 0 {
			o.Tensors = o.Tensors[:len(o.Tensors)-1]
		} else {
			o.Tensors[0].Rows--
		}
	case failSaveNil:
		return nil, omnicache.ErrOutputs
	case failSaveOmit:
		o.Tensors[0] = omnicache.Tensor{}
	}
	return o, omnicache.ErrOutputs
}

// clone is a deep copy of e whose Next draws from a PRNG of its own
// (seeded with seed): its schedule is one e could have run, and running it
// changes nothing of e. It generates no abandoned plans of its own.
func (e *Engine) clone(seed uint64) *Engine {
	c := *e
	c.rng = rand.New(rand.NewPCG(seed, seed^0xab0d))
	c.omitRng = nil
	c.noAlt = true
	c.ref, c.filled, c.written = slices.Clone(e.ref), slices.Clone(e.filled), slices.Clone(e.written)
	c.free = slices.Clone(e.free)
	c.running, c.preempted, c.complete = slices.Clone(e.running), slices.Clone(e.preempted), slices.Clone(e.complete)
	c.pendingHit, c.spec = maps.Clone(e.pendingHit), maps.Clone(e.spec)
	c.reqs = make(map[int64]*request, len(e.reqs))
	for id, r := range e.reqs {
		rc := *r
		rc.blocks = slices.Clone(r.blocks)
		c.reqs[id] = &rc
	}
	return &c
}

// abandoned generates, from a copy of e, a step e could run now (step i of
// a schedule drawn from seed), to be begun and abandoned as kind says
// (failAbort, failSave*) before e's real step; e is unchanged but for its
// counts.
func (e *Engine) abandoned(i int, seed uint64, kind int) failedBegin {
	c := e.clone(seed)
	act := c.Next(i)
	fb := failedBegin{step: act.Step, unassign: act.unassign, assign: act.assign, bump: act.bump, save: kind}
	n := &e.Counts
	n.Abandoned++
	if kind != failAbort {
		n.FailedSaves++
	}
	st := act.Step
	for _, a := range st.Arrive {
		if a.Hit > 0 {
			n.AbandonedHit++
			break
		}
	}
	count := func(ids []int64, c *int) {
		if len(ids) > 0 {
			*c++
		}
	}
	count(st.Finished, &n.AbandonedFinish)
	count(st.Preempted, &n.AbandonedPreempt)
	count(st.Resumed, &n.AbandonedResume)
	if len(st.Replaced) > 0 {
		n.AbandonedReplace++
	}
	return fb
}

// WithoutAbandoned returns acts without their abandoned plans (the same
// schedule, each step run only as generated).
func WithoutAbandoned(acts []Action) []Action {
	out := slices.Clone(acts)
	for i := range out {
		out[i].failed = nil
	}
	return out
}
