package writer

import (
	"context"
	"fmt"
	"runtime/pprof"
	"sync/atomic"
	"time"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/hostmem"
	"github.com/omnicache/omnicache/internal/scratch"
	"github.com/omnicache/omnicache/mirror"
	"github.com/omnicache/omnicache/soa"
)

// Owner is what the committer needs from the cache that owns it: its sticky
// failure, and the state-locked bookkeeping after a write landed.
type Owner interface {
	// Failed reports whether a write failed (the committer then only drops
	// references); Fail records a failure.
	Failed() bool
	Fail(err error)
	// Staged is called once w's rows are host-ready in its staging page,
	// so the device copies it holds (clones, parked rows) can be released.
	Staged(w *Write)
	// Landed is called once t's rows are in the mirror (or skipped after a
	// failure): the owner drops t's references.
	Landed(t Task)
}

// CommitterConfig wires a committer to the cache's tables.
type CommitterConfig struct {
	Dev      gpu.Device
	Queue    *Queue[Task]
	Mirrors  *Mirrors
	RowBytes []int // per key
	Imm      []int // indices of the immediate keys, in page order
	// Tenancy tracks the immediate keys (they are written together, here,
	// in queue order); Occ[k] is the occupancy of deferred key k.
	Tenancy    *soa.Tenancy
	Occ        []*soa.Occupancy
	NumSlots   int
	ChunkBytes int64 // largest device→host copy of deferred rows
	Stats      *Counters
	Owner      Owner
	// CopyWorkers is the number of goroutines a large scatter or gather is
	// split across, the asking goroutine's included (<= 1: none started);
	// SplitBytes the smallest copy split (<= 0: mirror.DefaultSplitBytes).
	CopyWorkers int
	SplitBytes  int
	// Gather receives the full blocks that ride on writes (Write.Pub),
	// once each such write landed; BlockSize is their rows.
	Gather    Gather
	BlockSize int
	// Hists, when set, receives the device→host copies' times and bytes.
	Hists *Hists
}

// Committer is the goroutine that moves host-ready rows from staging pages
// (and deferred clones) into the mirror, in queue order. For immediate keys
// it is the only writer of the tenancy table; a newer queued write's rows
// make an older write skip the same slots. While it scatters immediate rows
// its epoch (Progress) is odd, so readers of the mirror can tell when a
// copy overlapped a scatter.
type Committer struct {
	cfg     CommitterConfig
	immRowB int
	prog    *Progress
	done    chan struct{}
	workers *mirror.Workers

	// committer-only scratch, on lines of its own
	_         linePad
	mask      []int32
	chunk     []byte
	newest    []uint64 // per slot: id of the newest immediate write queued
	newestMax uint64
	scanned   uint64 // queue sequence scanned into newest
	popped    uint64 // queue sequence of the task being run
	// the landed write's riding blocks (Write.Pub), copied before Landed
	// may release it; gather's slot scratch
	pubB     []int32
	pubK     []uint64
	gatherSl []int32
	// copyLate's batch (committer goroutine)
	late   lateCopier
	direct directCopier // commitDirect's batch
	ahead  []*Write     // issueAhead's scratch
	// pollAhead is issueAhead, made once: the scatter calls it between
	// its parts (a method value made per call would allocate).
	pollAhead func()
	curID     uint64
	// unissued counts the CopyLate writes handed over whose copies were
	// not issued yet (NoteLate adds one): issueAhead looks at the queue
	// only when some are.
	unissued atomic.Int64
	_        linePad
}

// NoteLate tells the committer that a CopyLate write is about to be
// queued. Engine goroutine, before the Push.
func (c *Committer) NoteLate() { c.unissued.Add(1) }

// lateAhead is how many queued writes past the one being committed may have
// their late copies issued before their turn.
const lateAhead = 2

// NewCommitter returns a committer; Start runs it. With immediate keys it
// maps its per-slot table of queued writes (untouched until written),
// failing with an error wrapping hostmem.ErrNoMemory when the OS refuses
// it.
func NewCommitter(cfg CommitterConfig) (*Committer, error) {
	c := &Committer{cfg: cfg, done: make(chan struct{}), prog: NewProgress(cfg.Queue)}
	c.pollAhead = c.issueAhead
	c.late.h = cfg.Hists
	for _, k := range cfg.Imm {
		c.immRowB += cfg.RowBytes[k]
	}
	if len(cfg.Imm) > 0 {
		var err error
		if c.newest, err = hostmem.Uint64s(cfg.NumSlots); err != nil {
			return nil, fmt.Errorf("writer: the committer's table of %d slots: %w", cfg.NumSlots, err)
		}
	}
	return c, nil
}

