package omnicache

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/slots"
	"github.com/omnicache/omnicache/soa"
	"github.com/omnicache/omnicache/writer"
)

// request flags (soa.Requests.Flags)
const flagHitPending = 1

// Cache is the prefix-cache core. See the package doc for the contract and
// which goroutine may call what.
type Cache struct {
	cfg    Config
	dev    gpu.Device
	bs     int
	cap    int // rows per staging page
	nslots int
	keys   []keyState
	imm    []int // indices of immediate keys
	def    []int // indices of deferred keys
	rowB   []int // row bytes per key
	pageB  int   // bytes of one page
	pageO  []int // per key: offset of its region in a page (immediate keys)

	pages   *writer.Pages
	spare   *writer.Spare // page memory allocated one page ahead
	budget  *writer.Budget
	q       *writer.Queue[writer.Task]
	com     *writer.Committer
	mirrors *writer.Mirrors

	// mu is the state lock: deferred clones in transit, step records and the
	// pins/owners of writes. It is never held across a copy, a wait or a budget flush.
	mu      sync.Mutex
	clones  map[uint64]*writer.Write
	steps   []*stepRec // outstanding (saved, not consumed)
	recFree []*stepRec

	failed atomic.Pointer[error]
	live   atomic.Int64 // requests tracked, for Stats (the table is the engine's)
	closed atomic.Bool

	// engine goroutine state (Begin/Save/Sync/Close only)
	nextID   uint64
	nextStep StepID
	begun    bool
	reqs     *soa.Requests
	cur      curStep
	buf      writer.DecodeBuf
	segs     writer.Runs
	defOpen  []uint64 // per handle: sequence of its open deferred write (0: none)
	defFIFO  []openRef
	defSeq   uint64
	lastEv   [2]gpu.Event // the last two writes' copies (see join)
	prevIDs  []int64
	prevH    []soa.Handle // handles of prevIDs (c.cur.h aliases it while the ids stay the same)
	hbuf     []soa.Handle // spare for the next change of ids
	stamp    []uint64     // per handle: last Begin that scheduled it (duplicate check)
	stampGen uint64

	// ten tracks the tenancy of every immediate key (they are always
	// written together, by the committer, in order).
	ten *soa.Tenancy
	// handback: owned host buffers released under the state lock, handed to
	// Config.ReleaseHost once it is dropped (guarded by mu).
	handback [][]byte
	landed   []*writer.Write // committer-only scratch (committerOwner.Landed)

	st writer.Counters
}

type curStep struct {
	ids    []int64
	h      []soa.Handle
	count  []int32
	slots  []int32
	ntok   int
	pure   bool
	hitReq []int32 // positions in the batch of requests whose hit prefix is served this step
}

type openRef struct {
	h   soa.Handle
	seq uint64
}

// New creates a cache. It allocates no mirror memory and no staging memory:
// a key's mirror is created when the key first writes, a staging page's
// memory when the page is first used.
func New(cfg Config) (*Cache, error) {
	if cfg.NumBlocks <= 0 || cfg.BlockSize <= 0 {
		return nil, fmt.Errorf("%w: %d blocks of %d tokens", ErrConfig, cfg.NumBlocks, cfg.BlockSize)
	}
	if int64(cfg.NumBlocks)*int64(cfg.BlockSize) > 1<<31-1 {
		return nil, fmt.Errorf("%w: %d×%d slots overflow int32", ErrConfig, cfg.NumBlocks, cfg.BlockSize)
	}
	if len(cfg.Keys) == 0 {
		return nil, fmt.Errorf("%w: no keys", ErrConfig)
	}
	if cfg.StagingDepth == 0 {
		cfg.StagingDepth = DefaultStagingDepth
	}
	if cfg.StagingCapacityTokens == 0 {
		cfg.StagingCapacityTokens = DefaultStagingCapacityTokens
	}
	if cfg.StagingClaimTimeout == 0 {
		cfg.StagingClaimTimeout = DefaultStagingClaimTimeout
	}
	if cfg.DeviceBudgetBytes == 0 {
		cfg.DeviceBudgetBytes = DefaultDeviceBudgetBytes
	}
	if cfg.DeferredChunkBytes == 0 {
		cfg.DeferredChunkBytes = DefaultDeferredChunkBytes
	}
	if cfg.StagingDepth < 0 || cfg.StagingCapacityTokens < 0 || cfg.DeviceBudgetBytes < 0 || cfg.DeferredChunkBytes < 0 {
		return nil, fmt.Errorf("%w: negative staging depth, capacity, budget or chunk", ErrConfig)
	}
	c := &Cache{
		cfg:    cfg,
		dev:    cfg.Device,
		bs:     cfg.BlockSize,
		cap:    cfg.StagingCapacityTokens,
		nslots: cfg.NumBlocks * cfg.BlockSize,
		keys:   make([]keyState, len(cfg.Keys)),
		rowB:   make([]int, len(cfg.Keys)),
		pageO:  make([]int, len(cfg.Keys)),
		clones: make(map[uint64]*writer.Write),
		reqs:   soa.NewRequests(64),
	}
	if c.dev == nil {
		c.dev = gpu.NewHost()
	}
	seen := make(map[string]bool, len(cfg.Keys))
	for i, k := range cfg.Keys {
		if k.RowBytes <= 0 {
			return nil, fmt.Errorf("%w: key %q has %d row bytes", ErrConfig, k.Name, k.RowBytes)
		}
		if seen[k.Name] {
			return nil, fmt.Errorf("%w: duplicate key name %q", ErrConfig, k.Name)
		}
		seen[k.Name] = true
		ks := &c.keys[i]
		ks.Key, ks.imm, ks.def = k, -1, -1
		c.rowB[i] = k.RowBytes
		if k.Deferred {
			ks.occ = soa.NewOccupancy(c.nslots)
			ks.def = len(c.def)
			c.def = append(c.def, i)
		} else {
			if c.ten == nil {
				c.ten = soa.NewTenancy(cfg.NumBlocks, cfg.BlockSize)
			}
			ks.imm = len(c.imm)
			c.imm = append(c.imm, i)
			c.pageO[i] = c.pageB
			c.pageB += c.cap * k.RowBytes
		}
	}
	c.pages = writer.NewPages(cfg.StagingDepth)
	c.spare = writer.NewSpare(c.dev.AllocHost, c.pageB, cfg.StagingDepth)
	c.budget = writer.NewBudget(cfg.DeviceBudgetBytes)
	c.q = writer.NewQueue[writer.Task](2 * cfg.StagingDepth)
	c.mirrors = writer.NewMirrors(c.nslots, c.rowB)
	occ := make([]*soa.Occupancy, len(c.keys))
	for k := range c.keys {
		occ[k] = c.keys[k].occ
	}
	c.com = writer.NewCommitter(writer.CommitterConfig{
		Dev: c.dev, Queue: c.q, Mirrors: c.mirrors, RowBytes: c.rowB, Imm: c.imm,
		Tenancy: c.ten, Occ: occ, NumSlots: c.nslots, ChunkBytes: cfg.DeferredChunkBytes,
		Stats: &c.st, Owner: committerOwner{c},
	})
	c.com.Start()
	return c, nil
}

