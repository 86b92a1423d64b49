package cachetest

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
)

// S schedules request S[0] for S[2] tokens from position S[1]: a test
// writes it as {id, start, count}.
type S [3]int64

// ID is the scheduled request.
func (s S) ID() int64 { return s[0] }

// Start is the position its first token is at.
func (s S) Start() int { return int(s[1]) }

// Count is how many tokens it computes in the step.
func (s S) Count() int { return int(s[2]) }

// A is an arrival with Hit tokens of prefix hit. Blocks nil takes the hit's
// block ids from the request's block-table row; a non-nil Blocks is sent as
// given (use []int32{} for "no block ids").
type A struct {
	ID     int64
	Hit    int
	Blocks []int32
}

// Step is one real step as the test writes it: the plan's scheduled
// requests (in batch order), arrivals, and finished, preempted and resumed
// requests.
type Step struct {
	Sched                        []S
	Arrive                       []A
	Finished, Preempted, Resumed []int64
	// Replaced: live requests whose tokens from the given position on were
	// replaced; Accepted: per scheduled request, how many of its tokens
	// were accepted (speculative decoding; absent: all).
	Replaced map[int64]int
	Accepted map[int64]int
	// ResultInto: the plan's Plan.ResultInto (the engine's buffers for
	// the step's prefetched hit rows).
	ResultInto [][]byte
	// ResultDev: the plan's Plan.ResultDev (the engine's device buffers
	// for the step's Result); MatCall of the whole step then
	// MaterializeDevs into them.
	ResultDev []gpu.Buffer
}

// reqWant is what Materialize must return for one request of a step.
type reqWant struct {
	id       int64
	start    int
	count    int
	ver      int
	prefix   [][]Tag // [key][row]: the hit prefix as it stood at Save
	hitSlots []int32
	hitFrom  []int // per hit slot: ordinal of the step that last wrote it at Save (0: none)
	// hitRejected: a hit slot held a rejected draft at Save (the step's
	// own, or an earlier step's not written since): the read meets it
	// stale (ErrReassigned) even once a later step rewrote the slot.
	hitRejected bool
	omit        []bool // per key: the step omitted it (its own rows read as zeros)
	acc         int    // tokens accepted of count (speculative decoding)
	// end: the position its delivered rows end at (start+acc, less when a
	// replace cut them); loose: a replace cut them while an asynchronous
	// Materialize may already have taken the step (either is right).
	end   int
	loose bool
	// takenEnd: with loose, the end before the cut, which a Materialize
	// that took the step before the replace delivered up to.
	takenEnd int
	// dlCap: a replace after this step moved the request's delivery back
	// to dlCap: what this step delivered counts only up to there.
	dlCap int
	// floor: the request resumed after a preemption and this step may
	// recompute rows it already had: Materialize leaves out those below
	// what its older steps deliver (see Harness.expectSkip).
	floor    bool
	floorMax int // the length the request had when it was preempted
}

type stepWant struct {
	ord  int // the step's ordinal in this harness (1, 2, ...)
	reqs []reqWant
	byID map[int64]int
}

type pendingStep struct {
	st    Step
	slots map[int64][]int32 // rows' slots per scheduled request
	hits  map[int64][]int32 // hit slots per arrival that really hits
	vers  map[int64]int
	fresh []int64      // ids this Begin made live (a failed Save undoes them)
	undo  modelUndo    // the model as it stood before this Begin (abort.go)
	into  [][]byte     // the plan's ResultInto buffers (Harness.ResultInto)
	dev   []gpu.Buffer // the plan's ResultDev buffers (Harness.ResultDev)
}

