package writer

import (
	"errors"
	"fmt"
	"time"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/errs"
	"github.com/omnicache/omnicache/internal/scratch"
	"github.com/omnicache/omnicache/soa"
)

// Src is one key's output rows of a step: host memory (Host) or device
// memory (Dev); Owned hands the tensor to the cache (no defensive clone).
// A Src with neither (Omitted) is an optional key the step did not emit:
// nothing is staged, cloned or copied for it, and its rows are recorded
// absent (they read as zeros).
type Src struct {
	Host  []byte
	Dev   gpu.Buffer
	Owned bool
}

// Omitted reports whether the step did not emit the key (no memory named).
func (t *Src) Omitted() bool { return t.Host == nil && t.Dev.IsZero() }

// Step is what the engine goroutine hands Save: the step's slot of every
// token and its requests (borrowed for the call).
type Step struct {
	Slots   []int32      // slot of every token, in batch order
	IDs     []int64      // per request, in batch order
	Handles []soa.Handle // per request
	Count   []int32      // per request: scheduled tokens
	TokOff  []int32      // per request: first row in the step (needed with deferred keys)
	Pure    bool         // a pure-decode step the decode buffer may park
	// Accepted, when set, is per request how many of its Count tokens
	// were accepted (speculative decoding); the rows of the others are
	// rejected: written nowhere, their slots turned stale (immediate keys)
	// or absent (deferred keys), so no read ever serves them. A pure step
	// rejects nothing (the caller checks).
	Accepted []int32
	Blocks   []int32 // the blocks the step writes (nil: not known; its slots tell)
	Out      []Src   // per key
	// Into, when set, holds per key (nil: none) the engine's buffer for
	// the step's rows in batch order (its Result's rows after any hit
	// prefix: Plan.ResultInto). A step written as one write and handed
	// over at once (more than lazyBytes of immediate rows) has a host key's
	// rows copied there rather than into the staging page, while the
	// committer writes them to the mirror from the engine's tensor; Save
	// returns once both are done, the write reading them from Into after
	// (saveInto).
	Into [][]byte
}

// Save hands the step's rows to the write path: immediate rows of the whole
// step form one write (or are parked by the decode buffer when s.Pure),
// deferred rows are cloned and stay pending until their request finishes.
// refs receives the step's references.
//
// Validate, then apply: every device byte the step needs is reserved and
// its staging page claimed before anything is staged, so an error that is
// not the sticky write failure (ErrBudget, a page timeout, ErrClosed)
// leaves nothing of the step behind. Work done to make room (a budget
// flush of older writes) is not undone: it would have happened anyway.
// Engine goroutine only.
func (p *Path) Save(s *Step, refs *Refs) error {
	// Once the step's device calls are issued, a page taken now has the
	// next one's memory allocated in the background.
	defer p.spare.Ahead()
	n := len(s.Slots)
	imm := len(p.lay.Imm) > 0
	if imm && n > p.cap {
		// The root refuses such a step at Begin; checked here too, so that
		// no caller can stage past a page.
		return fmt.Errorf("%w: %d rows, a page holds %d", errs.StepTooLarge, n, p.cap)
	}
	park := s.Pure && imm
	if park && p.buf.K > 0 && !p.buf.Fits(n, p.cap) {
		p.flushBuffer(false)
	}
	immNeed := p.cloneNeed(s)
	var defNeed int64
	if n > 0 {
		for _, k := range p.lay.Def {
			if !s.Out[k].Omitted() {
				defNeed += int64(n * p.lay.RowBytes[k])
			}
		}
	}
	if need := immNeed + defNeed; need > 0 {
		if err := p.reserve(need); err != nil {
			return err
		}
	}
	var pg *Page
	if imm && (!park || p.buf.K == 0) {
		var err error
		if pg, err = p.claimPage(p.devRows(s)); err != nil {
			p.budget.Release(immNeed + defNeed)
			return err
		}
	}
	// Applied from here on: a failure now is a device failure (sticky).
	// Clones of the engine's (non-owned) device tensors go first, so that
	// Save can wait for exactly them before it returns: the engine may then
	// overwrite its tensors at once, whatever stream it writes them on.
	cloneEv, err := p.preClone(s)
	switch {
	case err != nil:
		// Nothing took the page or the immediate bytes yet.
		if pg != nil {
			p.pages.Release(pg)
		}
		p.budget.Release(immNeed)
	case park:
		err = p.park(s, refs, pg, immNeed)
	case imm:
		err = p.writeStep(s, refs, pg, immNeed, cloneEv != 0)
		if len(p.intoFix) > 0 {
			if err == nil {
				err = p.saveInto()
			} else {
				p.intoFix = scratch.Empty(p.intoFix) // the write was released, never handed over
			}
		}
	}
	if err != nil {
		p.dropPreClones()
		p.budget.Release(defNeed)
		return err
	}
	if err := p.saveDeferred(s, refs, defNeed); err != nil {
		p.dropPreClones()
		return err
	}
	if cloneEv != 0 {
		return p.waitDev(cloneEv)
	}
	return nil
}