// ---- errors and small helpers ----

func (c *Cache) check() error {
	if c.closed.Load() {
		return ErrClosed
	}
	if p := c.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// fail makes err sticky (the first failure wins) and returns the sticky error.
func (c *Cache) fail(err error) error {
	e := fmt.Errorf("%w: %w", ErrWriteFailed, err)
	c.failed.CompareAndSwap(nil, &e)
	return *c.failed.Load()
}

func (c *Cache) newID() uint64 { c.nextID++; return c.nextID }

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n, n+n/4)
	}
	return s[:n]
}

// ---- Begin ----

// Begin registers a step plan: it validates hits, processes finished,
// preempted and resumed requests, registers arrivals and maps the batch to
// slots. Engine goroutine only; the plan is borrowed for the call.
func (c *Cache) Begin(p *Plan) error {
	if err := c.check(); err != nil {
		return err
	}
	if c.begun {
		return fmt.Errorf("%w: Begin twice without Save (the begun step stays begun)", ErrSequence)
	}

	n := len(p.IDs)
	if len(p.Rows) != n || len(p.Start) != n || len(p.Count) != n {
		return fmt.Errorf("%w: %d ids, %d rows, %d starts, %d counts", ErrPlan, n, len(p.Rows), len(p.Start), len(p.Count))
	}
	if len(p.HitTokens) != len(p.Arrivals) {
		return fmt.Errorf("%w: %d arrivals, %d hit lengths", ErrPlan, len(p.Arrivals), len(p.HitTokens))
	}
	used := 0
	for i, ht := range p.HitTokens {
		if ht < 0 {
			return fmt.Errorf("%w: request %d: negative hit length %d", ErrPlan, p.Arrivals[i], ht)
		}
		if int(ht)%c.bs != 0 {
			return fmt.Errorf("%w: request %d: %d hit tokens, block size %d", ErrUnalignedHit, p.Arrivals[i], ht, c.bs)
		}
		nb := int(ht) / c.bs
		if used+nb > len(p.HitBlocks) {
			return fmt.Errorf("%w: request %d hits %d tokens but %d block ids remain", ErrHitBlocks, p.Arrivals[i], ht, len(p.HitBlocks)-used)
		}
		for _, b := range p.HitBlocks[used : used+nb] {
			if b < 0 || int(b) >= c.cfg.NumBlocks {
				return fmt.Errorf("%w: request %d: hit block %d outside [0,%d)", ErrPlan, p.Arrivals[i], b, c.cfg.NumBlocks)
			}
		}
		used += nb
	}
	if used != len(p.HitBlocks) {
		return fmt.Errorf("%w: %d block ids left over after the arrivals' hits", ErrHitBlocks, len(p.HitBlocks)-used)
	}
	ntok := 0
	pure := !c.cfg.DisableDecodeBuffer && n > 0 && len(p.Arrivals) == 0 && len(p.Finished) == 0 &&
		len(p.Preempted) == 0 && len(p.Resumed) == 0
	for _, cnt := range p.Count { // negative starts and counts: slots.Map rejects them
		ntok += int(cnt)
		if cnt != 1 {
			pure = false
		}
	}
	if ntok < 0 {
		return fmt.Errorf("%w: negative token count", ErrPlan)
	}
	c.cur.slots = grow(c.cur.slots, ntok)
	if _, err := slots.Map(c.cur.slots, slots.Batch{Rows: p.Rows, Start: p.Start, Count: p.Count, Table: p.Table, Stride: p.Stride}, c.bs); err != nil {
		return fmt.Errorf("%w: %w", ErrPlan, err)
	}
	// Block ids beyond NumBlocks: one branch-free pass (a slot outside
	// [0, nslots) makes s or last-s negative), then find it for the error.
	var bad int32
	last := int32(c.nslots - 1)
	for _, s := range c.cur.slots {
		bad |= s | (last - s)
	}
	if bad < 0 {
		for _, s := range c.cur.slots {
			if s < 0 || s > last {
				return fmt.Errorf("%w: slot %d outside [0,%d): block table names a block beyond NumBlocks", ErrPlan, s, c.nslots)
			}
		}
	}
	same := slices.Equal(p.IDs, c.prevIDs)
	// A non-empty buffer holds the previous step (any other step flushes
	// it), so the same ids continue it.
	if pure && !same && !c.buf.Continues(p.IDs) {
		pure = false
	}
	// Anything but a buffered decode step writes the buffer first, before
	// hits are registered, finishes escalate or blocks are reused.
	if !pure && c.buf.K > 0 {
		if err := c.flushBuffer(); err != nil {
			return err
		}
	}
	for _, id := range p.Finished {
		if h, ok := c.reqs.Lookup(id); ok {
			c.closeDeferred(h)
			c.reqs.Remove(h)
			same = false
		}
	}
	c.flushDeferred()
	used = 0
	for i, id := range p.Arrivals {
		ht := p.HitTokens[i]
		nb := int(ht) / c.bs
		blocks := p.HitBlocks[used : used+nb]
		used += nb
		h, fresh := c.reqs.Add(id, ht, blocks)
		if fresh {
			same = false
			if ht > 0 {
				c.reqs.Flags[c.reqs.Pos(h)] |= flagHitPending
			}
		}
	}
	c.cur.ids = append(c.cur.ids[:0], p.IDs...)
	c.cur.count = append(c.cur.count[:0], p.Count...)
	c.cur.hitReq = c.cur.hitReq[:0]
	if same {
		c.cur.h = c.prevH // read-only until the ids change
	} else {
		c.cur.h = c.hbuf[:0]
		c.stampGen++
		for _, id := range p.IDs {
			h, ok := c.reqs.Lookup(id)
			if !ok {
				h, _ = c.reqs.Add(id, 0, nil)
			}
			for int(h) >= len(c.stamp) {
				c.stamp = append(c.stamp, 0)
			}
			if c.stamp[h] == c.stampGen {
				c.prevIDs = c.prevIDs[:0]
				return fmt.Errorf("%w: request %d scheduled twice", ErrPlan, id)
			}
			c.stamp[h] = c.stampGen
			c.cur.h = append(c.cur.h, h)
		}
		for i, h := range c.cur.h {
			if c.reqs.Flags[c.reqs.Pos(h)]&flagHitPending != 0 {
				c.cur.hitReq = append(c.cur.hitReq, int32(i))
			}
		}
		c.prevIDs = append(c.prevIDs[:0], p.IDs...)
		c.hbuf, c.prevH = c.prevH, c.cur.h
		c.live.Store(int64(c.reqs.Len())) // the table changes only with the ids
	}
	c.cur.ntok = ntok
	c.cur.pure = pure
	c.begun = true
	return nil
}

