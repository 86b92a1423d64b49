package omnicache_test

// A small engine in front of one cache, shared by the behaviour tests.
//
// Every row the tests hand to the cache is derived from (key, request,
// position, version): its first 8 bytes are the packed tag, the rest a
// splitmix64 stream seeded by the tag. A misplaced, stale or foreign row is
// therefore detected and named in the failure message ("k0/req2/pos5/v0").
//
// The harness keeps a model of the mirror (per key and slot, the tag of the
// latest write in step order) and, for every saved step, the rows
// Materialize must return: the step's own rows, plus, for a request that
// arrived with a hit, the model's rows of the hit slots as they stood once
// the step's own writes were applied (which covers a hit on blocks written
// in the same step).

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
)

const (
	testBlockSize = 4
	testNumBlocks = 16
	testStride    = 8
	// deadlockTimeout bounds every call the harness makes: a deadlock
	// detector, not a performance threshold.
	deadlockTimeout = 10 * time.Second
)

// The fixture's keys: a required hidden state, an optional per-token
// tensor and a deferred one (audio codes).
var (
	keyHidden = omnicache.Key{Name: "hidden", RowBytes: 32}
	keyAux    = omnicache.Key{Name: "aux", RowBytes: 8, Optional: true}
	keyCodes  = omnicache.Key{Name: "codes", RowBytes: 12, Deferred: true}
)

// testConfig is the small fixture: 16 blocks of 4 tokens. The staging
// timeout is shorter than the default so that a leaked page fails a test
// with ErrStagingTimeout before the deadlock detector fires.
func testConfig(keys ...omnicache.Key) omnicache.Config {
	if len(keys) == 0 {
		keys = []omnicache.Key{keyHidden, keyAux}
	}
	return omnicache.Config{
		NumBlocks:           testNumBlocks,
		BlockSize:           testBlockSize,
		Keys:                keys,
		StagingClaimTimeout: 5 * time.Second,
	}
}

// ---------------------------------------------------------------- rows

// tag names one row: key, request, position and content version. 0 means
// "absent" (never written): such rows read as zeros.
type tag uint64

// rejectedVer is the content version of a rejected draft's rows.
const rejectedVer = 0xfe

func mkTag(k int, id int64, pos, ver int) tag {
	return tag(uint64(k+1)<<60 | uint64(ver&0xff)<<52 | uint64(id&0xfffffff)<<24 | uint64(pos&0xffffff))
}

func (g tag) String() string {
	if g == 0 {
		return "zeros"
	}
	return fmt.Sprintf("k%d/req%d/pos%d/v%d", int(g>>60)-1, int64(g>>24&0xfffffff), int(g&0xffffff), int(g>>52&0xff))
}