// preClone clones every non-owned device tensor of the step (device→device,
// on the device's stream) into p.pre and records an event after them (0
// when there was none). The bytes were reserved by Save.
func (p *Path) preClone(s *Step) (gpu.Event, error) {
	n := len(s.Slots)
	p.pre = scratch.Grow(p.pre, len(s.Out))
	any := false
	for k := range s.Out {
		p.pre[k] = gpu.Buffer{}
		t := &s.Out[k]
		nb := n * p.lay.RowBytes[k]
		if t.Host != nil || t.Owned || nb == 0 || t.Omitted() {
			continue
		}
		clone, err := p.dev.Alloc(nb)
		if err != nil {
			return 0, p.fail(err)
		}
		p.pre[k] = clone
		if err := p.dev.CopyDtoD(clone, 0, t.Dev, 0, nb); err != nil {
			return 0, p.fail(err)
		}
		p.st.Cloned.Add(int64(nb))
		any = true
	}
	if !any {
		return 0, nil
	}
	ev, err := p.dev.Record()
	if err != nil {
		return 0, p.fail(err)
	}
	return ev, nil
}

// takePre hands key k's pre-made clone to its write (zero when none).
func (p *Path) takePre(k int) gpu.Buffer {
	if k >= len(p.pre) {
		return gpu.Buffer{}
	}
	b := p.pre[k]
	p.pre[k] = gpu.Buffer{}
	return b
}

// dropPreClones frees the clones no write took (the Save failed).
func (p *Path) dropPreClones() {
	for k, b := range p.pre {
		if !b.IsZero() {
			p.dev.Free(b)
		}
		p.pre[k] = gpu.Buffer{}
	}
}

// cloneNeed is the device bytes the step's immediate tensors need for
// clones (non-owned device tensors).
func (p *Path) cloneNeed(s *Step) int64 {
	var need int64
	n := len(s.Slots)
	for _, k := range p.lay.Imm {
		t := &s.Out[k]
		if t.Host == nil && !t.Owned && !t.Omitted() {
			need += int64(n * p.lay.RowBytes[k])
		}
	}
	return need
}

// claimPage takes a staging page, waiting up to the claim timeout.
func (p *Path) claimPage(cold bool) (*Page, error) {
	pg, err := p.pages.Claim(NoWait, cold)
	if err != nil && errors.Is(err, ErrTimeout) && p.cfg.ClaimTimeout >= 0 {
		// Back-pressure: every page is held by unconsumed steps or by
		// writes the committer has not landed yet (wake it: it may be
		// polling with lazily handed-over writes queued).
		// The claim spins for a page (see Pages.ClaimSpin) unless the
		// kick woke the committer. (It used not to spin with hit reads
		// queued either: a consumer back sooner took more of them itself,
		// holding the committer at them; it now leaves a working
		// committer its reads, see reader.Reader.Read.)
		t0 := time.Now()
		woke := p.q.Kick()
		pg, err = p.pages.ClaimSpin(p.cfg.ClaimTimeout, cold, !woke)
		d := int64(time.Since(t0))
		p.st.StallNanos.Add(d)
		if h := p.cfg.Hists; h != nil {
			h.PageWait.Observe(d)
		}
	} else if h := p.cfg.Hists; h != nil {
		h.PageWait.Observe(0)
	}
	switch {
	case err == nil:
		if pg.Mem == nil {
			// The first page is allocated here; later ones were allocated
			// ahead in the background (Spare).
			if pg.Mem, err = p.spare.Get(); err != nil {
				p.pages.Release(pg)
				return nil, p.fail(fmt.Errorf("staging page: %w", err))
			}
		}
		return pg, nil
	case errors.Is(err, ErrClosed):
		return nil, errs.Closed
	case errors.Is(err, ErrFailed):
		return nil, p.Err()
	default:
		return nil, &TimeoutError{Waited: max(p.cfg.ClaimTimeout, 0)}
	}
}

