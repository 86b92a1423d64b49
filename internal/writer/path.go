package writer

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/errs"
	"github.com/omnicache/omnicache/mirror"
	"github.com/omnicache/omnicache/soa"
)

// KeySpec is one configured key as the write path sees it.
type KeySpec struct {
	Name     string
	RowBytes int
	Deferred bool
	Optional bool
}

// Config configures a Path; the root package validated and defaulted it.
type Config struct {
	Dev          gpu.Device
	NumBlocks    int
	BlockSize    int
	Keys         []KeySpec
	StagingDepth int
	Capacity     int           // rows per staging page
	ClaimTimeout time.Duration // < 0: fail at once
	Budget       int64         // device byte budget
	ChunkBytes   int64         // largest device→host copy of deferred rows
	WaitTimeout  time.Duration // bound of every wait on the committer (< 0: none)
	SyncSpin     time.Duration // how long Sync spins before it parks (0: as every wait)
	ReleaseHost  func([]byte)
	CopyWorkers  int // see CommitterConfig
	SplitBytes   int // see CommitterConfig (tests)
	LazyBytes    int // the largest step write handed over lazily (<= 0: lazyBytes; tests)
	// Rider and Gather publish full blocks (a shared tier): the blocks
	// Rider names ride on the writes handed over and are read into Gather
	// once those land (both nil: none). Immediate keys only.
	Rider  Rider
	Gather Gather
	// Hists, when set, receives the path's latencies and sizes.
	Hists *Hists
	// Direct makes the committer copy a step's device rows straight into
	// the mirror (see Write.Direct) when they weigh at least
	// DirectMinBytes (0: directMinBytes); on a gpu.HostRegistrar device the
	// mirror's chunks are registered with it as they are made.
	Direct         bool
	DirectMinBytes int64
	// Alloc says when the staging pages' memory is allocated.
	Alloc Alloc
}

// Alloc says when NewPath allocates the staging pages' memory.
type Alloc uint8

const (
	// AllocLazy: a page's memory on its first use, and each next page's
	// ahead, in the background (Spare), once the one before was taken.
	AllocLazy Alloc = iota
	// AllocAll: every page's now, as one allocation (pinned memory is
	// mostly page zeroing and pinning: one allocation spreads the zeroing
	// over the machine's cores and pins in one sequence of driver calls,
	// where concurrent allocations contend), so that no Save allocates a
	// page or runs beside a background allocation.
	AllocAll
	// AllocAhead: the first page's now, the others' on a background
	// goroutine from then on, one after another (Spare.Fill).
	AllocAhead
)

// Layout is the key layout both paths share, read-only after NewPath.
type Layout struct {
	BlockSize int
	NumSlots  int
	Keys      []KeySpec
	RowBytes  []int // per key
	Imm, Def  []int // key indices of the immediate / deferred keys
	ImmIdx    []int // per key: index among the immediate keys, -1 if deferred
	DefIdx    []int // per key: index among the deferred keys, -1 if immediate
}