// ---- Save ----

// Save hands in the step's outputs and returns its step id. Immediate rows
// of the whole step form one write (or are parked by the decode buffer);
// deferred rows are cloned and stay pending until their request finishes.
// Engine goroutine only; the outputs are borrowed for the call (owned
// tensors are kept).
func (c *Cache) Save(o *Outputs) (StepID, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	if !c.begun {
		return 0, fmt.Errorf("%w: Save without Begin", ErrSequence)
	}
	c.begun = false
	n := c.cur.ntok
	if o.Tokens != n {
		return 0, fmt.Errorf("%w: outputs carry %d tokens, the plan scheduled %d", ErrTokenCount, o.Tokens, n)
	}
	if len(o.Tensors) != len(c.keys) {
		return 0, fmt.Errorf("%w: %d tensors for %d keys", ErrOutputs, len(o.Tensors), len(c.keys))
	}
	for k := range o.Tensors {
		t := &o.Tensors[k]
		need := n * c.rowB[k]
		have := t.Dev.Size
		if t.Host != nil {
			have = len(t.Host)
		}
		if t.Rows < n || have < need {
			return 0, fmt.Errorf("%w: key %q: %d rows (%d bytes) for %d tokens of %d bytes", ErrOutputs, c.keys[k].Name, t.Rows, have, n, c.rowB[k])
		}
	}
	if n > c.cap {
		return 0, fmt.Errorf("%w: %d tokens, a page holds %d", ErrStepTooLarge, n, c.cap)
	}
	rec := c.newRec()
	var err error
	if c.cur.pure {
		err = c.park(o, rec)
	} else {
		err = c.writeStep(o, rec)
	}
	if err == nil {
		err = c.saveDeferred(o, rec)
	}
	// The step's device calls are issued: a page taken now has the next
	// one's memory allocated in the background.
	c.spare.Ahead()
	if err != nil {
		c.mu.Lock()
		c.dropRec(rec)
		c.mu.Unlock()
		c.handBack()
		return 0, err
	}
	if len(c.cur.hitReq) > 0 {
		// Immediate rows are read after joining every write handed over so
		// far; a row owned by a later write was reassigned after planning.
		rec.joinSeq = c.q.Pushed()
		rec.maxOwner = c.nextID
		c.planHits(rec)
	}
	c.mu.Lock()
	c.steps = append(c.steps, rec)
	c.mu.Unlock()
	c.st.Steps.Add(1)
	return rec.id, nil
}

// newRec prepares the step record of the step being saved (not yet
// published).
func (c *Cache) newRec() *stepRec {
	var r *stepRec
	c.mu.Lock()
	if k := len(c.recFree); k > 0 {
		r = c.recFree[k-1]
		c.recFree = c.recFree[:k-1]
	}
	c.mu.Unlock()
	if r == nil {
		r = &stepRec{}
	}
	r.reset()
	c.nextStep++
	r.id = c.nextStep
	r.src = grow(r.src, len(c.keys))
	r.srcOff = grow(r.srcOff, len(c.keys))
	// The record takes the step's ids and counts (Begin copied them out of
	// the borrowed plan); the engine refills the record's old slices next
	// Begin. No second copy.
	r.ids, c.cur.ids = c.cur.ids, r.ids[:0]
	r.count, c.cur.count = c.cur.count, r.count[:0]
	return r
}