// Harness is the engine side of one cache, and the oracle of what it must
// serve (see the package doc).
type Harness struct {
	T   testing.TB       // the test (the harness fails it)
	Cfg omnicache.Config // the cache's config
	C   *omnicache.Cache // the cache, closed when the test ends
	// Res is the Result the checked Materialize calls (Mat, MatCall) fill.
	Res omnicache.Result
	// Label, when set, prefixes every failure message ("[buffer on] ").
	Label string

	// Tensor modes for the outputs the harness builds. DevKeys and
	// OwnKeys, when set, override Device and Owned per key: a device
	// tensor, and one handed to the cache (Tensor.Owned).
	Device, Owned    bool
	DevKeys, OwnKeys []bool
	// OmitKeys, when set, makes the outputs omit key k (a zero Tensor{})
	// where OmitKeys[k]: the step did not emit it.
	OmitKeys []bool
	// NoScribble leaves non-owned output buffers alone after Save (by
	// default they are overwritten, as an engine reuses its buffers).
	NoScribble bool
	// KeepRows records every materialized row (Capture) to compare two
	// caches run through one schedule (CompareCaptures).
	KeepRows bool
	// Into makes MatCall read into buffers of the test's own
	// (Result.Into), sized with Cache.StepRows, and check that every
	// served row landed in them.
	Into bool
	// ResultInto begins every step with Plan.ResultInto buffers of the
	// test's own, sized for the step's whole Result, and makes MatCall of
	// the whole step read into them (Result.Into): a prefetched hit is
	// read into them during the "forward", and every row must be there.
	ResultInto bool
	// ResultDev begins every step with Plan.ResultDev buffers (host
	// memory as the host device's buffers), sized for the step's whole
	// Result, and makes MatCall of the whole step MaterializeDev into
	// them: every row must be there, in place.
	ResultDev bool
	// DevReady counts the ready calls of those MaterializeDevs (copies
	// into the buffers issued).
	DevReady int
	// Stride is the block table's stride of the plans (Stride by default).
	Stride int

	closed bool

	rowOf    map[int64]int32
	table    [][]int32
	freeRows []int32
	ver      map[int64]int
	live     map[int64]bool
	usableID int64 // the last request id Usable took

	model     [][]Tag // [key][slot]
	writtenAt []int   // [slot] ordinal of the step that last wrote it
	tokensAt  []int   // [ordinal] tokens the step saved
	// unknown marks slots whose content the model does not know (a failed
	// Save may or may not have written them); CheckMirror skips them.
	unknown []bool
	// rejected marks the slots of rejected drafts not written since.
	rejected map[int32]bool

	pending *pendingStep
	nsteps  int
	wants   map[omnicache.StepID]*stepWant

	// rows holds every materialized row (KeepRows); reassigned the steps
	// (ordinals) whose delayed read failed with ErrReassigned.
	rows       map[rowKey][]byte
	reassigned map[int]bool

	// Delivery model (the cache's delivery positions): lens are the
	// positions each request's saved steps cover; preLen the length a
	// preempted request had (until it is saved past it); discarded the
	// steps consumed by Discard (they deliver nothing); failedReq the
	// requests a step could not serve.
	lens   map[int64]int
	preLen map[int64]int
	// pendingHit is, per request, the hit slots of a hit registered
	// (an arrival, or a resume with a hit) and not served yet: the cache
	// serves it with the request's first scheduled step (a preemption
	// drops it, a replace cuts it).
	pendingHit map[int64][]int32
	discarded  map[omnicache.StepID]bool
	failedReq  map[omnicache.StepID]map[int64]bool
	order      []omnicache.StepID // saved step ids, in Save order
	dmu        sync.Mutex         // the delivery model's maps (Verify may run on several goroutines)
	consumed   map[omnicache.StepID]bool
	served     map[omnicache.StepID]map[int64]bool
	// asyncVerify: the result being verified came from an asynchronous
	// Materialize, whose take ran at a time the harness does not know.
	asyncVerify bool
	// asyncOpen: steps an asynchronous Materialize was started for and not
	// yet checked (it may have taken its step at any time).
	asyncOpen map[omnicache.StepID]bool
	// resultInto: the ResultInto buffers of saved steps not consumed yet.
	resultInto map[omnicache.StepID][][]byte
	// resultDev: the ResultDev buffers of saved steps not consumed yet.
	resultDev map[omnicache.StepID][]gpu.Buffer
}