// Path is the write path of one cache. See the package doc for what it
// owns and which goroutine calls what.
type Path struct {
	cfg Config
	lay Layout
	dev gpu.Device
	cap int

	pageB int // bytes of one page
	// lazyTokens is the most tokens a step write handed over lazily holds
	// (lazyBytes of immediate rows; see writeStep).
	lazyTokens int
	pageO      []int     // per key: offset of its region in a page (immediate keys)
	into       [][]byte  // Step.Into of the write being staged (writeStep), else nil
	intoFix    []intoFix // its rows read from the engine's tensors until saveInto
	immRowB    int       // bytes of one row of every immediate key

	pages   *Pages
	spare   *Spare // page memory allocated one page ahead
	block   []byte // every page's memory, when allocPages made it
	budget  *Budget
	q       *Queue[Task]
	com     *Committer
	mirrors *Mirrors
	ten     *soa.Tenancy     // immediate keys (written together, in order)
	occ     []*soa.Occupancy // per key: deferred keys' per-slot occupancy
	parts   Parts

	// failed is read by every call (Err) and written once: it sits with
	// the read-only fields above, not on the state lock's line, which the
	// committer writes at every commit (a read there cost the engine a
	// cache miss per call on a many-core host).
	failed atomic.Pointer[error]

	// mu is the state lock: reference counts of writes, the clone table,
	// parked-row reads and the hand-back list. The padding keeps it, the
	// engine goroutine's fields and the counters the committer bumps on
	// separate cache lines (false sharing slows every engine step;
	// BenchmarkStep engine-ns/op shows it).
	_            [64]byte
	mu           sync.Mutex
	clones       map[uint64]*Write
	handback     [][]byte
	pinnedCharge int64    // budget charge of deferred clones pinned by steps
	wfreeMu      []*Write // released immediate writes, released under mu (see newWrite)
	_            [64]byte

	// wfree recycles immediate writes released without the state lock
	// (see newWrite).
	wmu   sync.Mutex
	wfree []*Write
	_     [64]byte

	// engine goroutine only
	nextID  uint64
	buf     DecodeBuf
	segs    Runs
	defOpen []uint64 // per handle: sequence of its open deferred write (0: none)
	defFIFO []openRef
	defSeq  uint64
	lastEv  [2]gpu.Event // the last two host-row writes' events (see join)
	plog    pendLog      // tasks handed over that land immediate rows (joinSeq)
	wstash  []*Write     // released writes taken from wfree in one batch
	pre     []gpu.Buffer // per key: this Save's clone of a non-owned device tensor (preClone)
	late    lateCopier   // copies a step's clones out while Save waits for them (writeStep)
	_       [64]byte
	landed  []*Write // committer-only scratch (Landed)
	_       [64]byte
	st      Counters
	_       [64]byte
}

type openRef struct {
	h   soa.Handle
	seq uint64
}

// NewPath builds the write path and starts its committer. It allocates no
// mirror (made on a key's first write) and staging memory as cfg.Alloc
// says; its per-slot tables are mapped untouched. A mapping the OS refuses
// (an address-space limit) fails it with errs.Config wrapping
// hostmem.ErrNoMemory, a staging allocation the device refuses with the
// device's error (gpu.ErrAlloc): either way it holds nothing.
func NewPath(cfg Config) (*Path, error) {
	if cfg.SyncSpin == 0 {
		cfg.SyncSpin = waitSpin
	}
	if cfg.DirectMinBytes == 0 {
		cfg.DirectMinBytes = directMinBytes
	}
	nslots := cfg.NumBlocks * cfg.BlockSize
	immRowB := 0
	p := &Path{
		cfg:    cfg,
		dev:    cfg.Dev,
		cap:    cfg.Capacity,
		pageO:  make([]int, len(cfg.Keys)),
		occ:    make([]*soa.Occupancy, len(cfg.Keys)),
		clones: make(map[uint64]*Write),
	}
	l := &p.lay
	l.BlockSize, l.NumSlots, l.Keys = cfg.BlockSize, nslots, cfg.Keys
	for i, k := range cfg.Keys {
		l.RowBytes = append(l.RowBytes, k.RowBytes)
		if k.Deferred {
			o, err := soa.NewOccupancy(nslots)
			if err != nil {
				return nil, p.tablesError(err)
			}
			p.occ[i] = o
			l.ImmIdx = append(l.ImmIdx, -1)
			l.DefIdx = append(l.DefIdx, len(l.Def))
			l.Def = append(l.Def, i)
			continue
		}
		l.ImmIdx = append(l.ImmIdx, len(l.Imm))
		l.DefIdx = append(l.DefIdx, -1)
		l.Imm = append(l.Imm, i)
		p.pageO[i] = p.pageB
		p.pageB += p.cap * k.RowBytes
		immRowB += k.RowBytes
	}
	if immRowB > 0 {
		lb := lazyBytes
		if cfg.LazyBytes > 0 {
			lb = cfg.LazyBytes
		}
		p.lazyTokens = lb / immRowB
	}
	if len(l.Imm) > 0 {
		// Optional immediate keys get an absent column (a step may omit
		// them); required keys do not.
		opt := make([]bool, len(l.Imm))
		for ki, k := range l.Imm {
			opt[ki] = cfg.Keys[k].Optional
		}
		t, err := soa.NewTenancy(cfg.NumBlocks, cfg.BlockSize, opt...)
		if err != nil {
			return nil, p.tablesError(err)
		}
		p.ten = t
	}
	p.pages = NewPages(cfg.StagingDepth)
	p.spare = NewSpare(p.dev.AllocHost, p.pageB, cfg.StagingDepth)
	p.budget = NewBudget(cfg.Budget)
	p.q = NewQueue[Task](2 * cfg.StagingDepth)
	var reg gpu.HostRegistrar
	if cfg.Direct {
		reg, _ = p.dev.(gpu.HostRegistrar)
	}
	p.mirrors = NewMirrors(nslots, l.RowBytes, reg)
	p.immRowB = immRowB
	p.late.h = cfg.Hists
	com, err := NewCommitter(CommitterConfig{
		Dev: p.dev, Queue: p.q, Mirrors: p.mirrors, RowBytes: l.RowBytes, Imm: l.Imm,
		Tenancy: p.ten, Occ: p.occ, NumSlots: nslots, ChunkBytes: cfg.ChunkBytes,
		Stats: &p.st, Owner: committerOwner{p}, CopyWorkers: cfg.CopyWorkers, SplitBytes: cfg.SplitBytes,
		BlockSize: cfg.BlockSize, Gather: cfg.Gather, Hists: cfg.Hists,
	})
	if err != nil {
		return nil, p.tablesError(err)
	}
	p.com = com
	p.com.Start()
	p.parts = Parts{Layout: &p.lay, Counters: &p.st, Hists: cfg.Hists, Mirrors: p.mirrors, Tenancy: p.ten, Occ: p.occ,
		Workers: com.Workers(), Progress: com.Progress()}
	switch cfg.Alloc {
	case AllocAll:
		err = p.allocPages()
	case AllocAhead:
		err = p.allocPagesAhead()
	}
	if err != nil {
		p.Close(time.Time{}, nil) // nothing was saved: the committer stops at once
		return nil, err
	}
	return p, nil
}

