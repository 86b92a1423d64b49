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
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
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
		rows:   map[rowKey][]byte{},

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
	for _, f := range st.Finished {
		delete(h.live, f)
	}
	bs := h.cfg.BlockSize
	for _, a := range st.Arrive {
		if !h.live[a.ID] {
			ps.fresh = append(ps.fresh, a.ID)
		}
		if !h.live[a.ID] && a.Hit > 0 {
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

func (h *harness) isDev(k int) bool {
	if h.devKeys != nil {
		return h.devKeys[k]
	}
	return h.device
}

func (h *harness) isOwned(k int) bool {
	if h.ownKeys != nil {
		return h.ownKeys[k]
	}
	return h.owned
}

// outputsFor builds the step's outputs: per key, the rows of the scheduled
// requests in batch order.
func (h *harness) outputsFor(st step) *omnicache.Outputs {
	tokens := 0
	for _, s := range st.Sched {
		tokens += s.Count
	}
	o := &omnicache.Outputs{Tokens: tokens, Padded: tokens}
	for k, key := range h.cfg.Keys {
		rb := key.RowBytes
		buf := make([]byte, tokens*rb)
		off := 0
		for _, s := range st.Sched {
			for j := 0; j < s.Count; j++ {
				fillRow(buf[off:off+rb], mkTag(k, s.ID, s.Start+j, h.ver[s.ID]))
				off += rb
			}
		}
		t := omnicache.Tensor{Rows: tokens, Owned: h.isOwned(k)}
		switch {
		case h.omitKeys != nil && h.omitKeys[k]:
			t = omnicache.Tensor{} // the step did not emit this key
		case tokens == 0:
			t.Host = []byte{}
		case h.isDev(k):
			t.Dev = gpu.HostBuffer(buf)
		default:
			t.Host = buf
		}
		o.Tensors = append(o.Tensors, t)
	}
	return o
}

// omitted reports per key whether the outputs omit it (a zero Tensor).
func omitted(o *omnicache.Outputs) []bool {
	om := make([]bool, len(o.Tensors))
	for k, t := range o.Tensors {
		om[k] = t.Host == nil && t.Dev.IsZero()
	}
	return om
}

// outs builds the outputs of the pending (begun) step.
func (h *harness) outs() *omnicache.Outputs {
	h.t.Helper()
	require.NotNil(h.t, h.pending, "harness: no begun step")
	return h.outputsFor(h.pending.st)
}

// trySave calls Save. On success it records what the step's Materialize
// must return and applies the step's writes to the model; then it
// overwrites the non-owned output buffers as an engine reusing them would.
// A failed Save ends the step (the next call is a Begin).
func (h *harness) trySave(o *omnicache.Outputs) (omnicache.StepID, error) {
	h.t.Helper()
	r := guard(h.t, h.prefix()+"Save", func() saveResult {
		id, err := h.c.Save(o)
		return saveResult{id, err}
	})
	return h.afterSave(o, r)
}

// saveAsync starts Save on another goroutine (which then is the engine
// goroutine for that call) and returns a join that fails the test if the
// Save has not returned within the deadline, and does trySave's
// bookkeeping.
func (h *harness) saveAsync(o *omnicache.Outputs) (done <-chan struct{}, join func() (omnicache.StepID, error)) {
	d := make(chan struct{})
	var r saveResult
	go func() {
		id, err := h.c.Save(o)
		r = saveResult{id, err}
		close(d)
	}()
	join = func() (omnicache.StepID, error) {
		h.t.Helper()
		guard(h.t, h.prefix()+"Save", func() struct{} { <-d; return struct{}{} })
		return h.afterSave(o, r)
	}
	return d, join
}

func (h *harness) afterSave(o *omnicache.Outputs, r saveResult) (omnicache.StepID, error) {
	h.t.Helper()
	ps := h.pending
	h.pending = nil
	if r.err != nil {
		if ps != nil && !errors.Is(r.err, omnicache.ErrWriteFailed) {
			// A failed Save undoes its Begin: the requests it made live
			// are gone (finished ones stay dropped).
			for _, id := range ps.fresh {
				delete(h.live, id)
			}
		}
		return r.id, r.err
	}
	if ps == nil {
		h.t.Errorf("%sSave succeeded without a begun step", h.prefix())
		return r.id, nil
	}
	if _, dup := h.wants[r.id]; dup {
		h.t.Errorf("%sSave returned step id %v again (ids are never reused)", h.prefix(), r.id)
	}
	h.nsteps++
	ord := h.nsteps
	h.tokensAt = append(h.tokensAt, o.Tokens)
	omit := omitted(o)
	for _, s := range ps.st.Sched {
		for j, sl := range ps.slots[s.ID] {
			if sl < 0 || int(sl) >= len(h.writtenAt) {
				continue
			}
			for k := range h.model {
				h.model[k][sl] = mkTag(k, s.ID, s.Start+j, ps.vers[s.ID])
				if omit[k] {
					h.model[k][sl] = 0 // recorded absent: reads as zeros
				}
			}
			h.writtenAt[sl] = ord
		}
	}
	sw := &stepWant{ord: ord, byID: map[int64]int{}}
	for _, s := range ps.st.Sched {
		rw := reqWant{id: s.ID, start: s.Start, count: s.Count, ver: ps.vers[s.ID], omit: omit}
		if hs, ok := ps.hits[s.ID]; ok {
			rw.hitSlots = hs
			for _, sl := range hs {
				w := 0
				if sl >= 0 && int(sl) < len(h.writtenAt) {
					w = h.writtenAt[sl]
				}
				rw.hitFrom = append(rw.hitFrom, w)
			}
			rw.prefix = make([][]tag, len(h.model))
			for k := range h.model {
				for _, sl := range hs {
					var g tag
					if sl >= 0 && int(sl) < len(h.model[k]) {
						g = h.model[k][sl]
					}
					rw.prefix[k] = append(rw.prefix[k], g)
				}
			}
		}
		sw.byID[s.ID] = len(sw.reqs)
		sw.reqs = append(sw.reqs, rw)
	}
	h.wants[r.id] = sw
	if !h.noScribble {
		for _, t := range o.Tensors {
			if t.Owned {
				continue
			}
			buf := t.Host
			if buf == nil {
				buf = t.Dev.Host
			}
			for i := range buf {
				buf[i] = 0xA5
			}
		}
	}
	return r.id, nil
}

// save saves the begun step's outputs and returns the step id.
func (h *harness) save() omnicache.StepID {
	h.t.Helper()
	id, err := h.trySave(h.outs())
	require.NoError(h.t, err, h.prefix()+"Save")
	return id
}

// step runs Begin and Save for st.
func (h *harness) step(st step) omnicache.StepID {
	h.t.Helper()
	h.begin(st)
	return h.save()
}

func reqList(reqs []int64) []int64 {
	if len(reqs) == 0 {
		return nil
	}
	return reqs
}

// matCall calls Materialize into res (no checking).
func (h *harness) matCall(id omnicache.StepID, reqs []int64, res *omnicache.Result) error {
	h.t.Helper()
	return guard(h.t, fmt.Sprintf("%sMaterialize(%v)", h.prefix(), id), func() error {
		return h.c.Materialize(id, reqs, res)
	})
}

// mat materializes reqs (none: the whole step) of step id and checks every
// row.
func (h *harness) mat(id omnicache.StepID, reqs ...int64) {
	h.t.Helper()
	reqs = reqList(reqs)
	err := h.matCall(id, reqs, &h.res)
	require.NoError(h.t, err, "%sMaterialize(%v, %v)", h.prefix(), id, reqs)
	require.NoError(h.t, h.verify(id, reqs, &h.res))
}

// matDelayed materializes a step whose hit slots may have been reassigned
// since: ErrReassigned or the original rows are both right, the new
// tenant's rows never. It reports whether the read errored.
func (h *harness) matDelayed(id omnicache.StepID, reqs ...int64) (reassigned bool) {
	h.t.Helper()
	reqs = reqList(reqs)
	err := h.matCall(id, reqs, &h.res)
	if errors.Is(err, omnicache.ErrReassigned) {
		return true
	}
	require.NoError(h.t, err, "%sdelayed Materialize(%v): want success or ErrReassigned", h.prefix(), id)
	require.NoError(h.t, h.verify(id, reqs, &h.res), "delayed read must return the original rows")
	return false
}

func (h *harness) want(id omnicache.StepID) *stepWant {
	h.t.Helper()
	sw, ok := h.wants[id]
	if !ok {
		h.t.Fatalf("harness: step id %v was not saved by this harness", id)
	}
	return sw
}

// rewrittenSince reports whether a hit slot of reqs (nil: all) of step id
// was written by a later step: a delayed read of it may fail with
// ErrReassigned.
func (h *harness) rewrittenSince(id omnicache.StepID, reqs []int64) bool {
	sw := h.want(id)
	for _, rw := range sw.reqs {
		if reqs != nil && !containsID(reqs, rw.id) {
			continue
		}
		for _, sl := range rw.hitSlots {
			if sl >= 0 && int(sl) < len(h.writtenAt) && h.writtenAt[sl] > sw.ord {
				return true
			}
		}
	}
	return false
}

func containsID(ids []int64, id int64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// verify checks res against what step id must return for reqs (nil: every
// request in batch order).
func (h *harness) verify(id omnicache.StepID, reqs []int64, res *omnicache.Result) error {
	h.t.Helper()
	return h.verifyServed(id, reqs, res, nil)
}

// verifyServed is verify where the requests in failed were not served:
// their Result.Err must be set and their rows zero; every other request's
// rows must be exact and its Err nil.
func (h *harness) verifyServed(id omnicache.StepID, reqs []int64, res *omnicache.Result, failed map[int64]error) error {
	h.t.Helper()
	sw := h.want(id)
	order := reqs
	if order == nil {
		for _, rw := range sw.reqs {
			order = append(order, rw.id)
		}
	}
	head := fmt.Sprintf("%sstep %v (the harness's step #%d), requests %v", h.prefix(), id, sw.ord, order)
	if res.Len() != len(order) {
		return fmt.Errorf("%s: result has %d requests, want %d", head, res.Len(), len(order))
	}
	var bad []string
	for i, rid := range order {
		idx, ok := sw.byID[rid]
		if !ok {
			return fmt.Errorf("%s: harness: request %d not in step", head, rid)
		}
		rw := sw.reqs[idx]
		if res.ID(i) != rid {
			bad = append(bad, fmt.Sprintf("result %d: id %d, want %d", i, res.ID(i), rid))
			continue
		}
		npre := len(rw.hitSlots)
		if _, ok := failed[rid]; ok != (res.Err(i) != nil) {
			bad = append(bad, fmt.Sprintf("req %d: Result.Err = %v, failed in the error: %v", rid, res.Err(i), ok))
			continue
		}
		if res.Prefix(i) != npre || res.Tokens(i) != npre+rw.count {
			bad = append(bad, fmt.Sprintf("req %d: Prefix=%d Tokens=%d, want Prefix=%d Tokens=%d (hit prefix + %d rows of this step)",
				rid, res.Prefix(i), res.Tokens(i), npre, npre+rw.count, rw.count))
			continue
		}
		for k, key := range h.cfg.Keys {
			rb := key.RowBytes
			rows := res.Rows(i, k)
			if len(rows) != (npre+rw.count)*rb {
				bad = append(bad, fmt.Sprintf("req %d key %q: %d bytes, want %d", rid, key.Name, len(rows), (npre+rw.count)*rb))
				continue
			}
			if h.keepRows {
				h.rows[rowKey{sw.ord, rid, key.Name}] = bytes.Clone(rows)
			}
			for j := 0; j < npre+rw.count; j++ {
				var w tag
				part := "prefix"
				if res.Err(i) != nil {
					part = "failed request" // zeros
				} else if j < npre {
					w = rw.prefix[k][j]
				} else {
					part = "own"
					if !rw.omit[k] {
						w = mkTag(k, rid, rw.start+j-npre, rw.ver)
					}
				}
				got := rows[j*rb : (j+1)*rb]
				if !bytes.Equal(got, rowOf(w, rb)) {
					bad = append(bad, fmt.Sprintf("req %d key %q row %d (%s): got %s, want %s", rid, key.Name, j, part, describe(got), w))
				}
			}
		}
	}
	if len(bad) == 0 {
		return nil
	}
	more := ""
	if len(bad) > 12 {
		more = fmt.Sprintf("\n  ... and %d more", len(bad)-12)
		bad = bad[:12]
	}
	return fmt.Errorf("%s: wrong result:\n  %s%s", head, strings.Join(bad, "\n  "), more)
}

func (h *harness) tryDiscard(id omnicache.StepID) error {
	h.t.Helper()
	return guard(h.t, fmt.Sprintf("%sDiscard(%v)", h.prefix(), id), func() error { return h.c.Discard(id) })
}

func (h *harness) discard(id omnicache.StepID) {
	h.t.Helper()
	require.NoError(h.t, h.tryDiscard(id), "%sDiscard(%v)", h.prefix(), id)
}

func (h *harness) trySync() error {
	h.t.Helper()
	return guard(h.t, h.prefix()+"Sync", func() error { return h.c.Sync() })
}

func (h *harness) sync() {
	h.t.Helper()
	require.NoError(h.t, h.trySync(), h.prefix()+"Sync")
}

func (h *harness) stats() omnicache.Stats {
	h.t.Helper()
	return guard(h.t, h.prefix()+"Stats", func() omnicache.Stats { return h.c.Stats() })
}

// drain finishes ids in a step that schedules nothing (zero tokens) and
// discards it: the way to finish the last requests of a schedule.
func (h *harness) drain(ids ...int64) {
	h.t.Helper()
	h.discard(h.step(step{Finished: ids}))
}

// peek reads committed mirror rows of key k (call sync first).
func (h *harness) peek(k int, slots []int32) []byte {
	h.t.Helper()
	dst := make([]byte, len(slots)*h.cfg.Keys[k].RowBytes)
	err := guard(h.t, h.prefix()+"Peek", func() error { return h.c.Peek(k, slots, dst) })
	require.NoError(h.t, err, "%sPeek key %q", h.prefix(), h.cfg.Keys[k].Name)
	return dst
}

func (h *harness) allSlots() []int32 {
	s := make([]int32, h.cfg.NumBlocks*h.cfg.BlockSize)
	for i := range s {
		s[i] = int32(i)
	}
	return s
}

// mirror syncs and returns the whole mirror of key k.
func (h *harness) mirror(k int) []byte {
	h.t.Helper()
	h.sync()
	return h.peek(k, h.allSlots())
}

func (h *harness) keyIndex(name string) int {
	for k, key := range h.cfg.Keys {
		if key.Name == name {
			return k
		}
	}
	h.t.Fatalf("harness: no key %q", name)
	return -1
}

// checkMirror syncs and compares the mirror of the given keys (none: every
// non-deferred key) with the model, slot by slot.
func (h *harness) checkMirror(keys ...int) {
	h.t.Helper()
	if len(keys) == 0 {
		for k, key := range h.cfg.Keys {
			if !key.Deferred {
				keys = append(keys, k)
			}
		}
	}
	h.sync()
	slots := h.allSlots()
	var bad []string
	for _, k := range keys {
		rb := h.cfg.Keys[k].RowBytes
		got := h.peek(k, slots)
		for s := range slots {
			if h.unknown[s] {
				continue
			}
			g := got[s*rb : (s+1)*rb]
			if !bytes.Equal(g, rowOf(h.model[k][s], rb)) {
				bad = append(bad, fmt.Sprintf("key %q slot %d (block %d): got %s, want %s",
					h.cfg.Keys[k].Name, s, s/h.cfg.BlockSize, describe(g), h.model[k][s]))
			}
		}
	}
	if len(bad) > 0 {
		more := ""
		if len(bad) > 12 {
			more = fmt.Sprintf("\n  ... and %d more", len(bad)-12)
			bad = bad[:12]
		}
		h.t.Fatalf("%smirror differs from the model (latest write per slot):\n  %s%s", h.prefix(), strings.Join(bad, "\n  "), more)
	}
}

// expectBlock syncs and checks block b of key k against rows written by
// request id at positions pos0.. with version ver (id < 0: zeros).
func (h *harness) expectBlock(k int, b int32, id int64, pos0, ver int) {
	h.t.Helper()
	h.sync()
	bs := h.cfg.BlockSize
	rb := h.cfg.Keys[k].RowBytes
	slots := make([]int32, bs)
	for j := range slots {
		slots[j] = b*int32(bs) + int32(j)
	}
	got := h.peek(k, slots)
	for j := range slots {
		var w tag
		if id >= 0 {
			w = mkTag(k, id, pos0+j, ver)
		}
		g := got[j*rb : (j+1)*rb]
		if !bytes.Equal(g, rowOf(w, rb)) {
			h.t.Fatalf("%smirror key %q block %d slot %d: got %s, want %s", h.prefix(), h.cfg.Keys[k].Name, b, slots[j], describe(g), w)
		}
	}
}

// ---------------------------------------------------------------- devices

// gatedDevice is a device whose events recorded while the gate is armed
// block in Wait until the test opens the gate: it holds a write "in
// transit". Events recorded before arming (already complete) never block.
type gatedDevice struct {
	gpu.Device
	mu      sync.Mutex
	armed   bool
	next    gpu.Event
	gated   map[gpu.Event]bool
	entered chan struct{}
	release chan struct{}
}

func newGatedDevice() *gatedDevice {
	return &gatedDevice{Device: gpu.NewHost(), gated: map[gpu.Event]bool{}}
}

// arm gates every event recorded from now on until open is called.
func (d *gatedDevice) arm() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed = true
	d.entered = make(chan struct{}, 1)
	d.release = make(chan struct{})
}

// open releases the blocked Waits and disarms the gate.
func (d *gatedDevice) open() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.armed {
		d.armed = false
		close(d.release)
	}
}

// waitEntered reports whether a Wait blocked on the armed gate within d.
func (d *gatedDevice) waitEntered(timeout time.Duration) bool {
	d.mu.Lock()
	ch := d.entered
	d.mu.Unlock()
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	select {
	case <-ch:
		return true
	case <-tm.C:
		return false
	}
}

func (d *gatedDevice) Record() (gpu.Event, error) {
	if _, err := d.Device.Record(); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.next++
	if d.armed {
		d.gated[d.next] = true
	}
	return d.next, nil
}

func (d *gatedDevice) Wait(e gpu.Event) error {
	d.mu.Lock()
	block := d.armed && d.gated[e]
	entered, release := d.entered, d.release
	d.mu.Unlock()
	if block {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
	}
	return d.Device.Wait(0)
}