// replaced models a replace of request id from position at: its length
// becomes at, and steps saved before and not consumed yet deliver none of
// its rows from at on. It records what it changes in u.
func (h *Harness) replaced(id int64, at int, u *modelUndo) {
	h.dmu.Lock()
	defer h.dmu.Unlock()
	h.lens[id] = at
	if pl, ok := h.preLen[id]; ok && pl > at {
		h.preLen[id] = at
	}
	if hs, ok := h.pendingHit[id]; ok && len(hs) > at {
		bs := h.Cfg.BlockSize
		h.pendingHit[id] = hs[:at/bs*bs] // cut to the blocks before at
	}
	for _, sid := range h.order {
		sw := h.wants[sid]
		j, ok := sw.byID[id]
		if !ok {
			continue
		}
		rw := &sw.reqs[j]
		u.rws = append(u.rws, rwSnap{rw, *rw})
		rw.dlCap = min(rw.dlCap, at)
		if h.consumed[sid] {
			continue
		}
		lo := rw.start - len(rw.hitSlots)
		if e := max(lo, min(rw.end, at)); e < rw.end {
			if h.asyncOpen[sid] && !rw.loose {
				rw.takenEnd = rw.end
			}
			rw.end = e
			rw.loose = rw.loose || h.asyncOpen[sid]
		}
	}
}

// rowKey names the rows of one request and key in one step.
type rowKey struct {
	ord int
	req int64
	key string
}

func (r rowKey) String() string { return fmt.Sprintf("step #%d req %d key %q", r.ord, r.req, r.key) }

// New creates a cache of cfg and the harness in front of it; the cache is
// closed when the test ends.
func New(t testing.TB, cfg omnicache.Config) *Harness {
	t.Helper()
	c, err := omnicache.New(cfg)
	require.NoError(t, err, "omnicache.New of a valid config")
	require.NotNil(t, c, "omnicache.New returned a nil cache")
	h := &Harness{
		T:      t,
		Cfg:    cfg,
		C:      c,
		Stride: Stride,
		rowOf:  map[int64]int32{},
		ver:    map[int64]int{},
		live:   map[int64]bool{},
		wants:  map[omnicache.StepID]*stepWant{},
		lens:   map[int64]int{}, preLen: map[int64]int{}, pendingHit: map[int64][]int32{}, discarded: map[omnicache.StepID]bool{},
		failedReq: map[omnicache.StepID]map[int64]bool{},
		consumed:  map[omnicache.StepID]bool{}, served: map[omnicache.StepID]map[int64]bool{},
		resultInto: map[omnicache.StepID][][]byte{},
		resultDev:  map[omnicache.StepID][]gpu.Buffer{},
		asyncOpen:  map[omnicache.StepID]bool{},
		rows:       map[rowKey][]byte{},

		reassigned: map[int]bool{},
		usableID:   5000,
	}
	nslots := cfg.NumBlocks * cfg.BlockSize
	h.model = make([][]Tag, len(cfg.Keys))
	for k := range h.model {
		h.model[k] = make([]Tag, nslots)
	}
	h.writtenAt = make([]int, nslots)
	h.tokensAt = []int{0}
	h.unknown = make([]bool, nslots)
	h.rejected = map[int32]bool{}
	t.Cleanup(h.close)
	return h
}

func (h *Harness) prefix() string {
	if h.Label == "" {
		return ""
	}
	return "[" + h.Label + "] "
}

func (h *Harness) close() {
	if h.closed {
		return
	}
	h.closed = true
	Guard(h.T, h.prefix()+"Close", func() error { return h.C.Close() })
}

// MarkClosed tells the harness the test closed the cache itself: it is
// not closed again when the test ends.
func (h *Harness) MarkClosed() { h.closed = true }

// Assign gives request id a block-table row holding blocks (replacing any
// previous row content).
func (h *Harness) Assign(id int64, blocks ...int32) {
	h.T.Helper()
	require.LessOrEqual(h.T, len(blocks), h.Stride, "harness: more blocks than the table stride")
	r, ok := h.rowOf[id]
	if !ok {
		if n := len(h.freeRows); n > 0 {
			r = h.freeRows[n-1]
			h.freeRows = h.freeRows[:n-1]
		} else {
			r = int32(len(h.table))
			h.table = append(h.table, nil)
		}
		h.rowOf[id] = r
	}
	h.table[r] = append([]int32(nil), blocks...)
}