// tablesError frees the per-slot tables mapped so far and returns the
// error of the one the OS refused.
func (p *Path) tablesError(err error) error {
	p.freeTables()
	return fmt.Errorf("%w: %d blocks of %d slots: %w", errs.Config, p.cfg.NumBlocks, p.cfg.BlockSize, err)
}

// freeTables returns the per-slot tables NewPath mapped (so far, when it
// failed).
func (p *Path) freeTables() {
	for _, o := range p.occ {
		if o != nil {
			o.Free()
		}
	}
	if p.ten != nil {
		p.ten.Free()
	}
}

// allocPages allocates every staging page's memory now, as one
// allocation (AllocAll). On failure nothing is allocated and the error
// wraps the device's. Called once, before the first Save.
func (p *Path) allocPages() error {
	if p.pageB == 0 {
		return nil
	}
	n := p.cfg.StagingDepth
	mem, err := p.dev.AllocHost(n * p.pageB)
	if err != nil {
		return fmt.Errorf("staging pages: %w", err)
	}
	i := 0
	p.pages.Each(func(pg *Page) {
		o := i * p.pageB
		pg.Mem = mem[o : o+p.pageB : o+p.pageB]
		i++
	})
	p.block = mem
	p.spare = NewSpare(p.dev.AllocHost, p.pageB, 0) // nothing left to allocate
	return nil
}

// allocPagesAhead allocates the first staging page's memory now and the
// other pages' on a background goroutine, one after another (AllocAhead).
// An error wraps the device's: nothing is allocated then.
func (p *Path) allocPagesAhead() error {
	if p.pageB == 0 {
		return nil
	}
	if err := p.spare.Fill(); err != nil {
		return fmt.Errorf("staging pages: %w", err)
	}
	return nil
}

// ---- the parts others read (any goroutine) ----