// Start runs the committer on its own goroutine, labelled
// omnicache=committer for CPU profiles, until the queue is closed and
// drained, and starts the copy workers (CopyWorkers-1 goroutines, labelled
// omnicache=copy-worker) that its large scatters and the read path's large
// gathers are split across. One pool serves both: every copy is bound by
// the same memory bandwidth, so one set of goroutines bounds how many copy
// at once, and the asking goroutine (committer or Materialize caller)
// always copies a share itself, so neither waits on the other to progress.
func (c *Committer) Start() {
	c.workers = mirror.NewWorkers(c.cfg.CopyWorkers, c.cfg.SplitBytes)
	go pprof.Do(context.Background(), pprof.Labels("omnicache", "committer"), func(context.Context) { c.run() })
}

// WaitUntil blocks until the committer has stopped (after Queue.Close) or
// deadline passed (zero: no bound), and reports whether it stopped; only
// then are its scratch and copy workers released.
func (c *Committer) WaitUntil(deadline time.Time) bool {
	if deadline.IsZero() {
		<-c.done
	} else {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		select {
		case <-c.done:
		case <-t.C:
			return false
		}
	}
	c.workers.Stop() // a gather asked for later copies on its caller
	if c.chunk != nil {
		c.cfg.Dev.FreeHost(c.chunk)
		c.chunk = nil
	}
	if c.newest != nil {
		hostmem.FreeUint64s(c.newest)
		c.newest = nil
	}
	return true
}

// Progress is the committer's progress (its queue position, its sleep,
// its scatter epoch). Any goroutine.
func (c *Committer) Progress() *Progress { return c.prog }

// Workers are the copy workers (nil before Start). Any goroutine.
func (c *Committer) Workers() *mirror.Workers { return c.workers }

func (c *Committer) run() {
	defer close(c.done)
	q := c.cfg.Queue
	for {
		t, ok := q.Pop()
		if !ok {
			return
		}
		c.popped++
		if t.R != nil {
			// In-order work: every write before it landed, none after.
			// The scan resumes past it (it stopped here: see scanQueued).
			t.R.RunInOrder(c.cfg.Owner.Failed())
			c.scanned = max(c.scanned, c.popped)
			q.Done()
			continue
		}
		t0 := time.Now()
		failed := c.cfg.Owner.Failed()
		if !failed {
			var err error
			switch {
			case t.W != nil && t.W.Direct:
				err = c.commitDirect(t.W)
			case t.W != nil:
				err = c.commitImm(t.W, t.Ev)
			default:
				err = c.commitDeferred(t.Segs)
			}
			if err != nil {
				c.cfg.Owner.Fail(err)
				failed = true
			}
		}
		// Blocks riding on the write are gathered once it landed, its
		// references dropped first (its page goes back before the
		// gather's copies): their list is copied out of it.
		ride := t.W != nil && len(t.W.Pub) > 0
		if ride {
			c.pubB = append(c.pubB[:0], t.W.Pub...)
			c.pubK = append(c.pubK[:0], t.W.PubKeys...)
		}
		c.cfg.Owner.Landed(t)
		c.cfg.Stats.CommitNanos.Add(int64(time.Since(t0)))
		if ride {
			c.gather(c.pubB, c.pubK, failed)
			c.scanned = max(c.scanned, c.popped) // the scan stopped at the write (scanQueued)
		}
		q.Done()
	}
}

// copyLate issues w's device→host copies (see lateCopier).
func (c *Committer) copyLate(w *Write) (gpu.Event, error) {
	return c.late.issue(c.cfg.Dev, len(c.cfg.Imm), w)
}

// lateCopier issues a write's device→host copies (every device row, of a
// step or parked by the decode buffer, into its place in the page) as one
// batch, and records the event the scatter waits for. Until that event
// completed the rows stay readable on the device (Write.DevLive). Each
// goroutine that issues them has its own: the committer, and the engine
// goroutine for a step whose clones Save waits for (Path.writeStep).
type lateCopier struct {
	dst [][]byte
	src []gpu.Buffer
	h   *Hists // nil: off
}

func (lc *lateCopier) issue(dev gpu.Device, nimm int, w *Write) (gpu.Event, error) {
	lc.dst, lc.src = lc.dst[:0], lc.src[:0]
	for i, b := range w.Dev[:w.Steps*nimm] {
		if !b.IsZero() {
			lc.dst = append(lc.dst, w.Staged[i])
			lc.src = append(lc.src, b)
		}
	}
	if len(lc.dst) == 0 {
		return 0, nil
	}
	if lc.h != nil {
		w.lateT0 = time.Now()
		var n int64
		for _, d := range lc.dst {
			n += int64(len(d))
		}
		lc.h.CopyBytes.Observe(n)
	}
	err := gpu.CopyDtoHAll(dev, lc.dst, lc.src)
	clear(lc.dst) // no page or device references kept past the call
	clear(lc.src)
	if err != nil {
		return 0, err
	}
	return dev.Record()
}