// Unassign returns id's table row for reuse by a later request.
func (h *Harness) Unassign(id int64) {
	if r, ok := h.rowOf[id]; ok {
		delete(h.rowOf, id)
		h.table[r] = nil
		h.freeRows = append(h.freeRows, r)
	}
}

// Bump changes the content version of id's future rows (a recompute, a
// new life of the id).
func (h *Harness) Bump(id int64) { h.ver[id]++ }

func (h *Harness) slotOf(id int64, pos int) int32 {
	r, ok := h.rowOf[id]
	if !ok {
		return -1
	}
	bl := h.table[r]
	if pos < 0 || pos/h.Cfg.BlockSize >= len(bl) {
		return -1
	}
	return bl[pos/h.Cfg.BlockSize]*int32(h.Cfg.BlockSize) + int32(pos%h.Cfg.BlockSize)
}

func (h *Harness) hitBlocks(a A) []int32 {
	if a.Blocks != nil {
		return a.Blocks
	}
	r, ok := h.rowOf[a.ID]
	if !ok || a.Hit <= 0 {
		return nil
	}
	n := min(a.Hit/h.Cfg.BlockSize, len(h.table[r]))
	return h.table[r][:n]
}

// Plan builds the engine's plan for st.
func (h *Harness) Plan(st Step) *omnicache.Plan {
	h.T.Helper()
	p := &omnicache.Plan{Stride: h.Stride}
	p.Table = make([]int32, len(h.table)*h.Stride)
	for r, bl := range h.table {
		copy(p.Table[r*h.Stride:], bl)
	}
	for _, s := range st.Sched {
		r, ok := h.rowOf[s.ID()]
		if !ok {
			h.T.Fatalf("harness: request %d is scheduled but has no block-table row (call Assign)", s.ID())
		}
		if s.Count() > 0 && (s.Start()+s.Count()-1)/h.Cfg.BlockSize >= len(h.table[r]) {
			h.T.Fatalf("harness: request %d is scheduled up to position %d but has only %d blocks assigned", s.ID(), s.Start()+s.Count()-1, len(h.table[r]))
		}
		p.IDs = append(p.IDs, s.ID())
		p.Rows = append(p.Rows, r)
		p.Start = append(p.Start, int32(s.Start()))
		p.Count = append(p.Count, int32(s.Count()))
	}
	for _, id := range slices.Sorted(maps.Keys(st.Replaced)) {
		p.Replaced = append(p.Replaced, id)
		p.ReplacedFrom = append(p.ReplacedFrom, int32(st.Replaced[id]))
	}
	for _, a := range st.Arrive {
		p.Arrivals = append(p.Arrivals, a.ID)
		p.HitTokens = append(p.HitTokens, int32(a.Hit))
		p.HitBlocks = append(p.HitBlocks, h.hitBlocks(a)...)
	}
	p.Finished = append([]int64(nil), st.Finished...)
	p.Preempted = append([]int64(nil), st.Preempted...)
	p.Resumed = append([]int64(nil), st.Resumed...)
	p.ResultInto = st.ResultInto
	p.ResultDev = st.ResultDev
	return p
}

// scribblePlan overwrites a plan after Begin: plans are borrowed for the
// call only.
func scribblePlan(p *omnicache.Plan) {
	for _, s := range [][]int64{p.IDs, p.Arrivals, p.Finished, p.Preempted, p.Resumed} {
		for i := range s {
			s[i] = -77
		}
	}
	for _, s := range [][]int32{p.Rows, p.Start, p.Count, p.Table, p.HitTokens, p.HitBlocks} {
		for i := range s {
			s[i] = -77
		}
	}
}

// BeginPlan calls Begin with a raw plan (no bookkeeping): for misuse.
func (h *Harness) BeginPlan(p *omnicache.Plan) error {
	h.T.Helper()
	return Guard(h.T, h.prefix()+"Begin", func() error { return h.C.Begin(p) })
}

