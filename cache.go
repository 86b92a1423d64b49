package omnicache

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/hist"
	"github.com/omnicache/omnicache/internal/reader"
	"github.com/omnicache/omnicache/internal/scratch"
	"github.com/omnicache/omnicache/internal/tierlink"
	"github.com/omnicache/omnicache/internal/writer"
	"github.com/omnicache/omnicache/soa"
)

// Cache is the prefix-cache core: the engine contract over a write path
// (package writer) and a read path (package reader). See the package doc
// for the contract and which goroutine may call what.
type Cache struct {
	cfg   Config
	path  *writer.Path
	parts *writer.Parts // the write path's tables, counters and progress
	rd    *reader.Reader
	lay   *writer.Layout

	// mu guards the saved steps not consumed yet, the delivery states
	// (delivery.go) and the Materializes whose delivery is not recorded
	// yet (reading, cut).
	mu    sync.Mutex
	steps []saved
	// zeros is a zero buffer for clearing device rows (zeroDev), made
	// once on first use (devZero).
	zeros   []byte
	devZero sync.Once
	reading []*Result // taken, being read: what they deliver if served
	cut     []cutRead // read while a replace cut them (an Abort may undo the cut)

	eng    engineState  // engine goroutine only
	ws     writer.Step  // engine goroutine: Save's hand-over to the write path
	live   atomic.Int64 // requests tracked, for Stats
	closed atomic.Bool
	// resetFence is the last step id saved before the latest Reset: those
	// steps' rows were dropped (Materialize fails them with ErrReset).
	resetFence atomic.Uint64
	resets     atomic.Int64

	tl      *tierlink.Link // the tier's one link; nil without Config.Tier
	hitWait *hist.H        // Materialize's hit reads (Config.Histograms; nil: off)
	// testTaken, set by tests only, runs in Materialize between the take
	// and the read.
	testTaken func()

	// gate is 2×(calls in flight) | 1 once Close began (see enter); Close
	// waits until the last call left (idle is closed by it) before
	// anything is freed.
	gate     atomic.Int64
	idle     chan struct{}
	idleOnce sync.Once
}

// New creates a cache. It allocates no mirror memory (a key's mirror is
// created when the key first writes) and, by default, no staging memory (a
// staging page's memory is allocated when the page is first used; see
// Config.AllocStagingAtNew and Config.AllocStagingAhead).
func New(cfg Config) (*Cache, error) {
	wc, err := validate(&cfg)
	if err != nil {
		return nil, err
	}
	tl, err := newTierLink(&cfg)
	if err != nil {
		return nil, err
	}
	c := &Cache{cfg: cfg, idle: make(chan struct{}), tl: tl}
	if cfg.Histograms {
		c.hitWait = hist.NewDur()
	}
	if tl != nil {
		wc.Rider, wc.Gather = tl.Rider(), tl.Gather()
	}
	// A config whose tables the machine cannot hold (an address-space
	// limit such as ulimit -v) fails with ErrConfig, a staging allocation
	// the device refuses with its error (gpu.ErrAlloc).
	if c.path, err = writer.NewPath(wc); err != nil {
		if tl != nil {
			tl.Close()
		}
		return nil, err
	}
	c.parts = c.path.Parts()
	c.rd = reader.New(c.path, c.parts, reader.Options{Prefetch: !cfg.DisablePrefetch, Budget: cfg.ReadAheadBytes, Dev: cfg.Device})
	c.lay = c.parts.Layout
	c.eng.requests = soa.NewRequests(64)
	c.ws.Out = make([]writer.Src, len(cfg.Keys))
	return c, nil
}

// check returns ErrClosed or the sticky write failure.
func (c *Cache) check() error {
	if c.closed.Load() {
		return ErrClosed
	}
	return c.path.Err()
}

// enter registers a call in flight; it fails with ErrClosed once Close
// began. Every call that touches the cache's memory runs between enter and
// leave, so Close frees nothing while one is in flight. One word holds
// both the count and the closed bit, so a call costs two atomic adds and
// either the call sees Close's bit or Close sees the call.
func (c *Cache) enter() error {
	if c.gate.Add(2)&1 != 0 {
		c.leave()
		return ErrClosed
	}
	return nil
}