func splitmix64(x *uint64) uint64 {
	*x += 0x9e3779b97f4a7c15
	z := *x
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// fillRow writes the content of row g into dst (zeros for g == 0).
func fillRow(dst []byte, g tag) {
	if g == 0 {
		clear(dst)
		return
	}
	var w [8]byte
	binary.LittleEndian.PutUint64(w[:], uint64(g))
	n := copy(dst, w[:])
	s := uint64(g)
	for n < len(dst) {
		binary.LittleEndian.PutUint64(w[:], splitmix64(&s))
		n += copy(dst[n:], w[:])
	}
}

func rowOf(g tag, rowBytes int) []byte {
	b := make([]byte, rowBytes)
	fillRow(b, g)
	return b
}

// describe names what a row holds, for failure messages.
func describe(b []byte) string {
	zero := true
	for _, x := range b {
		if x != 0 {
			zero = false
			break
		}
	}
	if zero {
		return "zeros"
	}
	if len(b) >= 8 {
		g := tag(binary.LittleEndian.Uint64(b))
		if bytes.Equal(rowOf(g, len(b)), b) {
			return g.String()
		}
	}
	n := min(len(b), 8)
	return fmt.Sprintf("garbage[% x...]", b[:n])
}

// ---------------------------------------------------------------- deadlines

// guard runs f and fails the test if it does not return within
// deadlockTimeout. f must not call t.FailNow.
func guard[T any](t testing.TB, what string, f func() T) T {
	t.Helper()
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	tm := time.NewTimer(deadlockTimeout)
	defer tm.Stop()
	select {
	case v := <-ch:
		return v
	case <-tm.C:
		t.Fatalf("%s did not return within %v: deadlock?", what, deadlockTimeout)
		panic("unreachable")
	}
}

type saveResult struct {
	id  omnicache.StepID
	err error
}

// waitGoroutines polls until the goroutine count is back to base or the
// deadline passes, and fails the test with a stack dump then.
func waitGoroutines(t testing.TB, base int) {
	t.Helper()
	deadline := time.Now().Add(deadlockTimeout)
	for {
		n := runtime.NumGoroutine()
		if n <= base {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("goroutines leaked: %d running, baseline %d\n%s", n, base, buf)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ---------------------------------------------------------------- steps

// S schedules request ID for Count tokens from position Start.
type S struct {
	ID           int64
	Start, Count int
}

// A is an arrival with Hit tokens of prefix hit. Blocks nil takes the hit's
// block ids from the request's block-table row; a non-nil Blocks is sent as
// given (use []int32{} for "no block ids").
type A struct {
	ID     int64
	Hit    int
	Blocks []int32
}

// step is one real step as the test writes it.
type step struct {
	Sched                        []S
	Arrive                       []A
	Finished, Preempted, Resumed []int64
	// Replaced: live requests whose tokens from the given position on were
	// replaced; Accepted: per scheduled request, how many of its tokens
	// were accepted (speculative decoding; absent: all).
	Replaced map[int64]int
	Accepted map[int64]int
}

// reqWant is what Materialize must return for one request of a step.
type reqWant struct {
	id       int64
	start    int
	count    int
	ver      int
	prefix   [][]tag // [key][row]: the hit prefix as it stood at Save
	hitSlots []int32
	hitFrom  []int  // per hit slot: ordinal of the step that last wrote it at Save (0: none)
	omit     []bool // per key: the step omitted it (its own rows read as zeros)
	acc      int    // tokens accepted of count (speculative decoding)
	// end: the position its delivered rows end at (start+acc, less when a
	// replace cut them); loose: a replace cut them while an asynchronous
	// Materialize may already have taken the step (either is right).
	end   int
	loose bool
	// dlCap: a replace after this step moved the request's delivery back
	// to dlCap: what this step delivered counts only up to there.
	dlCap int
	// floor: the request resumed after a preemption and this step may
	// recompute rows it already had: Materialize leaves out those below
	// what its older steps deliver (see harness.expectSkip).
	floor    bool
	floorMax int // the length the request had when it was preempted
}

type stepWant struct {
	ord  int // the step's ordinal in this harness (1, 2, ...)
	reqs []reqWant
	byID map[int64]int
}

type pendingStep struct {
	st    step
	slots map[int64][]int32 // rows' slots per scheduled request
	hits  map[int64][]int32 // hit slots per arrival that really hits
	vers  map[int64]int
	fresh []int64 // ids this Begin made live (a failed Save undoes them)
}

// harness is the engine side of one cache.
type harness struct {
	t     testing.TB
	label string
	cfg   omnicache.Config
	c     *omnicache.Cache

	closed bool

	// Tensor modes for the outputs the harness builds. devKeys/ownKeys,
	// when set, override device/owned per key.
	device, owned    bool
	devKeys, ownKeys []bool
	// omitKeys, when set, makes the outputs omit key k (a zero Tensor{})
	// where omitKeys[k]: the step did not emit it.
	omitKeys []bool
	// noScribble leaves non-owned output buffers alone after Save (by
	// default they are overwritten, as an engine reuses its buffers).
	noScribble bool

	stride   int
	rowOf    map[int64]int32
	table    [][]int32
	freeRows []int32
	ver      map[int64]int
	live     map[int64]bool

	model     [][]tag // [key][slot]
	writtenAt []int   // [slot] ordinal of the step that last wrote it
	tokensAt  []int   // [ordinal] tokens the step saved
	// unknown marks slots whose content the model does not know (a failed
	// Save may or may not have written them); checkMirror skips them.
	unknown []bool
	// rejected marks the slots of rejected drafts not written since.
	rejected map[int32]bool

	pending *pendingStep
	nsteps  int
	wants   map[omnicache.StepID]*stepWant
	res     omnicache.Result

	// keepRows records every materialized row to compare two caches run
	// through one schedule; reassigned holds the steps (ordinals) whose
	// delayed read failed with ErrReassigned.
	keepRows   bool
	rows       map[rowKey][]byte
	reassigned map[int]bool

	// Delivery model (the cache's delivery positions): lens are the
	// positions each request's saved steps cover; preLen the length a
	// preempted request had (until it is saved past it); discarded the
	// steps consumed by Discard (they deliver nothing); failedReq the
	// requests a step could not serve.
	lens      map[int64]int
	preLen    map[int64]int
	discarded map[omnicache.StepID]bool
	failedReq map[omnicache.StepID]map[int64]bool
	order     []omnicache.StepID // saved step ids, in Save order
	dmu       sync.Mutex         // the delivery model's maps (verify may run on several goroutines)
	consumed  map[omnicache.StepID]bool
	served    map[omnicache.StepID]map[int64]bool
	// asyncVerify: the result being verified came from an asynchronous
	// Materialize, whose take ran at a time the harness does not know.
	asyncVerify bool
	// asyncOpen: steps an asynchronous Materialize was started for and not
	// yet checked (it may have taken its step at any time).
	asyncOpen map[omnicache.StepID]bool
}

// replaced models a replace of request id from position at: its length
// becomes at, and steps saved before and not consumed yet deliver none of
// its rows from at on.
func (h *harness) replaced(id int64, at int) {
	h.dmu.Lock()
	defer h.dmu.Unlock()
	h.lens[id] = at
	if pl, ok := h.preLen[id]; ok && pl > at {
		h.preLen[id] = at
	}
	for _, sid := range h.order {
		sw := h.wants[sid]
		j, ok := sw.byID[id]
		if !ok {
			continue
		}
		rw := &sw.reqs[j]
		rw.dlCap = min(rw.dlCap, at)
		if h.consumed[sid] {
			continue
		}
		lo := rw.start - len(rw.hitSlots)
		if e := max(lo, min(rw.end, at)); e < rw.end {
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

func newHarness(t testing.TB, cfg omnicache.Config) *harness {
	t.Helper()
	c, err := omnicache.New(cfg)
	require.NoError(t, err, "omnicache.New of a valid config")
	require.NotNil(t, c, "omnicache.New returned a nil cache")
	h := &harness{
		t:      t,
		cfg:    cfg,
		c:      c,
		stride: testStride,
		rowOf:  map[int64]int32{},
		ver:    map[int64]int{},
		live:   map[int64]bool{},
		wants:  map[omnicache.StepID]*stepWant{},
		lens:   map[int64]int{}, preLen: map[int64]int{}, discarded: map[omnicache.StepID]bool{},
		failedReq: map[omnicache.StepID]map[int64]bool{},
		consumed:  map[omnicache.StepID]bool{}, served: map[omnicache.StepID]map[int64]bool{},
		asyncOpen: map[omnicache.StepID]bool{},
		rows:      map[rowKey][]byte{},

		reassigned: map[int]bool{},
	}
	nslots := cfg.NumBlocks * cfg.BlockSize
	h.model = make([][]tag, len(cfg.Keys))
	for k := range h.model {
		h.model[k] = make([]tag, nslots)
	}
	h.writtenAt = make([]int, nslots)
	h.tokensAt = []int{0}
	h.unknown = make([]bool, nslots)
	h.rejected = map[int32]bool{}
	t.Cleanup(h.close)
	return h
}

func (h *harness) prefix() string {
	if h.label == "" {
		return ""
	}
	return "[" + h.label + "] "
}

func (h *harness) close() {
	if h.closed {
		return
	}
	h.closed = true
	guard(h.t, h.prefix()+"Close", func() error { return h.c.Close() })
}

// assign gives request id a block-table row holding blocks (replacing any
// previous row content).
func (h *harness) assign(id int64, blocks ...int32) {
	h.t.Helper()
	require.LessOrEqual(h.t, len(blocks), h.stride, "harness: more blocks than the table stride")
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

// unassign returns id's table row for reuse by a later request.
func (h *harness) unassign(id int64) {
	if r, ok := h.rowOf[id]; ok {
		delete(h.rowOf, id)
		h.table[r] = nil
		h.freeRows = append(h.freeRows, r)
	}
}

// bump changes the content version of id's future rows (a recompute, a
// new life of the id).
func (h *harness) bump(id int64) { h.ver[id]++ }

func (h *harness) slotOf(id int64, pos int) int32 {
	r, ok := h.rowOf[id]
	if !ok {
		return -1
	}
	bl := h.table[r]
	if pos < 0 || pos/h.cfg.BlockSize >= len(bl) {
		return -1
	}
	return bl[pos/h.cfg.BlockSize]*int32(h.cfg.BlockSize) + int32(pos%h.cfg.BlockSize)
}

func (h *harness) hitBlocks(a A) []int32 {
	if a.Blocks != nil {
		return a.Blocks
	}
	r, ok := h.rowOf[a.ID]
	if !ok || a.Hit <= 0 {
		return nil
	}
	n := min(a.Hit/h.cfg.BlockSize, len(h.table[r]))
	return h.table[r][:n]
}

// plan builds the engine's plan for st.
func (h *harness) plan(st step) *omnicache.Plan {
	h.t.Helper()
	p := &omnicache.Plan{Stride: h.stride}
	p.Table = make([]int32, len(h.table)*h.stride)
	for r, bl := range h.table {
		copy(p.Table[r*h.stride:], bl)
	}
	for _, s := range st.Sched {
		r, ok := h.rowOf[s.ID]
		if !ok {
			h.t.Fatalf("harness: request %d is scheduled but has no block-table row (call assign)", s.ID)
		}
		if s.Count > 0 && (s.Start+s.Count-1)/h.cfg.BlockSize >= len(h.table[r]) {
			h.t.Fatalf("harness: request %d is scheduled up to position %d but has only %d blocks assigned", s.ID, s.Start+s.Count-1, len(h.table[r]))
		}
		p.IDs = append(p.IDs, s.ID)
		p.Rows = append(p.Rows, r)
		p.Start = append(p.Start, int32(s.Start))
		p.Count = append(p.Count, int32(s.Count))
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

// beginPlan calls Begin with a raw plan (no bookkeeping): for misuse.
func (h *harness) beginPlan(p *omnicache.Plan) error {
	h.t.Helper()
	return guard(h.t, h.prefix()+"Begin", func() error { return h.c.Begin(p) })
}

// tryBegin calls Begin for st and, on success, tracks what the cache
// registered: finished ids leave, arrivals that are not live hit,
// scheduled ids become live.
func (h *harness) tryBegin(st step) error {
	h.t.Helper()
	p := h.plan(st)
	err := h.beginPlan(p)
	scribblePlan(p)
	if err != nil {
		return err
	}
	ps := &pendingStep{st: st, slots: map[int64][]int32{}, hits: map[int64][]int32{}, vers: map[int64]int{}}
	for id, at := range st.Replaced {
		h.replaced(id, at)
	}
	for _, id := range st.Preempted {
		if h.live[id] {
			h.preLen[id] = h.lens[id]
		}
	}
	for _, f := range st.Finished {
		delete(h.live, f)
		delete(h.preLen, f)
	}
	bs := h.cfg.BlockSize
	for _, a := range st.Arrive {
		if !h.live[a.ID] {
			ps.fresh = append(ps.fresh, a.ID)
			delete(h.lens, a.ID)
		}
		rehit := h.live[a.ID] && containsID(st.Resumed, a.ID) // a preempted request resuming with a hit
		if (!h.live[a.ID] || rehit) && a.Hit > 0 {
			bl := h.hitBlocks(a)
			var hs []int32
			for j := 0; j < a.Hit && j/bs < len(bl); j++ {
				hs = append(hs, bl[j/bs]*int32(bs)+int32(j%bs))
			}
			ps.hits[a.ID] = hs
		}
		h.live[a.ID] = true
	}
	for _, s := range st.Sched {
		if !h.live[s.ID] {
			ps.fresh = append(ps.fresh, s.ID)
			delete(h.lens, s.ID)
		}
		h.live[s.ID] = true
		sl := make([]int32, s.Count)
		for j := range sl {
			sl[j] = h.slotOf(s.ID, s.Start+j)
		}
		ps.slots[s.ID] = sl
		ps.vers[s.ID] = h.ver[s.ID]
	}
	h.pending = ps
	return nil
}

// abortBegun aborts the begun step (its forward failed): the cache returns
// to the state before its Begin, except that finished and preempted
// requests stay dropped; the harness forgets the requests the Begin made
// live, as for a failed Save.
func (h *harness) abortBegun() {
	h.t.Helper()
	ps := h.pending
	h.pending = nil
	require.NoError(h.t, guard(h.t, h.prefix()+"Abort", h.c.Abort), h.prefix()+"Abort")
	if ps != nil {
		for _, id := range ps.fresh {
			delete(h.live, id)
		}
	}
}

func (h *harness) begin(st step) {
	h.t.Helper()
	require.NoError(h.t, h.tryBegin(st), h.prefix()+"Begin")
}