// claimPage takes a staging page, waiting up to the claim timeout; the
// timeout error names the step ids that hold pages.
func (c *Cache) claimPage() (*writer.Page, error) {
	pg, err := c.pages.Claim(NoWait)
	if err != nil && errors.Is(err, writer.ErrTimeout) && c.cfg.StagingClaimTimeout >= 0 {
		// Back-pressure: every page is held by unconsumed steps or by
		// writes the committer has not landed yet.
		t0 := time.Now()
		pg, err = c.pages.Claim(c.cfg.StagingClaimTimeout)
		c.st.StallNanos.Add(int64(time.Since(t0)))
	}
	if err == nil {
		if pg.Mem == nil {
			// The first page is allocated here; later ones were allocated
			// ahead in the background (writer.Spare).
			if pg.Mem, err = c.spare.Get(); err != nil {
				c.pages.Release(pg)
				return nil, fmt.Errorf("%w: staging page: %w", ErrWriteFailed, err)
			}
		}
		return pg, nil
	}
	if errors.Is(err, writer.ErrClosed) {
		return nil, ErrClosed
	}
	c.mu.Lock()
	ids := make([]string, 0, len(c.steps))
	for _, r := range c.steps {
		ids = append(ids, fmt.Sprint(r.id))
	}
	c.mu.Unlock()
	return nil, fmt.Errorf("%w: %d pages held after %v; unconsumed step ids: [%s]", ErrStagingTimeout, c.cfg.StagingDepth, max(c.cfg.StagingClaimTimeout, 0), strings.Join(ids, " "))
}

// stage puts rows of tensor t (key k) for parked step j of write p:
// host rows are copied into the page (or kept when owned); device rows are
// cloned (kept when owned) and, when copyNow, copied device→host into the
// page right away.
func (c *Cache) stage(p *writer.Write, t *Tensor, k, j int, copyNow bool) error {
	ks := &c.keys[k]
	rb := c.rowB[k]
	n := p.N
	nb := n * rb
	slot := j*len(c.imm) + ks.imm
	region := p.Page.Mem[c.pageO[k]+j*nb : c.pageO[k]+(j+1)*nb : c.pageO[k]+(j+1)*nb]
	if t.Host != nil {
		if t.Owned {
			p.Host[slot] = t.Host[:nb:nb]
			p.Owned = append(p.Owned, t.Host)
		} else {
			copy(region, t.Host[:nb])
			p.Host[slot] = region
			c.st.Cloned.Add(int64(nb))
		}
		return nil
	}
	src := t.Dev
	if !t.Owned {
		// The caller reserved the clone's bytes (deviceNeed).
		clone, err := c.dev.Alloc(nb)
		if err != nil {
			return c.fail(err)
		}
		if copyNow {
			p.Early = append(p.Early, clone)
		} else {
			p.Dev[slot] = clone
		}
		if err := c.dev.CopyDtoD(clone, 0, t.Dev, 0, nb); err != nil {
			return c.fail(err)
		}
		c.st.Cloned.Add(int64(nb))
		src = clone
	} else if copyNow {
		p.Early = append(p.Early, src) // owned: freed once copied
	} else {
		p.Dev[slot] = src
	}
	if !copyNow {
		c.mu.Lock()
		p.DevLive = true
		c.mu.Unlock()
	}
	if copyNow {
		if err := c.dev.CopyDtoH(region, src, 0); err != nil {
			return c.fail(err)
		}
		p.Host[slot] = region
	} else {
		p.Staged[slot] = region
	}
	return nil
}

// writeStep writes a whole step's immediate rows as one task.
func (c *Cache) writeStep(o *Outputs, rec *stepRec) error {
	if len(c.imm) == 0 {
		return nil
	}
	need := c.deviceNeed(o)
	if need > 0 {
		if err := c.reserve(need); err != nil {
			return err
		}
	}
	pg, err := c.claimPage()
	if err != nil {
		c.budget.Release(need)
		return err
	}
	p := c.newWrite(pg, c.cur.ntok)
	p.EarlyB = need
	p.Host = grow(p.Host, len(c.imm))
	p.Dev = grow(p.Dev, len(c.imm))
	p.Staged = grow(p.Staged, len(c.imm))
	for _, k := range c.imm {
		if err := c.stage(p, &o.Tensors[k], k, 0, true); err != nil {
			c.releaseWrite(p)
			return err
		}
	}
	if p.Ev, err = c.dev.Record(); err != nil {
		c.releaseWrite(p)
		return c.fail(err)
	}
	if err := c.join(p.Ev); err != nil {
		c.releaseWrite(p)
		return err
	}
	p.Steps = 1
	p.Rows.AppendSlots(c.cur.slots, 0, 0)
	c.mu.Lock()
	for _, k := range c.imm {
		rec.src[k], rec.srcOff[k] = p, 0
	}
	p.Owners = 1
	rec.pin(p)
	c.mu.Unlock()
	p.Seq = c.q.Push(writer.Task{W: p, Ev: p.Ev})
	c.st.Tasks.Add(1)
	return nil
}

func (c *Cache) newWrite(pg *writer.Page, n int) *writer.Write {
	p, _ := writePool.Get().(*writer.Write)
	if p == nil {
		p = &writer.Write{}
	}
	host, dev, staged, rows, early, owned := p.Host[:0], p.Dev[:0], p.Staged[:0], p.Rows, p.Early[:0], p.Owned[:0]
	rows.Reset()
	*p = writer.Write{ID: c.newID(), Page: pg, N: n, Host: host, Dev: dev, Staged: staged, Rows: rows, Early: early, Owned: owned}
	return p
}

// releaseWrite frees what a write holds; the caller has made sure no
// one references it.
func (c *Cache) releaseWrite(p *writer.Write) { c.release(p, false) }