func (c *Cache) leave() {
	if c.gate.Add(-2) == 1 { // closed, and this was the last call
		c.idleOnce.Do(func() { close(c.idle) })
	}
}

// Save hands in the step's outputs and returns its step id. Immediate rows
// of the whole step form one write (or are parked by the decode buffer);
// deferred rows are cloned and stay pending until their request finishes.
//
// A Save that fails with any error but ErrWriteFailed saves nothing and
// undoes its Begin as Abort does (everything it did, its finishes
// included): Begin the step again, or another.
// Nil outputs are ErrOutputs. Engine goroutine only; the outputs are borrowed for the call (owned
// tensors are kept, see Config.ReleaseHost for a failed Save).
func (c *Cache) Save(o *Outputs) (StepID, error) {
	if err := c.enter(); err != nil {
		return 0, err
	}
	defer c.leave()
	if err := c.check(); err != nil {
		return 0, err
	}
	e := &c.eng
	if !e.begun {
		return 0, fmt.Errorf("%w: Save without Begin", ErrSequence)
	}
	if err := c.checkOutputs(o); err != nil {
		c.unbegin()
		return 0, err
	}
	rec := e.hitRec // planned at Begin when the step has hits
	if rec == nil {
		rec = c.newRec()
	}
	ws := &c.ws
	ws.Slots, ws.IDs, ws.Handles, ws.Count = e.slots[:e.tokens], rec.IDs, e.handles, rec.Count
	ws.TokOff, ws.Pure, ws.Blocks = nil, e.pureDecode, e.stepBlocks
	ws.Accepted = nil
	if o.Accepted != nil && rejects(o.Accepted, rec.Count) {
		ws.Accepted = o.Accepted
	}
	if len(c.lay.Def) > 0 {
		ws.TokOff = rec.Offsets() // deferred runs start at each request's first row
	}
	for k := range o.Tensors {
		t := &o.Tensors[k]
		ws.Out[k] = writer.Src{Host: t.Host, Dev: t.Dev, Owned: t.Owned}
	}
	ws.Into = e.into
	var err error
	var devEv gpu.Event
	if len(e.resultDev) > 0 {
		devEv, err = c.saveDev(o, rec) // ahead of the write path's copies of the same rows
	}
	if err == nil {
		err = c.path.Save(ws, &rec.Refs)
	}
	if devEv != 0 {
		// The engine's tensors read and its buffers written before Save
		// returns (a failed Save's too).
		if werr := c.waitDev(devEv); err == nil {
			err = werr
		}
	}
	if err == nil {
		rec.SetResultInto(e.resultInto)
		c.noteSaved(rec, ws.Accepted)
	}
	ws.Accepted, ws.Into = nil, nil
	e.into, e.resultInto = scratch.Empty(e.into), scratch.Empty(e.resultInto) // the engine's memory, borrowed
	e.resultDev = scratch.Empty(e.resultDev)
	for k := range ws.Out {
		ws.Out[k] = writer.Src{} // borrowed for the call (a loop: clear's bulk barrier costs more for a few keys)
	}
	if err != nil {
		if e.hitRec == nil {
			c.rd.Release(rec)
		}
		c.unbegin() // cancels a planned record; after a sticky failure every later call fails anyway
		var te *writer.TimeoutError
		if errors.As(err, &te) {
			err = c.timeoutError(te)
		}
		return 0, err
	}
	e.begun = false
	if c.tl != nil {
		c.tl.Saved(rec.ID)
	}
	if len(e.hits) > 0 {
		if !e.hitsPlanned {
			c.rd.Plan(rec, e.hits) // not prefetched: planned behind the step's own rows
		}
		e.hitRec, e.hitsPlanned = nil, false
		st := c.parts.Counters
		st.HitRequests.Add(int64(len(e.hits)))
		for _, h := range e.hits {
			st.HitTokens.Add(int64(h.Tokens))
		}
	}
	c.mu.Lock()
	c.steps = append(c.steps, saved{rec: rec, dl: e.batchDelivered})
	if len(c.cut) > 0 {
		clear(c.cut) // the Begin whose replaces cut them stands: nothing to undo
		c.cut = c.cut[:0]
	}
	c.mu.Unlock()
	c.parts.Counters.Steps.Add(1)
	return StepID(rec.ID), nil
}