// scanQueued records, per immediate slot, the newest write queued so far,
// so that an older write skips rows a newer one replaces. The scan stops at
// in-order work (a hit read): a write after it must not make a write before
// it skip rows the read is planned to find.
func (c *Committer) scanQueued() {
	c.scanned = c.cfg.Queue.Since(c.scanned, func(t Task) bool {
		if t.R != nil {
			return false
		}
		w := t.W
		if w == nil {
			return true
		}
		for _, s := range w.Slots {
			c.newest[s] = w.ID
		}
		c.newestMax = w.ID
		// Blocks ride on w (Rider): no write after it may make it skip
		// rows their gather reads. The scan stops here, w not counted as
		// scanned, so the next scan records w again (the same ids) and
		// stops again, until the committer ran w and its gather.
		return len(w.Pub) == 0
	})
}

// newerMask returns sl, or a copy with the slots a newer queued write
// replaces set to -1, and how many rows it keeps and skips.
func (c *Committer) newerMask(sl []int32) (mask []int32, kept, skipped int) {
	if c.newestMax <= c.curID { // nothing newer queued: write every row
		return sl, len(sl), 0
	}
	c.mask = scratch.Grow(c.mask, len(sl))
	for i, s := range sl {
		if c.newest[s] > c.curID {
			c.mask[i] = -1
			skipped++
		} else {
			c.mask[i] = s
		}
	}
	if skipped == 0 {
		return sl, len(sl), 0 // nothing skipped: Tenancy.Publish takes its fast path
	}
	return c.mask, len(sl) - skipped, skipped
}

// rejectMask returns mk (a mask of sl from newerMask) with the rows of
// rejected draft tokens set to -1 too (a copy in the scratch), and how
// many rows it keeps and skips.
func (c *Committer) rejectMask(mk, sl []int32, reject []bool) (mask []int32, kept, skipped int) {
	if len(mk) > 0 && &mk[0] == &sl[0] {
		c.mask = scratch.Grow(c.mask, len(sl))
		copy(c.mask, sl)
		mk = c.mask
	}
	for i, r := range reject {
		if r {
			mk[i] = -1
		}
	}
	for _, s := range mk {
		if s < 0 {
			skipped++
		}
	}
	return mk, len(mk) - skipped, skipped
}

// count adds a step's rows written and skipped to the counters: over every
// immediate key, less those the step omitted (nothing is written for them).
func (c *Committer) count(w *Write, j, kept, skipped int) {
	nimm, rowB := len(c.cfg.Imm), c.immRowB
	if w.NAbsent > 0 {
		for ki, k := range c.cfg.Imm {
			if w.Absent[j*len(c.cfg.Imm)+ki] {
				nimm--
				rowB -= c.cfg.RowBytes[k]
			}
		}
	}
	st := c.cfg.Stats
	if skipped > 0 {
		st.Skipped.Add(int64(skipped * nimm))
	}
	st.Rows.Add(int64(kept * nimm))
	st.Bytes.Add(int64(kept * rowB))
}

// issueAhead issues the late copies of the next queued writes (up to
// lateAhead) that have not been issued yet, so that they run on the device
// while this write is scattered. A failure leaves the write to issue its
// copies at its turn (and report the failure then).
func (c *Committer) issueAhead() {
	if c.unissued.Load() == 0 {
		return
	}
	c.ahead = c.ahead[:0]
	c.cfg.Queue.Since(c.popped, func(t Task) bool {
		if w := t.W; w != nil && w.CopyLate && !w.lateIssued {
			c.ahead = append(c.ahead, w)
		}
		return len(c.ahead) < lateAhead
	})
	for i, w := range c.ahead {
		if ev, err := c.copyLate(w); err == nil {
			w.lateEv, w.lateIssued = ev, true
			c.unissued.Add(-1)
		}
		c.ahead[i] = nil
	}
}