// release frees what a write holds; locked says the caller holds c.mu, so
// owned host buffers are queued for handBack instead of handed back now.
func (c *Cache) release(p *writer.Write, locked bool) {
	if p.Page != nil {
		c.pages.Release(p.Page)
		p.Page = nil
	}
	for _, b := range p.Early {
		c.dev.Free(b)
	}
	p.Early = nil
	c.budget.Release(p.EarlyB)
	p.EarlyB = 0
	c.freeDev(p)
	// A deferred clone's buffer is the cache's, or an owned device tensor
	// (freed too: it was handed over); an owned host tensor goes back
	// through ReleaseHost below.
	if p.Deferred && !p.Buf.IsZero() && !(p.Own && len(p.Owned) > 0) {
		c.dev.Free(p.Buf)
	}
	p.Buf = gpu.Buffer{}
	c.budget.Release(p.Charge)
	p.Charge = 0
	if c.cfg.ReleaseHost != nil && len(p.Owned) > 0 {
		if locked {
			c.handback = append(c.handback, p.Owned...)
		} else {
			for _, b := range p.Owned {
				c.cfg.ReleaseHost(b)
			}
		}
	}
	clear(p.Owned)
	p.Owned = p.Owned[:0]
	if !p.Deferred {
		clear(p.Host)
		clear(p.Staged)
		writePool.Put(p)
	}
}

// writePool recycles immediate writes (and their slices) once nothing
// references them, so steady-state steps allocate nothing.
var writePool sync.Pool

// freeDev frees the device rows parked in p and releases their charge.
func (c *Cache) freeDev(p *writer.Write) {
	for i, b := range p.Dev {
		if !b.IsZero() {
			c.dev.Free(b)
		}
		p.Dev[i] = gpu.Buffer{}
	}
	c.budget.Release(p.DevCharge)
	p.DevCharge = 0
	p.DevLive = false
}

// unref drops pins (and owner refs) under the state lock and releases the
// write when nothing references it. Caller holds c.mu.
func (c *Cache) unrefLocked(p *writer.Write, pins, owners int32) (release bool) {
	p.Pins -= pins
	p.Owners -= owners
	if owners > 0 && p.Owners == 0 {
		delete(c.clones, p.ID)
	}
	if p.Pins < 0 || p.Owners < 0 {
		panic("omnicache: write reference count below zero")
	}
	return p.Pins == 0 && p.Owners == 0
}

// reserve charges n device bytes, forcing the oldest pending writes out
// while the charge would exceed the budget. Engine goroutine.
func (c *Cache) reserve(n int64) error {
	for {
		ok, err := c.budget.TryReserve(n)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrBudget, err)
		}
		if ok {
			return nil
		}
		switch {
		case c.buf.K > 0 && c.buf.W != nil && c.buf.W.DevCharge > 0:
			c.st.BudgetFlushes.Add(1)
			if err := c.flushBuffer(); err != nil {
				return err
			}
		case c.forceOldestDeferred():
			c.st.BudgetFlushes.Add(1)
		case c.q.Pending() > 0:
			t0 := time.Now()
			c.q.Drain()
			c.st.StallNanos.Add(int64(time.Since(t0)))
		default:
			// Nothing left to force out. Bytes may have been released since
			// the attempt (the committer, a Materialize or Discard): try again
			// while they would fit; what is still held then is pinned by
			// steps not consumed yet.
			if ch, _ := c.budget.Charged(); ch+n <= c.budget.Limit() {
				continue
			} else {
				return fmt.Errorf("%w: %d bytes wanted, %d of %d held by steps not consumed yet", ErrBudget, n, ch, c.budget.Limit())
			}
		}
		if err := c.check(); err != nil {
			return err
		}
	}
}

// join is the save-side join point: before a write is handed over, the
// engine goroutine waits for the device→host copies of the write before the
// previous one. At most two writes' copies are in flight, and a step's rows
// are host-ready once two more writes were saved, without serializing each
// save behind the copy it just issued.
func (c *Cache) join(ev gpu.Event) error {
	prev := c.lastEv[0]
	c.lastEv[0], c.lastEv[1] = c.lastEv[1], ev
	if err := c.dev.Wait(prev); err != nil {
		return c.fail(err)
	}
	return nil
}

// ---- hits ----