// checkOutputs validates the outputs against the begun step.
func (c *Cache) checkOutputs(o *Outputs) error {
	if o == nil {
		return fmt.Errorf("%w: nil outputs", ErrOutputs)
	}
	n := c.eng.tokens
	if o.Tokens != n {
		return fmt.Errorf("%w: outputs carry %d tokens, the plan scheduled %d", ErrTokenCount, o.Tokens, n)
	}
	if len(o.Tensors) != len(c.cfg.Keys) {
		return fmt.Errorf("%w: %d tensors for %d keys", ErrOutputs, len(o.Tensors), len(c.cfg.Keys))
	}
	if o.Accepted != nil {
		e := &c.eng
		ids, count := e.ids, e.counts
		if e.hitRec != nil { // a hit step's record took them at Begin
			ids, count = e.hitRec.IDs, e.hitRec.Count
		}
		if len(o.Accepted) != len(ids) {
			return fmt.Errorf("%w: %d accepted counts for %d scheduled requests", ErrOutputs, len(o.Accepted), len(ids))
		}
		for i, a := range o.Accepted {
			switch {
			case a < 0 || a > count[i]:
				return fmt.Errorf("%w: accepted count out of range: request %d: %d tokens accepted of %d scheduled (want 0..%d)", ErrOutputs, ids[i], a, count[i], count[i])
			case a < count[i] && e.pureDecode:
				return fmt.Errorf("%w: request %d: a decode step's one token cannot be rejected", ErrOutputs, ids[i])
			}
		}
	}
	for k := range o.Tensors {
		t := &o.Tensors[k]
		if t.Host == nil && t.Dev.IsZero() {
			if !c.cfg.Keys[k].Optional {
				return fmt.Errorf("%w: key %q is required: a zero tensor (no memory) omits it, which only an optional key may", ErrOutputs, c.cfg.Keys[k].Name)
			}
			continue // omitted: the step did not emit this optional key
		}
		need := n * c.lay.RowBytes[k]
		have := t.Dev.Size
		if t.Host != nil {
			have = len(t.Host)
		}
		if t.Rows < n || have < need {
			return fmt.Errorf("%w: key %q: tensor too small: %d rows (%d bytes) for %d tokens of %d bytes", ErrOutputs, c.cfg.Keys[k].Name, t.Rows, have, n, c.lay.RowBytes[k])
		}
		if t.Host == nil && need > 0 {
			// What can be checked before a copy is issued is this call's
			// error, not a failed copy that fails the cache for good.
			if err := c.cfg.Device.Check(t.Dev); err != nil {
				return fmt.Errorf("%w: key %q: %w", ErrOutputs, c.cfg.Keys[k].Name, err)
			}
		}
	}
	return nil
}

// timeoutError names the steps that hold the staging pages.
func (c *Cache) timeoutError(te *writer.TimeoutError) error {
	c.mu.Lock()
	ids := make([]StepID, 0, len(c.steps))
	for _, sv := range c.steps {
		ids = append(ids, StepID(sv.rec.ID))
	}
	c.mu.Unlock()
	return &StagingTimeoutError{Depth: c.cfg.StagingDepth, Waited: te.Waited, Unconsumed: ids}
}

// Discard consumes step id without reading it. After a sticky write
// failure it still consumes the step (releasing its page and pins) and
// returns the failure. Any goroutine.
func (c *Cache) Discard(id StepID) error {
	// Discard needs no call-in-flight registration: it touches the cache
	// only under c.mu, and Close takes c.mu (after closing) before it
	// frees anything.
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		return ErrClosed
	}
	sv, err := c.takeLocked(id, nil, nil)
	if err == nil {
		c.rd.Cancel(sv.rec) // a prefetch not started yet is skipped
	}
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if c.tl != nil {
		c.tl.Take(uint64(id))
	}
	return c.path.Err()
}