func (c *Committer) commitImm(w *Write, ev gpu.Event) error {
	if w.CopyLate {
		if w.lateIssued {
			ev = w.lateEv
		} else {
			c.unissued.Add(-1)
			var err error
			if ev, err = c.copyLate(w); err != nil {
				return err
			}
		}
		w.lateEv, w.lateIssued = 0, false
	}
	c.issueAhead()
	if err := c.cfg.Dev.Wait(ev); err != nil {
		return err
	}
	if h := c.cfg.Hists; h != nil && w.CopyLate && !w.lateT0.IsZero() {
		h.CopyTime.Observe(int64(time.Since(w.lateT0)))
		w.lateT0 = time.Time{}
	}
	c.issueAhead() // a write handed over while this one's copies ran
	nimm := len(c.cfg.Imm)
	// The mirror memory the rows land in is made first: a chunk the OS
	// refuses fails the write (sticky) before any row is scattered.
	for j := 0; j < w.Steps; j++ {
		sl := w.Slots[j*w.N : (j+1)*w.N]
		for ki, k := range c.cfg.Imm {
			if w.NAbsent > 0 && w.Absent[j*nimm+ki] {
				continue
			}
			if err := c.cfg.Mirrors.Make(k).Prepare(sl); err != nil {
				return err
			}
		}
	}
	if len(w.Pub) == 0 {
		c.scanQueued()
	} // else blocks ride on w: no newer write may make it skip rows (see scanQueued)
	c.curID = w.ID
	c.cfg.Owner.Staged(w)
	// Immediate keys share one tenancy table, written here only, in write
	// order. The epoch is odd while rows are being overwritten: a reader
	// whose copy overlapped a scatter re-checks the block's owner once the
	// scatter is over. A large scatter is split across the copy workers;
	// WriteSplit returns once every part is in, so the rows are in before
	// Publish and before the epoch turns even. A key the step omitted
	// scatters nothing: its slots are recorded absent (and a key it
	// supplied clears them), in the same scatter, before Publish.
	ten := c.cfg.Tenancy
	c.prog.BeginScatter()
	for j := 0; j < w.Steps; j++ {
		sl := w.Slots[j*w.N : (j+1)*w.N]
		mk, kept, skipped := c.newerMask(sl)
		if len(w.Reject) > 0 {
			mk, kept, skipped = c.rejectMask(mk, sl, w.Reject)
		}
		c.count(w, j, kept, skipped)
		for ki, k := range c.cfg.Imm {
			if w.NAbsent > 0 && w.Absent[j*nimm+ki] {
				ten.SetAbsent(ki, mk)
				continue
			}
			rows := w.Host[j*nimm+ki]
			if rows == nil {
				rows = w.Staged[j*nimm+ki]
			}
			c.cfg.Mirrors.Make(k).WriteSplitPoll(c.workers, mk, rows[:w.N*c.cfg.RowBytes[k]], c.pollAhead)
			ten.ClearAbsent(ki, mk)
		}
		ten.Publish(sl, mk, w.ID)
	}
	c.prog.EndScatter()
	return nil
}

// owned copies sl into the scratch with slots no longer in transit for
// owner replaced by -1 (a newer write stole them).
func (c *Committer) owned(occ *soa.Occupancy, sl []int32, owner uint64) []int32 {
	c.mask = scratch.Grow(c.mask, len(sl))
	skipped := 0
	for i, s := range sl {
		if occ.Owns(s, owner) {
			c.mask[i] = s
		} else {
			c.mask[i] = -1
			skipped++
		}
	}
	c.cfg.Stats.Skipped.Add(int64(skipped))
	c.cfg.Stats.Rows.Add(int64(len(sl) - skipped))
	return c.mask
}

// commitDeferred writes runs of deferred clones: device→host in pieces of
// at most ChunkBytes into a staging chunk, then into the mirror, skipping
// and not committing slots a newer write stole.
func (c *Committer) commitDeferred(segs []Seg) error {
	dev := c.cfg.Dev
	for _, s := range segs {
		w := s.W
		k := w.Key
		rb := c.cfg.RowBytes[k]
		occ := c.cfg.Occ[k]
		m := c.cfg.Mirrors.Make(k)
		per := max(1, int(c.cfg.ChunkBytes)/rb)
		if want := min(per, int(s.N)) * rb; c.chunk == nil || len(c.chunk) < want {
			if c.chunk != nil {
				dev.FreeHost(c.chunk)
				c.chunk = nil
			}
			var err error
			if c.chunk, err = dev.AllocHost(min(per, max(int(s.N), 64)) * rb); err != nil {
				c.chunk = nil
				return err
			}
		}
		for off := 0; off < int(s.N); {
			cnt := min(per, int(s.N)-off, len(c.chunk)/rb)
			r0 := int(s.Off) + off
			if err := dev.CopyDtoH(c.chunk[:cnt*rb], w.Buf, r0*rb); err != nil {
				return err
			}
			ev, err := dev.Record()
			if err == nil {
				err = dev.Wait(ev)
			}
			if err != nil {
				return err
			}
			sl := w.Slots[r0 : r0+cnt]
			if err := m.Prepare(sl); err != nil {
				return err // a chunk the OS refused: the write fails (sticky) before it lands
			}
			m.WriteSplit(c.workers, c.owned(occ, sl, w.ID), c.chunk[:cnt*rb])
			c.cfg.Stats.Bytes.Add(int64(cnt * rb))
			occ.Commit(sl, w.ID)
			off += cnt
		}
	}
	return nil
}