// devRows reports whether an immediate key of the step has device rows:
// the device's DMA fills its page, which then is the coldest free one (see
// Pages).
func (p *Path) devRows(s *Step) bool {
	for _, k := range p.lay.Imm {
		if t := &s.Out[k]; t.Host == nil && !t.Dev.IsZero() {
			return true
		}
	}
	return false
}

// TimeoutError is a Save's failure to claim a staging page within the
// claim timeout (errors.Is(err, errs.StagingTimeout)); the root package
// turns it into its StagingTimeoutError naming the unconsumed steps.
type TimeoutError struct{ Waited time.Duration }

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("%v after %v", errs.StagingTimeout, e.Waited)
}

// Unwrap makes errors.Is(err, errs.StagingTimeout) hold.
func (e *TimeoutError) Unwrap() error { return errs.StagingTimeout }

// NoWait as a claim timeout fails at once.
const NoWait time.Duration = -1

// stage puts rows of tensor t (key k, ki-th immediate key) for step j of
// write w: host rows are copied into the page (or kept when owned); device
// rows are parked in w.Dev (the clone preClone made, or the owned tensor
// itself) with their place in the page in w.Staged, for the committer to
// copy (CopyLate).
//
// An omitted key stages nothing: its entry is marked Absent, and the
// committer records the slots absent instead of scattering rows.
func (p *Path) stage(w *Write, t *Src, k, ki, j int) {
	rb := p.lay.RowBytes[k]
	nb := w.N * rb
	slot := j*len(p.lay.Imm) + ki
	if t.Omitted() {
		w.Host[slot], w.Dev[slot], w.Staged[slot] = nil, gpu.Buffer{}, nil
		w.Absent[slot] = true
		w.NAbsent++
		return
	}
	w.Absent[slot] = false
	o := p.pageO[k] + j*nb
	region := w.Page.Mem[o : o+nb : o+nb]
	if t.Host != nil {
		if p.into != nil && !t.Owned && len(p.into[k]) >= nb {
			// The committer writes the engine's rows (borrowed until Save
			// returns) while Save copies them into the engine's buffer.
			w.Host[slot] = t.Host[:nb:nb]
			p.intoFix = append(p.intoFix, intoFix{w: w, slot: slot, src: t.Host[:nb:nb], dst: p.into[k][:nb:nb]})
			p.st.Cloned.Add(int64(nb))
			return
		}
		if t.Owned {
			w.Host[slot] = t.Host[:nb:nb]
			w.Owned = append(w.Owned, t.Host)
		} else {
			copy(region, t.Host[:nb])
			w.Host[slot] = region
			p.st.Cloned.Add(int64(nb))
		}
		return
	}
	if t.Owned {
		w.Dev[slot] = t.Dev
	} else {
		// The clone preClone made (Save reserved its bytes: cloneNeed).
		w.Dev[slot] = p.takePre(k)
	}
	if !w.DevLive {
		// Set once per write, under the state lock (readers test it there);
		// only the engine goroutine sets it, and only the committer clears
		// it, once the write was handed over: reading it here is safe.
		p.mu.Lock()
		w.DevLive = true
		p.mu.Unlock()
	}
	w.Host[slot], w.Staged[slot] = nil, region
}