// TryBegin calls Begin for st (then overwrites its plan, which Begin only
// borrows) and, on success, tracks what the cache registered: finished ids
// leave, arrivals that are not live hit, scheduled ids become live.
func (h *Harness) TryBegin(st Step) error {
	h.T.Helper()
	p := h.Plan(st)
	if h.ResultInto && p.ResultInto == nil {
		p.ResultInto = h.resultBufs(st)
	}
	if h.ResultDev && p.ResultDev == nil && p.ResultInto == nil {
		for _, b := range h.resultBufs(st) {
			p.ResultDev = append(p.ResultDev, gpu.Buffer{Host: b, Size: len(b)})
		}
	}
	err := h.BeginPlan(p)
	scribblePlan(p)
	if err != nil {
		return err
	}
	ps := &pendingStep{st: st, slots: map[int64][]int32{}, hits: map[int64][]int32{}, vers: map[int64]int{}}
	if h.ResultInto {
		ps.into = p.ResultInto // MatCall of the whole step reads into them (a test's own are its own to use)
	}
	if h.ResultDev || st.ResultDev != nil {
		ps.dev = p.ResultDev // MatCall of the whole step: MaterializeDev into them
	}
	ps.undo = h.saveModel()
	for id, at := range st.Replaced {
		h.replaced(id, at, &ps.undo)
	}
	for _, id := range st.Preempted {
		if h.live[id] {
			h.preLen[id] = h.lens[id]
		}
		delete(h.pendingHit, id) // goes with the KV it came from
	}
	for _, f := range st.Finished {
		delete(h.live, f)
		delete(h.preLen, f)
		delete(h.pendingHit, f)
	}
	bs := h.Cfg.BlockSize
	for _, a := range st.Arrive {
		if !h.live[a.ID] {
			ps.fresh = append(ps.fresh, a.ID)
			delete(h.lens, a.ID)
		}
		rehit := h.live[a.ID] && slices.Contains(st.Resumed, a.ID) // a preempted request resuming with a hit
		if (!h.live[a.ID] || rehit) && a.Hit > 0 {
			bl := h.hitBlocks(a)
			var hs []int32
			for j := 0; j < a.Hit && j/bs < len(bl); j++ {
				hs = append(hs, bl[j/bs]*int32(bs)+int32(j%bs))
			}
			h.pendingHit[a.ID] = hs // served by its first scheduled step: this one, or a later one
		}
		h.live[a.ID] = true
	}
	for _, s := range st.Sched {
		if !h.live[s.ID()] {
			ps.fresh = append(ps.fresh, s.ID())
			delete(h.lens, s.ID())
		}
		h.live[s.ID()] = true
		if hs, ok := h.pendingHit[s.ID()]; ok {
			ps.hits[s.ID()] = hs
			delete(h.pendingHit, s.ID())
		}
		sl := make([]int32, s.Count())
		for j := range sl {
			sl[j] = h.slotOf(s.ID(), s.Start()+j)
		}
		ps.slots[s.ID()] = sl
		ps.vers[s.ID()] = h.ver[s.ID()]
	}
	h.pending = ps
	return nil
}

// AbortBegun aborts the begun step (its forward failed): the cache returns
// to the state before its Begin, and so does the model, as for a failed
// Save.
func (h *Harness) AbortBegun() {
	h.T.Helper()
	ps := h.pending
	h.pending = nil
	require.NoError(h.T, Guard(h.T, h.prefix()+"Abort", h.C.Abort), h.prefix()+"Abort")
	if ps != nil {
		h.restoreModel(&ps.undo)
	}
}

// Begin calls Begin for st and fails the test on an error.
func (h *Harness) Begin(st Step) {
	h.T.Helper()
	require.NoError(h.T, h.TryBegin(st), h.prefix()+"Begin")
}

// resultBufs makes ResultInto buffers for st's whole Result: its scheduled
// tokens and the hit tokens of its arrivals that it schedules (0xA5 rows:
// a row left unwritten shows).
func (h *Harness) resultBufs(st Step) [][]byte {
	rows := 0
	for _, s := range st.Sched {
		rows += s.Count()
		for _, a := range st.Arrive {
			if a.ID == s.ID() {
				rows += a.Hit
			}
		}
	}
	bufs := make([][]byte, len(h.Cfg.Keys))
	for k, key := range h.Cfg.Keys {
		bufs[k] = bytes.Repeat([]byte{0xA5}, rows*key.RowBytes)
	}
	return bufs
}