// Materialize fills dst with, per request of reqs (nil: every request of the
// step, in batch order) and key, `[hit prefix rows | this step's rows]`, and
// consumes the step id. The read was planned at Save and runs here, on the
// caller's goroutine. After a sticky write failure it consumes the step
// (releasing its page and pins) and returns the failure. Any goroutine,
// concurrently with Close too (it then completes or fails with ErrClosed).
// A nil dst is ErrOutputs and leaves the step unconsumed.
//
// It takes the step, reads its rows, then records once what it delivered
// (delivery.go): nothing is recorded for a request it did not serve.
func (c *Cache) Materialize(id StepID, reqs []int64, dst *Result) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	if dst == nil {
		return fmt.Errorf("%w: nil Result (the step stays unconsumed)", ErrOutputs)
	}
	sv, imp, err := c.take(id, reqs, dst)
	if err != nil {
		return err
	}
	err = c.read(sv.rec, reqs, dst)
	if err == nil && imp != nil {
		c.failImports(imp, dst)
	}
	return c.served(id, dst, err)
}

// take takes step id for a Materialize of reqs into dst (its delivery
// opened), with its tier import (nil: none).
func (c *Cache) take(id StepID, reqs []int64, dst *Result) (saved, *tierlink.Import, error) {
	c.mu.Lock()
	sv, err := c.takeLocked(id, reqs, dst)
	if err == nil {
		c.openDelivery(sv, reqs != nil, dst)
	}
	c.mu.Unlock()
	if err != nil {
		return saved{}, nil, err
	}
	if c.testTaken != nil {
		c.testTaken()
	}
	var imp *tierlink.Import
	if c.tl != nil {
		imp = c.tl.Take(uint64(id))
	}
	return sv, imp, nil
}

// served records what the Materialize of step id into dst delivered
// (nothing when the read failed with err) and returns its error.
func (c *Cache) served(id StepID, dst *Result, err error) error {
	c.deliver(dst, err == nil)
	if err != nil {
		dst.reset(c.lay.RowBytes) // nothing served
		return err
	}
	return dst.requestError(id)
}

// Sync writes out the decode buffer and waits until every write handed to
// the committer has landed in the mirror, and for a staging page being
// allocated ahead in the background. Deferred rows of live requests stay
// pending (they land when their request finishes). Engine goroutine only.
func (c *Cache) Sync() error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	if err := c.check(); err != nil {
		return err
	}
	return c.path.Sync() // a flush of the decode buffer carries the parked steps' full blocks (pubRider)
}

// Peek reads the committed mirror rows of key k (Config.Keys order) for
// slots into dst (len(slots)*RowBytes bytes); slots never written, and
// slots whose last write omitted the key, read as zeros. A diagnostic for
// tests and verification: call it after Sync.
func (c *Cache) Peek(k int, sl []int32, dst []byte) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	if err := c.check(); err != nil {
		return err
	}
	if k < 0 || k >= len(c.cfg.Keys) {
		return fmt.Errorf("%w: key index %d", ErrPlan, k)
	}
	rb := c.lay.RowBytes[k]
	if len(dst) < len(sl)*rb {
		return fmt.Errorf("%w: Peek: a buffer of %d bytes is too small for %d rows of %d bytes", ErrOutputs, len(dst), len(sl), rb)
	}
	for _, s := range sl {
		if s < 0 || int(s) >= c.lay.NumSlots {
			return fmt.Errorf("%w: slot %d outside [0,%d)", ErrPlan, s, c.lay.NumSlots)
		}
	}
	m := c.parts.Mirrors.Get(k)
	if m == nil {
		clear(dst[:len(sl)*rb])
		return nil
	}
	m.Read(dst[:len(sl)*rb], sl)
	if !c.cfg.Keys[k].Optional {
		return nil
	}
	// Rows recorded absent read as zeros, whatever older row the mirror
	// still holds.
	ki, occ := c.lay.ImmIdx[k], c.parts.Occ[k]
	for i, s := range sl {
		var absent bool
		if ki >= 0 {
			absent = c.parts.Tenancy.Absent(ki, s)
		} else {
			st, _ := occ.Load(s)
			absent = st == soa.Absent
		}
		if absent {
			clear(dst[i*rb : (i+1)*rb])
		}
	}
	return nil
}