// Parts are the write path's tables, counters and watchers that the cache
// and the read path read directly, without a call through the path: fixed
// from NewPath on. Each part says which goroutine may do what.
type Parts struct {
	Layout   *Layout
	Counters *Counters // the path's statistics (the read path adds its own)
	Hists    *Hists    // Config.Hists (nil: off)
	Mirrors  *Mirrors
	// Tenancy is the immediate keys' per-slot owner table, with an absent
	// column per optional immediate key (nil without immediate keys);
	// Occ[k] deferred key k's per-slot occupancy (nil for immediate keys).
	Tenancy *soa.Tenancy
	Occ     []*soa.Occupancy
	// Workers are the copy workers the committer's scatters and the read
	// path's large gathers are split across.
	Workers *mirror.Workers
	// Progress is the committer's: its queue position, its sleep, its
	// scatter epoch.
	Progress *Progress
}

// Parts returns the path's parts.
func (p *Path) Parts() *Parts { return &p.parts }

// Usage is what a path holds at one moment.
type Usage struct {
	// BudgetCharged is the device bytes charged now, BudgetPeak the most
	// ever charged, BudgetLimit the budget.
	BudgetCharged, BudgetPeak, BudgetLimit int64
	// PagesInUse is the staging pages held now; PagesAllocating 1 while a
	// page's memory is being allocated ahead in the background (Spare).
	PagesInUse, PagesAllocating int
	// MirrorBytes is the host memory backing the mirrors.
	MirrorBytes int64
}

// Usage reports what the path holds now. Any goroutine; it takes no state
// lock.
func (p *Path) Usage() Usage {
	u := Usage{BudgetLimit: p.budget.Limit(), PagesInUse: p.pages.InUse(), MirrorBytes: p.mirrors.ResidentBytes()}
	u.BudgetCharged, u.BudgetPeak = p.budget.Charged()
	if p.spare.Pending() {
		u.PagesAllocating = 1
	}
	return u
}

// ---- the sticky failure ----

// Err is the sticky write failure (nil while none).
func (p *Path) Err() error {
	if e := p.failed.Load(); e != nil {
		return *e
	}
	return nil
}

// Fail makes err, a failed device call of the cache's own (a copy into
// the engine's device buffers), the sticky failure, as fail.
func (p *Path) Fail(err error) error { return p.fail(err) }

// fail makes err sticky (the first failure wins) and returns the sticky
// error, which matches errs.WriteFailed.
func (p *Path) fail(err error) error {
	e := fmt.Errorf("%w: %w", errs.WriteFailed, err)
	if p.failed.CompareAndSwap(nil, &e) {
		p.pages.Fail() // a Save waiting for a page wakes with the failure
	}
	return *p.failed.Load()
}

// WaitSeq waits until the committer has processed queue item seq and
// everything before it, bounded by the wait timeout: a committer that does
// not get there in time (a device that never completes a copy) fails the
// path with errs.DeviceTimeout. Any goroutine.
func (p *Path) WaitSeq(seq uint64) error { return p.waitSeqSpin(seq, waitSpin) }

// waitSeqSpin is WaitSeq spinning up to spinFor before it parks.
func (p *Path) waitSeqSpin(seq uint64, spinFor time.Duration) error {
	if !p.q.WaitForSpin(seq, p.cfg.WaitTimeout, spinFor) {
		return p.fail(fmt.Errorf("%w: the committer did not reach write %d within %v", errs.DeviceTimeout, seq, p.cfg.WaitTimeout))
	}
	return p.Err()
}

// waitDev waits for device event ev, bounded by the wait timeout; a
// failure or a timeout fails the path (sticky; errs.DeviceTimeout for a
// timeout). Engine goroutine and readers (the committer waits unbounded:
// a copy still in flight may write its staging memory, which must then stay
// allocated).
func (p *Path) waitDev(ev gpu.Event) error {
	err := p.dev.WaitFor(ev, p.cfg.WaitTimeout)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, gpu.ErrTimeout):
		return p.fail(fmt.Errorf("%w: %w", errs.DeviceTimeout, err))
	default:
		return p.fail(err)
	}
}