// writeStep writes a whole step's immediate rows as one task into page pg;
// need is the clone bytes reserved for it.
//
// Device rows are not copied here: like a decode-buffer flush, the write
// keeps them on the device (Dev, readable there until staged) and the
// committer issues their device→host copies as one batch when it reaches
// the write, or while it scatters the write before it (issueAhead). The
// engine goroutine makes no device call for the step's rows: after an
// idle forward a driver call is tens of µs (cold caches, the driver's own
// locks), about a mixed decode step's whole budget. The exception is a
// step above the lazy hand-over's size whose clones Save waits for
// (cloned): Save issues their copies itself, while the clones run, so
// that they start when the clones end. Owned device tensors
// are handed over as they are; a non-owned one is the clone preClone made,
// charged as parked rows (DevCharge) until the copy landed.
func (p *Path) writeStep(s *Step, refs *Refs, pg *Page, need int64, cloned bool) error {
	w := p.newWrite(pg, len(s.Slots))
	w.DevCharge = need
	nimm := len(p.lay.Imm)
	w.Host = scratch.Grow(w.Host, nimm)
	w.Dev = scratch.Grow(w.Dev, nimm)
	w.Staged = scratch.Grow(w.Staged, nimm)
	w.Absent = scratch.Grow(w.Absent, nimm)
	lazy := len(s.Slots) <= p.lazyTokens
	if len(s.Into) == len(p.lay.RowBytes) && !lazy {
		p.into = s.Into // read by stage, for this write only
	}
	for ki, k := range p.lay.Imm {
		p.stage(w, &s.Out[k], k, ki, 0)
	}
	p.into = nil
	w.Steps = 1
	w.Direct = p.cfg.Direct && w.DevLive && int64(len(s.Slots)*p.immRowB) >= p.cfg.DirectMinBytes
	if cloned && w.DevLive && !lazy && !w.Direct {
		// Save waits for this step's clones before it returns: a large
		// step's copies out of them are issued now, behind the clones on
		// the stream, while the clones run. The copies then start when the
		// clones end, not when the committer, woken, got to issue them.
		ev, err := p.late.issue(p.dev, nimm, w)
		if err != nil {
			p.release(w, false)
			return p.fail(err)
		}
		w.lateEv, w.lateIssued = ev, true
	}
	var ev gpu.Event
	if !w.DevLive {
		// Host rows only (staged above, or owned): an event orders the
		// write on the device's stream as before, so that the committer's
		// wait for it is where a device that stalls holds the write back.
		var err error
		if ev, err = p.dev.Record(); err != nil {
			p.release(w, false)
			return p.fail(err)
		}
		if err := p.join(ev); err != nil {
			p.release(w, false)
			return err
		}
	}
	w.Slots = append(w.Slots, s.Slots...)
	if s.Accepted != nil {
		w.Reject = rejectRows(w.Reject, s)
	}
	p.mu.Lock()
	for ki, k := range p.lay.Imm {
		refs.Src[k], refs.SrcOff[k], refs.Omit[k] = w, 0, w.Absent[ki]
	}
	w.Owners = 1
	p.pinLocked(refs, w)
	p.refillWrites()
	p.mu.Unlock()
	p.handOver(w, ev, lazy, s.Blocks, true)
	return nil
}

// lazyBytes is the largest step write handed over without waking a
// polling committer (Queue.PushLazy): a wake costs the engine goroutine a
// system call, several µs, which a decode step's rows are not worth; a
// larger write's copies start at once (a prefill's copy is long enough that
// its start matters, and a wake is small beside it).
const lazyBytes = 4 << 20

// directMinBytes is the least a step's immediate rows weigh for a direct
// write (Config.Direct) by default: below it the device's per-copy cost and the
// device read at Materialize outweigh the host copy a direct write saves
// (the committer splits a scatter across its workers from the same size:
// mirror.DefaultSplitBytes).
const directMinBytes = 1 << 20

// handOver queues immediate write w for the committer: with its device
// rows to copy (CopyLate) when it has any, else with ev, the event its
// Save recorded after its host rows (0 for a flush). lazy leaves a polling
// committer to pick it up (Queue.PushLazy). own says w carries the rows
// of the step being saved (see Rider): the full blocks complete once w
// lands ride on it, unless steps stay parked. Engine goroutine.
func (p *Path) handOver(w *Write, ev gpu.Event, lazy bool, blocks []int32, own bool) {
	if w.CopyLate = w.DevLive && !w.Direct; w.CopyLate && !w.lateIssued {
		p.com.NoteLate()
	}
	if p.cfg.Rider != nil && p.buf.K == 0 {
		w.Pub, w.PubKeys = p.cfg.Rider.Ride(w.Pub, w.PubKeys, own) // newWrite left them empty
	}
	if lazy {
		w.Seq = p.q.PushLazy(Task{W: w, Ev: ev})
	} else {
		w.Seq = p.q.Push(Task{W: w, Ev: ev})
	}
	p.logWrite(w, blocks)
	p.st.Tasks.Add(1)
}