// Close stops the cache: later calls return ErrClosed; a Save waiting for
// a staging page wakes with ErrClosed; calls in flight (a Materialize
// copying rows, a Save forcing a write out) complete or fail with
// ErrClosed, and Close waits for the last of them to leave. Then the
// committer drains what was handed to it and stops, and every page, budget
// charge, device buffer and the mirror are released: afterwards Stats
// shows no page in use and nothing charged. Both waits together are
// bounded by Config.WaitTimeout: past it (a device that never completes a
// copy) Close returns ErrDeviceTimeout and leaves the memory allocated
// (something may still write it). Safe at any moment, from any goroutine;
// a second Close returns nil.
func (c *Cache) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	inFlight := c.gate.Or(1) >> 1
	var deadline time.Time
	if c.cfg.WaitTimeout >= 0 {
		deadline = time.Now().Add(c.cfg.WaitTimeout)
	}
	// The write path wakes a Save waiting for a staging page first, then
	// quiesce waits for the calls in flight and hands over what the
	// unconsumed steps pin.
	quiesce := func() ([]*writer.Refs, error) {
		if inFlight > 0 {
			var tc <-chan time.Time
			if !deadline.IsZero() {
				t := time.NewTimer(time.Until(deadline))
				defer t.Stop()
				tc = t.C
			}
			select {
			case <-c.idle:
			case <-tc:
				return nil, fmt.Errorf("%w: %d calls still in flight after %v; the cache's memory is left allocated", ErrDeviceTimeout, c.gate.Load()>>1, c.cfg.WaitTimeout)
			}
		}
		c.mu.Lock()
		refs := make([]*writer.Refs, 0, 2*len(c.steps)+2)
		for _, sv := range c.steps {
			refs = append(refs, &sv.rec.Refs, sv.rec.PlanPins())
		}
		c.steps = nil
		c.mu.Unlock()
		// A step begun and never saved holds the pins of its hit plan. No
		// call is in flight (waited above) and a later one fails before
		// touching the engine's state.
		if r := c.eng.hitRec; r != nil {
			refs = append(refs, &r.Refs, r.PlanPins())
		}
		return refs, nil
	}
	err := c.path.Close(deadline, quiesce)
	if err == nil && c.tl != nil {
		c.tl.Close() // the committer stopped and no call is in flight: nothing queues to it
	}
	return err
}

// Stats returns the cache's counters. Any goroutine; it never waits on the
// state lock (every source is atomic or has its own lock).
func (c *Cache) Stats() Stats {
	st := c.parts.Counters
	u := c.path.Usage()
	s := Stats{
		Steps:               st.Steps.Load(),
		WriteTasks:          st.Tasks.Load(),
		RowsWritten:         st.Rows.Load(),
		BytesWritten:        st.Bytes.Load(),
		RowsSkipped:         st.Skipped.Load(),
		BufferedSteps:       st.Buffered.Load(),
		BufferFlushes:       st.Flushes.Load(),
		DeferredWrites:      st.DeferredWrites.Load(),
		BudgetFlushes:       st.BudgetFlushes.Load(),
		HitRequests:         st.HitRequests.Load(),
		HitTokens:           st.HitTokens.Load(),
		HitRowsRead:         st.HitRows.Load(),
		HitReadsOnCaller:    st.ReadsAhead.Load(),
		CommitterNanos:      st.CommitNanos.Load(),
		StallNanos:          st.StallNanos.Load(),
		MirrorResidentBytes: u.MirrorBytes,
		BudgetCharged:       u.BudgetCharged,
		BudgetLimit:         u.BudgetLimit,
		BudgetPeak:          u.BudgetPeak,
		ClonedBytes:         st.Cloned.Load(),
		PagesInUse:          u.PagesInUse,
		PagesAllocating:     u.PagesAllocating,
		ReadAheadBytes:      c.rd.ReadAheadBytes(),
		LiveRequests:        int(c.live.Load()),
		Resets:              c.resets.Load(),
		PrefetchUsed:        st.PrefetchUsed.Load(),
		PrefetchDropped:     st.PrefetchDropped.Load(),
	}
	c.tierStats(&s)
	return s
}