// drain waits (bounded, see WaitSeq) for everything handed over so far,
// for room in the device budget: the wait is the engine goroutine's stall
// (Counters.StallNanos, the committer-wait histogram).
func (p *Path) drain() error {
	t0 := time.Now()
	err := p.WaitSeq(p.q.Pushed())
	p.st.StallNanos.Add(int64(time.Since(t0)))
	p.cfg.Hists.committerWait(t0)
	return err
}

func (p *Path) newID() uint64 { p.nextID++; return p.nextID }

// ---- engine-goroutine calls outside Save ----

// BufferContinues reports whether a pure-decode step over ids may join the
// parked steps.
func (p *Path) BufferContinues(ids []int64) bool { return p.buf.Continues(ids) }

// Flush hands the committer what a step's Begin must have written first:
// the parked decode steps when buffer (the step does not continue them),
// then the deferred rows of the finished requests (their open writes still
// land). It returns the queue sequence of the deferred rows' task (0:
// none). Engine goroutine.
func (p *Path) Flush(buffer bool, finished []soa.Handle) uint64 {
	if buffer {
		p.flushBuffer(false)
	}
	for _, h := range finished {
		p.finish(h)
	}
	return p.flushFinished()
}

// Sync writes out the decode buffer and waits until every write handed to
// the committer has landed.
func (p *Path) Sync() error {
	if p.buf.K > 0 {
		p.flushBuffer(false)
	}
	p.spare.Wait()
	t0 := p.cfg.Hists.now()
	err := p.waitSeqSpin(p.q.Pushed(), p.cfg.SyncSpin)
	p.cfg.Hists.committerWait(t0)
	return err
}

// Close stops the path. First a Save waiting for a staging page wakes
// (failing with the pool closed) and later claims fail; then quiesce (nil:
// nothing to wait for) waits for its owner's calls in flight and returns
// the refs of the steps not consumed, or an error that ends Close there,
// nothing freed. Then the committer drains what was handed to it and
// stops, and every page, budget charge and device buffer the path holds is
// released, the unconsumed steps' pins included. If the committer does not
// stop by deadline (zero: no bound; a device that never completes a copy),
// nothing is freed, since the committer may still touch it, and Close
// reports errs.DeviceTimeout. Called once.
func (p *Path) Close(deadline time.Time, quiesce func() ([]*Refs, error)) error {
	p.pages.Close()
	var unconsumed []*Refs
	if quiesce != nil {
		var err error
		if unconsumed, err = quiesce(); err != nil {
			return err
		}
	}
	p.q.Close()
	if !p.com.WaitUntil(deadline) {
		return fmt.Errorf("%w: the committer did not stop (%d writes pending); the cache's memory is left allocated", errs.DeviceTimeout, p.q.Pending())
	}
	p.mu.Lock()
	var rel []*Write
	seen := map[*Write]bool{}
	add := func(w *Write) {
		if w != nil && !seen[w] {
			seen[w] = true
			rel = append(rel, w)
		}
	}
	for _, r := range unconsumed {
		for _, w := range r.Pins {
			add(w)
		}
		clear(r.Pins)
		r.Pins = r.Pins[:0]
	}
	for _, w := range p.clones {
		add(w)
	}
	add(p.buf.W)
	p.clones = map[uint64]*Write{}
	p.mu.Unlock()
	for _, w := range rel {
		p.release(w, false)
	}
	// p.buf is left as it is (its write released above): a Begin racing
	// Close may still read it before it fails with the cache closed, and
	// nothing uses it after Close.
	for _, m := range p.spare.Close() {
		p.dev.FreeHost(m)
	}
	p.pages.Each(func(pg *Page) {
		if pg.Mem != nil && p.block == nil {
			p.dev.FreeHost(pg.Mem)
		}
		pg.Mem = nil
	})
	if p.block != nil {
		p.dev.FreeHost(p.block)
		p.block = nil
	}
	p.freeTables()
	p.mirrors.Free()
	return nil
}