// planHits plans the prefix reads of requests whose hit is served in this
// step. Runs after this step's claims, so a hit on blocks this step writes
// reads this step's rows. Under the state lock; no data moves.
func (c *Cache) planHits(rec *stepRec) {
	if len(c.cur.hitReq) == 0 {
		return
	}
	rec.planOff = grow(rec.planOff, len(rec.ids))
	rec.hitOff = grow(rec.hitOff, len(rec.ids))
	for i := range rec.planOff {
		rec.planOff[i], rec.hitOff[i] = -1, -1
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, i := range c.cur.hitReq {
		h := c.cur.h[i]
		pos := c.reqs.Pos(h)
		c.reqs.Flags[pos] &^= flagHitPending
		ht := int(c.reqs.HitTokens[pos])
		if len(rec.prefix) == 0 {
			rec.prefix = grow(rec.prefix, len(rec.ids))
			clear(rec.prefix)
		}
		rec.prefix[i] = int32(ht)
		rec.planOff[i] = int32(len(rec.pKind))
		c.st.HitRequests.Add(1)
		c.st.HitTokens.Add(int64(ht))
		blocks := c.reqs.HitBlocks(h)
		// Immediate keys: the hit's blocks are the plan (their slots are
		// expanded and checked when the read runs, see readJoined).
		rec.hitOff[i] = int32(len(rec.hitBlocks))
		rec.hitBlocks = append(rec.hitBlocks, blocks...)
		// Deferred keys: per row, where the row is now.
		for _, k := range c.def {
			occ := c.keys[k].occ
			for t := 0; t < ht; t++ {
				s := blocks[t/c.bs]*int32(c.bs) + int32(t%c.bs)
				kind, row := uint8(srcMirror), uint32(0)
				var pp *writer.Write
				w := occ.Word(s)
				switch st, owner := soa.Unpack(w); st {
				case soa.Absent:
					kind = srcAbsent
					if c.keys[k].Optional {
						kind = srcZero
					}
				case soa.InTransit:
					// pending deferred rows: read the device clone
					pp = c.clones[owner]
					if pp == nil {
						panic("omnicache: in-transit slot without its clone")
					}
					kind, row = srcClone, occ.Row(s)
					rec.pin(pp)
				}
				rec.pKind = append(rec.pKind, kind)
				rec.pSlot = append(rec.pSlot, s)
				rec.pWord = append(rec.pWord, w)
				rec.pProd = append(rec.pProd, pp)
				rec.pRow = append(rec.pRow, row)
			}
		}
	}
}

// dropRec releases a record's pins (Save failed or step consumed) and
// recycles it. Caller holds c.mu; writes nothing references any more are
// released here (page and budget returns and device frees are not waits).
func (c *Cache) dropRec(rec *stepRec) {
	for _, p := range rec.pins {
		if c.unrefLocked(p, 1, 0) {
			c.release(p, true)
		}
	}
	clear(rec.pins)
	rec.pins = rec.pins[:0]
	c.recFree = append(c.recFree, rec)
}

// handBack calls Config.ReleaseHost for the owned host buffers released
// under the state lock. Call it without the lock.
func (c *Cache) handBack() {
	if c.cfg.ReleaseHost == nil {
		return
	}
	c.mu.Lock()
	if len(c.handback) == 0 {
		c.mu.Unlock()
		return
	}
	bufs := c.handback
	c.handback = nil
	c.mu.Unlock()
	for _, b := range bufs {
		c.cfg.ReleaseHost(b)
	}
}

// ---- Materialize / Discard ----

// take removes an unconsumed step record (validating reqs first).
func (c *Cache) take(id StepID, reqs []int64) (*stepRec, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.takeLocked(id, reqs)
}

func (c *Cache) takeLocked(id StepID, reqs []int64) (*stepRec, error) {
	for i, r := range c.steps {
		if r.id != id {
			continue
		}
		r.qidx = r.qidx[:0]
		for _, q := range reqs {
			j := r.find(q)
			if j < 0 {
				return nil, fmt.Errorf("%w: request %d in step %d", ErrNotInStep, q, id)
			}
			r.qidx = append(r.qidx, int32(j))
		}
		c.steps = append(c.steps[:i], c.steps[i+1:]...)
		return r, nil
	}
	return nil, fmt.Errorf("%w: %d", ErrUnknownStep, id)
}

// Discard consumes step id without reading it. Any goroutine.
func (c *Cache) Discard(id StepID) error {
	if err := c.check(); err != nil {
		return err
	}
	c.mu.Lock()
	rec, err := c.takeLocked(id, nil)
	if err == nil {
		c.dropRec(rec)
	}
	c.mu.Unlock()
	c.handBack()
	return err
}

// Materialize fills dst with, per request of reqs (nil: every request of the
// step, in batch order) and key, `[hit prefix rows | this step's rows]`, and
// consumes the step id. The read is planned at Save under the state lock and
// executed here outside it. Any goroutine.
func (c *Cache) Materialize(id StepID, reqs []int64, dst *Result) error {
	if err := c.check(); err != nil {
		return err
	}
	rec, err := c.take(id, reqs)
	if err != nil {
		return err
	}
	err = c.read(rec, reqs, dst)
	c.mu.Lock()
	c.dropRec(rec)
	c.mu.Unlock()
	c.handBack()
	if err == nil {
		err = c.check()
	}
	return err
}

func (c *Cache) read(rec *stepRec, reqs []int64, dst *Result) error {
	dst.reset(c.rowB)
	tokOff := rec.offsets()
	nq := len(reqs)
	if reqs == nil {
		nq = len(rec.ids)
	}
	// which maps the qi-th request asked for to its index in the step
	// (take resolved reqs into rec.qidx).
	which := func(qi int) int {
		if reqs == nil {
			return qi
		}
		return int(rec.qidx[qi])
	}
	for qi := 0; qi < nq; qi++ {
		i := which(qi)
		pre := rec.prefixOf(i)
		dst.add(rec.ids[i], pre, pre+rec.count[i])
	}
	dst.size()
	for qi := 0; qi < nq; qi++ {
		i := which(qi)
		pre := int(rec.prefixOf(i))
		if pre > 0 {
			c.st.HitRows.Add(int64(pre))
		}
		for k := range c.keys {
			rb := c.rowB[k]
			out := dst.Rows(qi, k)
			if pre > 0 {
				if err := c.readPrefix(rec, i, k, pre, out[:pre*rb]); err != nil {
					return fmt.Errorf("request %d, key %q: %w", rec.ids[i], c.keys[k].Name, err)
				}
			}
			cnt := int(rec.count[i])
			if cnt == 0 {
				continue
			}
			p := rec.src[k]
			if p == nil {
				return fmt.Errorf("%w: step %d has no rows for key %q", ErrWriteFailed, rec.id, c.keys[k].Name)
			}
			r0 := int(rec.srcOff[k]) + int(tokOff[i])
			if err := c.readWrite(p, k, r0, cnt, out[pre*rb:]); err != nil {
				return err
			}
		}
	}
	return nil
}

// readPrefix reads request i's hit prefix of key k (pre rows) into out.
func (c *Cache) readPrefix(rec *stepRec, i, k, pre int, out []byte) error {
	if c.keys[k].imm >= 0 {
		return c.readJoined(rec, i, k, pre, out)
	}
	base := int(rec.planOff[i]) + c.keys[k].def*pre
	rb := c.rowB[k]
	occ := c.keys[k].occ
	for t := 0; t < pre; t++ {
		e := base + t
		d := out[t*rb : (t+1)*rb]
		switch rec.pKind[e] {
		case srcZero:
			clear(d)
		case srcAbsent:
			return fmt.Errorf("%w: position %d (slot %d) never written", ErrAbsentRequired, t, rec.pSlot[e])
		case srcMirror:
			s := rec.pSlot[e]
			if occ.Word(s) != rec.pWord[e] {
				return fmt.Errorf("%w: position %d (slot %d)", ErrReassigned, t, s)
			}
			m := c.mirrors.Get(k)
			if m == nil {
				return fmt.Errorf("%w: position %d (slot %d): committed slot without mirror", ErrReassigned, t, s)
			}
			m.ReadRow(d, s)
			if occ.Word(s) != rec.pWord[e] {
				return fmt.Errorf("%w: position %d (slot %d)", ErrReassigned, t, s)
			}
		case srcClone:
			if err := c.readWrite(rec.pProd[e], k, int(rec.pRow[e]), 1, d); err != nil {
				return err
			}
		}
	}
	return nil
}

// readJoined reads a hit prefix of an immediate key from the mirror once
// every write handed over before the plan has landed. Each block's owner is
// checked against the plan (a newer owner: reassigned), each slot's written
// bit tells absent rows; if a scatter overlapped the copies (the
// committer's epoch moved), the owners are checked again once it is over: a
// scatter into one of these blocks can only be newer than the plan, and it
// publishes the new owner when it is done.
func (c *Cache) readJoined(rec *stepRec, i, k, pre int, out []byte) error {
	c.q.Wait(rec.joinSeq)
	if err := c.check(); err != nil {
		return err
	}
	nb := (pre + c.bs - 1) / c.bs
	sl := grow(rec.slots, pre)
	rec.slots = sl
	if _, err := slots.Expand(sl, rec.hitBlocks[rec.hitOff[i]:int(rec.hitOff[i])+nb], c.bs, pre); err != nil {
		return fmt.Errorf("%w: %w", ErrPlan, err) // validated at Begin: cannot happen
	}
	rb := c.rowB[k]
	m := c.mirrors.Get(k)
	own := grow(rec.owners, pre)
	rec.owners = own
	e1 := c.com.Epoch()
	for t, s := range sl {
		d := out[t*rb : (t+1)*rb]
		o := c.ten.Owner(s)
		own[t] = o
		switch {
		case o > rec.maxOwner:
			return fmt.Errorf("%w: position %d (slot %d)", ErrReassigned, t, s)
		case !c.ten.Written(s) && c.keys[k].Optional:
			clear(d)
			continue
		case !c.ten.Written(s):
			return fmt.Errorf("%w: position %d (slot %d) never written", ErrAbsentRequired, t, s)
		}
		m.ReadRow(d, s)
	}
	if e1&1 == 0 && c.com.Epoch() == e1 {
		return nil
	}
	c.com.EvenEpoch()
	for t, s := range sl {
		if c.ten.Owner(s) != own[t] {
			return fmt.Errorf("%w: position %d (slot %d)", ErrReassigned, t, s)
		}
	}
	return nil
}

// readWrite copies rows [r0, r0+cnt) of write p for key k into out.
func (c *Cache) readWrite(p *writer.Write, k, r0, cnt int, out []byte) error {
	rb := c.rowB[k]
	if p.Deferred {
		if err := c.dev.CopyDtoH(out[:cnt*rb], p.Buf, r0*rb); err != nil {
			return c.fail(err)
		}
		ev, err := c.dev.Record()
		if err == nil {
			err = c.dev.Wait(ev)
		}
		if err != nil {
			return c.fail(err)
		}
		return nil
	}
	ki := c.keys[k].imm
	for cnt > 0 {
		j, i := r0/p.N, r0%p.N
		m := min(cnt, p.N-i)
		slot := j*len(c.imm) + ki
		if h := p.Host[slot]; h != nil {
			if err := c.dev.Wait(p.Ev); err != nil {
				return c.fail(err)
			}
			copy(out[:m*rb], h[i*rb:(i+m)*rb])
		} else if err := c.readParked(p, slot, i, m, rb, out); err != nil {
			return err
		}
		out = out[m*rb:]
		r0 += m
		cnt -= m
	}
	return nil
}

// readParked reads rows of a decode-buffer step whose rows were parked on
// the device: from the device while they are there, else from the staged
// copy the flush made (the committer releases the device rows once it is
// complete).
func (c *Cache) readParked(p *writer.Write, slot, i, m, rb int, out []byte) error {
	c.mu.Lock()
	live := p.DevLive
	if live {
		p.DevReads++
	}
	c.mu.Unlock()
	if !live {
		copy(out[:m*rb], p.Staged[slot][i*rb:(i+m)*rb])
		return nil
	}
	err := c.dev.CopyDtoH(out[:m*rb], p.Dev[slot], i*rb)
	if err == nil {
		var ev gpu.Event
		if ev, err = c.dev.Record(); err == nil {
			err = c.dev.Wait(ev)
		}
	}
	c.mu.Lock()
	p.DevReads--
	free := p.DevReads == 0 && p.DevRelease
	if free {
		p.DevRelease = false
		c.freeDev(p)
	}
	c.mu.Unlock()
	if err != nil {
		return c.fail(err)
	}
	return nil
}

// committerOwner is the cache's side of the committer (writer.Owner).
type committerOwner struct{ c *Cache }

func (o committerOwner) Failed() bool   { return o.c.failed.Load() != nil }
func (o committerOwner) Fail(err error) { o.c.fail(err) }

// Staged releases the device copies a write held until its rows were
// host-ready: step clones, and parked device rows (or leaves those to the
// last reader still copying from them).
func (o committerOwner) Staged(w *writer.Write) {
	c := o.c
	c.mu.Lock()
	if w.DevLive {
		if w.DevReads == 0 {
			c.freeDev(w)
		} else {
			w.DevLive, w.DevRelease = false, true
		}
	}
	c.mu.Unlock()
	for _, b := range w.Early {
		c.dev.Free(b)
	}
	w.Early = w.Early[:0]
	c.budget.Release(w.EarlyB)
	w.EarlyB = 0
}

// Landed drops the references a finished task held and releases the
// writes nothing references any more.
func (o committerOwner) Landed(t writer.Task) {
	c := o.c
	rel := c.landed[:0] // committer-only scratch
	c.mu.Lock()
	if t.W != nil && c.unrefLocked(t.W, 0, 1) {
		rel = append(rel, t.W)
	}
	for _, s := range t.Segs {
		if c.unrefLocked(s.W, 0, 1) {
			rel = append(rel, s.W)
		}
	}
	c.mu.Unlock()
	for _, w := range rel {
		c.releaseWrite(w)
	}
	clear(rel)
	c.landed = rel[:0]
}

// ---- Sync, Peek, Close, Stats ----

// Sync writes out the decode buffer and waits until every write handed to
// the committer has landed in the mirror. Deferred rows of live requests stay
// pending (they land when their request finishes). Engine goroutine only.
func (c *Cache) Sync() error {
	if err := c.check(); err != nil {
		return err
	}
	if c.buf.K > 0 {
		if err := c.flushBuffer(); err != nil {
			return err
		}
	}
	c.q.Drain()
	return c.check()
}

// Peek reads the committed mirror rows of key k (Config.Keys order) for
// slots into dst (len(slots)*RowBytes bytes); slots never written read as
// zeros. A diagnostic for tests and verification: call it after Sync.
func (c *Cache) Peek(k int, sl []int32, dst []byte) error {
	if err := c.check(); err != nil {
		return err
	}
	if k < 0 || k >= len(c.keys) {
		return fmt.Errorf("%w: key index %d", ErrPlan, k)
	}
	if len(dst) < len(sl)*c.rowB[k] {
		return fmt.Errorf("%w: %d bytes for %d rows", ErrOutputs, len(dst), len(sl))
	}
	for _, s := range sl {
		if s < 0 || int(s) >= c.nslots {
			return fmt.Errorf("%w: slot %d outside [0,%d)", ErrPlan, s, c.nslots)
		}
	}
	m := c.mirrors.Get(k)
	if m == nil {
		clear(dst[:len(sl)*c.rowB[k]])
		return nil
	}
	m.Read(dst[:len(sl)*c.rowB[k]], sl)
	return nil
}

// Close stops the committer (after it drained what was handed to it) and
// releases every page, budget charge and device buffer. Later calls return
// ErrClosed. Engine goroutine; call it once no Materialize is in flight.
func (c *Cache) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	c.q.Close()
	c.com.Wait()
	c.pages.Close()
	c.mu.Lock()
	var rel []*writer.Write
	seen := map[*writer.Write]bool{}
	add := func(p *writer.Write) {
		if p != nil && !seen[p] {
			seen[p] = true
			rel = append(rel, p)
		}
	}
	for _, r := range c.steps {
		for _, p := range r.pins {
			add(p)
		}
		r.pins = r.pins[:0]
	}
	c.steps = nil
	for _, p := range c.clones {
		add(p)
	}
	add(c.buf.W)
	c.clones = map[uint64]*writer.Write{}
	c.mu.Unlock()
	for _, p := range rel {
		c.releaseWrite(p)
	}
	c.buf = writer.DecodeBuf{}
	if m := c.spare.Close(); m != nil {
		c.dev.FreeHost(m)
	}
	c.pages.Each(func(pg *writer.Page) {
		if pg.Mem != nil {
			c.dev.FreeHost(pg.Mem)
			pg.Mem = nil
		}
	})
	for _, k := range c.def {
		c.keys[k].occ.Free()
	}
	if c.ten != nil {
		c.ten.Free()
	}
	c.mirrors.Free()
	return nil
}