// park parks a pure-decode step's immediate rows in the decode buffer (a
// new buffer write on page pg when the buffer is empty); need is the
// device bytes reserved for its clones.
func (p *Path) park(s *Step, refs *Refs, pg *Page, need int64) error {
	n := len(s.Slots)
	if p.buf.K == 0 {
		w := p.newWrite(pg, n)
		m := p.lay.BlockSize * len(p.lay.Imm)
		w.Host = scratch.Grow(w.Host, m)
		w.Dev = scratch.Grow(w.Dev, m)
		w.Staged = scratch.Grow(w.Staged, m)
		w.Absent = scratch.Grow(w.Absent, m)
		p.buf.Open(s.IDs, w)
		w.Owners = 1 // not published yet: no lock needed
	}
	w, j := p.buf.W, p.buf.K
	if need > 0 {
		p.mu.Lock()
		w.DevCharge += need // the write owns the reservation from here on
		p.mu.Unlock()
	}
	for ki, k := range p.lay.Imm {
		p.stage(w, &s.Out[k], k, ki, j)
	}
	w.Slots = append(w.Slots, s.Slots...)
	// No state lock: refs are the engine's until Save returns, w is the
	// buffer's (pinOpen), and Steps is read once w is handed over.
	nimm := len(p.lay.Imm)
	for ki, k := range p.lay.Imm {
		refs.Src[k], refs.SrcOff[k], refs.Omit[k] = w, int32(j*n), w.Absent[j*nimm+ki]
	}
	pinOpen(refs, w)
	w.Steps = j + 1
	p.buf.K++
	p.st.Buffered.Add(1)
	if p.buf.K == p.lay.BlockSize {
		p.flushBuffer(true)
	}
	return nil
}

// flushBuffer writes the parked steps (if any) as one task: the committer
// copies the device-parked rows into the buffer's page (one batch of
// copies, CopyLate) and then scatters them. The engine goroutine only
// hands the write over: a flush costs it no device call (after an idle
// forward a batch of copies and an event record are tens of µs of driver
// time). own says the buffer holds the rows of the step being saved (it
// filled the buffer: see Rider). Engine goroutine.
func (p *Path) flushBuffer(own bool) {
	w := p.buf.Take()
	if w == nil {
		return
	}
	p.handOver(w, 0, true, nil, own) // nothing waits for a flush until a read or a page does: they wake the committer
	p.st.Flushes.Add(1)
}

// join is the save-side join point of writes of host rows: before such a
// write is handed over, the engine goroutine waits for the event of the
// host-row write before the previous one, so that at most two are ahead
// of the device's stream.
func (p *Path) join(ev gpu.Event) error {
	prev := p.lastEv[0]
	p.lastEv[0], p.lastEv[1] = p.lastEv[1], ev
	return p.waitDev(prev)
}

// rejectRows returns, per row of step s, whether its token was rejected
// (into buf), or nil when every token was accepted.
func rejectRows(buf []bool, s *Step) []bool {
	buf = buf[:0]
	any := false
	for i, n := range s.Count {
		acc := s.Accepted[i]
		for j := int32(0); j < n; j++ {
			buf = append(buf, j >= acc)
		}
		any = any || acc < n
	}
	if !any {
		return buf[:0]
	}
	return buf
}

// intoFix is a host key's rows that a write reads from the engine's
// tensor (src) until Save copied them into the engine's buffer (dst) and
// the write landed (Step.Into).
type intoFix struct {
	w    *Write
	slot int
	src  []byte
	dst  []byte
}

// saveInto completes a write of Step.Into rows, handed over: it copies
// each key's rows into the engine's buffer while the committer writes
// them to the mirror from the engine's tensor, waits until the write
// landed (the committer is done with the tensor, which the engine may
// overwrite once Save returned), and points the write at the engine's
// buffer, which holds the same rows, for Materialize. A wait that fails is
// the sticky failure. Engine goroutine, in Save.
func (p *Path) saveInto() error {
	fix := p.intoFix
	for _, f := range fix {
		p.parts.Workers.Copy(f.dst, f.src)
	}
	err := p.WaitSeq(fix[0].w.Seq)
	p.mu.Lock()
	for _, f := range fix {
		f.w.Host[f.slot] = f.dst
	}
	p.mu.Unlock()
	p.intoFix = scratch.Empty(fix)
	return err
}