// Stats returns the cache's counters. Any goroutine.
func (c *Cache) Stats() Stats {
	// Every source is atomic or has its own lock: Stats never waits on the
	// state lock.
	ch, peak := c.budget.Charged()
	res := c.mirrors.ResidentBytes()
	return Stats{
		Steps:               c.st.Steps.Load(),
		WriteTasks:          c.st.Tasks.Load(),
		RowsWritten:         c.st.Rows.Load(),
		BytesWritten:        c.st.Bytes.Load(),
		RowsSkipped:         c.st.Skipped.Load(),
		BufferedSteps:       c.st.Buffered.Load(),
		BufferFlushes:       c.st.Flushes.Load(),
		DeferredWrites:      c.st.DeferredWrites.Load(),
		BudgetFlushes:       c.st.BudgetFlushes.Load(),
		HitRequests:         c.st.HitRequests.Load(),
		HitTokens:           c.st.HitTokens.Load(),
		HitRowsRead:         c.st.HitRows.Load(),
		CommitterNanos:      c.st.CommitNanos.Load(),
		StallNanos:          c.st.StallNanos.Load(),
		MirrorResidentBytes: res,
		BudgetCharged:       ch,
		BudgetLimit:         c.budget.Limit(),
		BudgetPeak:          peak,
		ClonedBytes:         c.st.Cloned.Load(),
		PagesInUse:          c.pages.InUse(),
		PagesAllocating:     b2i(c.spare.Pending()),
		LiveRequests:        int(c.live.Load()),
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
