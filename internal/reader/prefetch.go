package reader

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/errs"
	"github.com/omnicache/omnicache/internal/hostmem"
	"github.com/omnicache/omnicache/internal/scratch"
	"github.com/omnicache/omnicache/internal/spin"
)

// Prefetch. A step with hits is planned at Begin; with prefetch on, its
// hit read is queued to the committer right behind the writes handed over
// so far. The committer runs it in queue order (writer.InOrder): after
// every write before it landed and before any write after it, so the
// mirror holds exactly the planned rows and no newer write can overwrite
// them first: a late Materialize never finds its rows reassigned. The rows
// go, across the copy workers, into buffers laid out as the step's Result
// (per key, per request in batch order, [prefix rows | step rows]), while
// the engine runs its forward; Materialize of the whole step adopts them
// into its Result (no copy) and adds only the step's own rows.
//
// A step consumed before the committer started its read is read by the
// consumer itself (readAhead, read.go) when the committer sleeps (it would
// have to be woken), or when it is working but does not start the read
// within DefaultAheadWait (a backlog of earlier work holds it up), unless
// a row was claimed since the plan: the read then goes back to the
// committer. A working committer is otherwise left its read: a read the
// consumer takes holds the committer at it (no later write may land
// first), which made the pipeline run one after the other.
//
// The buffers are charged to a read-ahead budget (Config.ReadAheadBytes)
// from Begin until the step is consumed. A step whose buffers do not fit
// is not prefetched: its hits are read at Materialize, on the caller's
// goroutine, and fail with ErrReassigned (naming the budget) if a newer
// write claimed their blocks first.
//
// Cold buffers. The committer takes a read's buffers before it claims the
// read (pfAlloc meanwhile): idle ones from the pool, or, when the pool
// holds none of the size (a cache's first hits, a step larger than any
// before), new ones (bufPool.fresh), hundreds of MiB to fault in. A
// consumer that comes meanwhile reads the rows itself, as it reads a read
// not started (readAhead: the committer is held at the read, so the rows
// are still the planned ones), when its destination holds them already or
// it asks for some requests only (its destination is sized then); the new
// buffers go to the pool for the next hit. A consumer whose destination
// would have to allocate as much waits and adopts the committer's buffers
// instead: the allocation is done once, during the forward. So the first
// prefetched hit costs the consumer no more than the same read without
// prefetch (BenchmarkHitStep/first).

// Options configure a Reader.
type Options struct {
	// Prefetch queues every planned hit read to the committer (see above);
	// off, hits are read at Materialize on the caller's goroutine.
	Prefetch bool
	// Budget bounds the bytes of prefetch buffers held by unconsumed steps
	// (and the idle buffers kept for reuse).
	Budget int64
	// Dev is the cache's device: a step with device result buffers has
	// its prefetched hit rows copied up on it (device.go).
	Dev gpu.Device
}

// DefaultAheadWait bounds how long the consumer of a prefetched step
// waits, spinning, for a working committer to start the step's read before
// it reads the rows itself (see above; no wait on one P, internal/spin):
// long enough for a committer writing a decode step of 4 KiB rows (256
// KiB) to reach a hit read queued behind it (BenchmarkStep shape=decode64
// hit=50 reports caller-reads/op, the reads it did not reach).
const DefaultAheadWait = 50 * time.Microsecond

// engineReadSpin bounds the committer's spin for a read the consumer is
// doing itself before it waits on the step's lock (see RunInOrder).
const engineReadSpin = 50 * time.Microsecond

// Test hooks (nil outside tests): testHookReadingAhead runs on the
// consumer once it claimed a read (pfEngine), testHookSawEngine on the
// committer once it found the consumer reading.
var testHookReadingAhead, testHookSawEngine func(s *Step)

// bufPool keeps idle prefetch buffers (and the buffers Results hand back
// when they adopt prefetched ones) for reuse, up to max bytes.
type bufPool struct {
	mu    sync.Mutex
	free  [][]byte
	bytes int64
	max   int64
	// workers split the faulting-in of a new buffer (the copy workers).
	workers int
}

// testHookFresh runs (tests only) on the committer before it allocates a
// new prefetch buffer of n bytes.
var testHookFresh func(n int)

// get returns a buffer of n bytes (contents undefined): the smallest idle
// one that holds n, else a new one (fresh).
func (b *bufPool) get(n int) []byte {
	b.mu.Lock()
	best := -1
	for i, f := range b.free {
		if cap(f) >= n && (best < 0 || cap(f) < cap(b.free[best])) {
			best = i
		}
	}
	if best >= 0 {
		f := b.free[best]
		last := len(b.free) - 1
		b.free[best] = b.free[last]
		b.free[last] = nil
		b.free = b.free[:last]
		b.bytes -= int64(cap(f))
		b.mu.Unlock()
		return f[:n]
	}
	b.mu.Unlock()
	return b.fresh(n)
}

// fresh allocates a buffer of n bytes and, from hostmem.Threshold on,
// faults its pages in at once, split over the workers
// (hostmem.PopulateParallel), before the read writes into it: written into
// untouched memory, the read would take a page fault per 4 KiB page, most
// of a second for 384 MiB on a VM, where the kernel faults the same pages
// in bulk in tens of ms (mirror's BenchmarkFirstTouch shows the per-page
// cost). Memory the runtime hands back for reuse is cleared by make, which
// faults it in page by page all the same: see "Cold buffers" above for
// why the consumer does not wait for it.
func (b *bufPool) fresh(n int) []byte {
	if testHookFresh != nil {
		testHookFresh(n)
	}
	buf := make([]byte, n)
	if n >= hostmem.Threshold {
		hostmem.PopulateParallel(buf, b.workers)
	}
	return buf
}

// put keeps f for reuse if it fits under max (else the GC takes it).
func (b *bufPool) put(f []byte) {
	if cap(f) == 0 {
		return
	}
	b.mu.Lock()
	if b.bytes+int64(cap(f)) <= b.max {
		b.free = append(b.free, f[:0])
		b.bytes += int64(cap(f))
	}
	b.mu.Unlock()
}

// charge reserves n read-ahead bytes; false if the budget cannot hold them.
func (r *Reader) charge(n int64) bool {
	for {
		c := r.charged.Load()
		if c+n > r.opt.Budget {
			return false
		}
		if r.charged.CompareAndSwap(c, c+n) {
			return true
		}
	}
}

// ReadAheadBytes is the read-ahead budget in use now.
func (r *Reader) ReadAheadBytes() int64 { return r.charged.Load() }

// Charge lays out the prefetch buffers of a step about to be planned with
// hits (per request, batch order, [prefix | step rows]) and charges them to
// the read-ahead budget. false: the budget cannot hold them (the step is
// then planned at Save and read at Materialize). into, the engine's
// buffers per key (Plan.ResultInto), become the read's when each holds
// the step's rows; the charge is the same either way (the budget bounds
// the prefetches in flight). Engine goroutine.
func (r *Reader) Charge(s *Step, hits []Hit, into [][]byte) bool {
	n := len(s.IDs)
	s.pfOff = scratch.Grow(s.pfOff, n)
	clear(s.pfOff)
	for _, h := range hits { // pfOff holds the prefixes for a moment
		s.pfOff[h.Index] = h.Tokens
	}
	rows := int32(0)
	for i := 0; i < n; i++ {
		pre := s.pfOff[i]
		s.pfOff[i] = rows
		rows += pre + s.Count[i]
	}
	var bytes int64
	for _, rb := range r.lay.RowBytes {
		bytes += int64(rows) * int64(rb)
	}
	if !r.opt.Prefetch || !r.charge(bytes) {
		s.noBudget = r.opt.Prefetch
		return false
	}
	s.pfCharge.Store(bytes)
	if len(into) == len(r.lay.RowBytes) {
		for k, rb := range r.lay.RowBytes {
			if len(into[k]) < int(rows)*rb {
				s.into = scratch.Empty(s.into)
				break
			}
			n := int(rows) * rb
			s.into = append(s.into, into[k][:n:n])
		}
	}
	return true
}

// queue hands s's read (its buffers charged by Charge) to the committer.
// Engine goroutine (Plan). The buffers are taken by the read itself: a
// new one is hundreds of MiB to fault in, no work for the engine goroutine
// (see "Cold buffers").
func (r *Reader) queue(s *Step) {
	s.pfErr = scratch.Grow(s.pfErr, len(s.IDs))
	clear(s.pfErr)
	s.rd = r
	s.hold.Add(1) // the committer's, until the read ran
	// Lazily: a polling committer starts the read within a poll (at most
	// 1 ms, small beside a forward) at no wake-up cost to the engine, and
	// Materialize's wait for it wakes the committer.
	s.pfSeq = r.w.PushRead(s)
}

// Prefetched reports whether s's hits were read (or are being read) by the
// committer; PrefetchSeq is the queue sequence to wait for.
func (s *Step) Prefetched() bool { return s.pfSeq != 0 }

func (s *Step) PrefetchSeq() uint64 { return s.pfSeq }

// HasHits reports whether the step serves a hit prefix to any request.
func (s *Step) HasHits() bool { return len(s.prefix) > 0 }

// WaitSeq is the committer queue item a read of the step may wait for:
// its prefetch, else the writes its hit plan joins (0: none).
func (s *Step) WaitSeq() uint64 {
	if s.pfSeq != 0 {
		return s.pfSeq
	}
	return s.joinSeq
}

// RunInOrder is the prefetch read, on the committer goroutine in queue
// order (writer.InOrder).
func (s *Step) RunInOrder(failed bool) {
	r := s.rd
	// Take the buffers first, the read still open to the consumer (see
	// "Cold buffers"), then claim it unless the consumer took it. Each
	// decision rests on the state just loaded: pfCancelled and pfTaken are
	// final, and a read the consumer hands back returns to pfQueued, so a
	// failed claim looks again rather than take the state it saw before for
	// the one now. Buffers taken for a read the consumer served go back to
	// the pool with the step's release.
	caller := len(s.into) > 0 || len(s.dev) > 0
	if caller {
		s.pfMu.Lock() // until the read (and copy up) into the engine's buffers is done (settle)
	}
	claimed := false
	if !failed && s.pfState.CompareAndSwap(pfQueued, pfAlloc) {
		r.takeBuffers(s)
		claimed = s.pfState.CompareAndSwap(pfAlloc, pfStarted)
	}
claim:
	for !claimed {
		switch s.pfState.Load() {
		case pfQueued:
			if claimed = s.pfState.CompareAndSwap(pfQueued, pfStarted); claimed {
				break claim
			}
		case pfEngine:
			// The consumer is reading the rows itself (readAhead): wait
			// until it is done (spinning first: it is µs), then read them
			// unless it served them.
			if testHookSawEngine != nil {
				testHookSawEngine(s)
			}
			spin.Until(engineReadSpin, func() bool { return s.pfState.Load() != pfEngine })
			s.engMu.Lock()
			s.engMu.Unlock() //nolint:staticcheck // an empty critical section: the wait is the point
		default:
			break claim // consumed (pfCancelled, pfTaken): nothing to read
		}
	}
	if claimed {
		if failed {
			s.pfFailed = true
		} else {
			if len(s.pf) == 0 { // claimed after a hand-back
				r.takeBuffers(s)
			}
			r.readInOrder(s)
			if len(s.dev) > 0 {
				r.copyUp(s)
			}
		}
	}
	if caller {
		s.pfMu.Unlock()
	}
	// The clones it read are no longer needed: their budget can be forced
	// out before the step is consumed.
	r.w.Unpin(&s.planPins)
	r.release(s)
}

// takeBuffers gives s its read's buffers, one per key, laid out as the
// step's Result (pfOff). The committer.
func (r *Reader) takeBuffers(s *Step) {
	if len(s.into) > 0 {
		s.pf = append(s.pf, s.into...) // the engine's (Plan.ResultInto)
		return
	}
	rows := 0
	if n := len(s.IDs); n > 0 {
		rows = int(s.pfOff[n-1] + s.Prefix(n-1) + s.Count[n-1])
	}
	for _, rb := range r.lay.RowBytes {
		s.pf = append(s.pf, r.pool.get(rows*rb))
	}
}

// readInOrder reads every hit prefix of s into its buffers. Nothing can
// overwrite the planned rows meanwhile: the committer, the only writer of
// the mirror, is running this. A request whose rows cannot be served gets
// its error in pfErr; the others are read.
func (r *Reader) readInOrder(s *Step) {
	for i := range s.IDs {
		pre := int(s.Prefix(i))
		if pre == 0 {
			continue
		}
		for k := range r.lay.Keys {
			rb := r.lay.RowBytes[k]
			lo := int(s.pfOff[i]) * rb
			out := s.pf[k][lo : lo+pre*rb]
			if err := r.readPrefix(s, i, k, pre, out, true); err != nil {
				s.pfErr[i] = fmt.Errorf("request %d, key %q: %w", s.IDs[i], r.lay.Keys[k].Name, err)
				break
			}
		}
	}
}

// Release drops the consumer's reference to s once it consumed it; the
// last reference returns the buffers, the budget and the record. A read
// into the engine's buffers that the committer is running is waited for
// first (settle). The consumer's goroutine.
func (r *Reader) Release(s *Step) {
	r.settle(s)
	r.release(s)
}

// release drops one reference to s (the committer's once its read ran, or
// the consumer's): the last one returns the buffers, the budget and the
// record. Any goroutine.
func (r *Reader) release(s *Step) {
	if r.drop(s, false) {
		r.free(s)
	}
}

// settle waits until no read writes into the engine's buffers of s
// (Plan.ResultInto, Plan.ResultDev) any more: the consumer calls it before it gives s
// up, so that the buffers are the engine's again when its call returns. A
// read the committer has not claimed by then never starts (the consumer
// took it, or cancelled it first); one it claimed holds pfMu until done.
func (r *Reader) settle(s *Step) {
	if len(s.into) > 0 || len(s.dev) > 0 {
		s.pfMu.Lock()
		s.pfMu.Unlock() //nolint:staticcheck // an empty critical section: the wait is the point
		r.settleDev(s)  // and the copy up into the engine's device buffers (Plan.ResultDev)
	}
}

// drop drops one reference to s and reports whether it was the last: s's
// read-ahead buffers, charge and plan pins are then given back, and s is
// the caller's to free. For the consumer (its goroutine saw the step
// saved, so pfSeq is settled) of a step never prefetched (pfSeq 0) its
// reference is the only one: no other goroutine can hold s, so the count
// is left at 1 without an atomic add (Reset finds it there). The
// committer's drop never reads pfSeq: the engine sets it after the push
// the committer may already be running.
func (r *Reader) drop(s *Step, consumer bool) bool {
	if !consumer || s.pfSeq != 0 || s.hold.Load() != 1 {
		if s.hold.Add(-1) != 0 {
			return false
		}
	}
	r.settleDev(s) // no copy up from the read's buffers in flight
	for k, b := range s.pf {
		if len(s.into) == 0 { // the engine's buffers are not the pool's
			r.pool.put(b)
		}
		s.pf[k] = nil
	}
	r.uncharge(s)
	r.w.Unpin(&s.planPins)
	return true
}

// uncharge gives s's read-ahead charge back (once).
func (r *Reader) uncharge(s *Step) {
	if s.pfCharge.Load() == 0 {
		return // nothing charged (no prefetch), or given back already
	}
	if b := s.pfCharge.Swap(0); b > 0 {
		r.charged.Add(-b)
	}
}

// Cancel gives up a step that will not be read (Discard, Abort, a failed
// Save): a read not started yet is skipped and its charge is given back at
// once (the step is consumed: its buffers will never be taken, and the next
// step's Charge must not find them still counted); the consumer's
// reference is dropped (the last one recycles the record). The consumer's
// goroutine (the engine's for Abort and a failed Save).
func (r *Reader) Cancel(s *Step) {
	if s.pfSeq != 0 {
		r.st.PrefetchDropped.Add(1)
		if s.pfState.CompareAndSwap(pfQueued, pfCancelled) || s.pfState.CompareAndSwap(pfAlloc, pfCancelled) {
			r.uncharge(s)
		}
		r.settle(s)
	}
	if r.drop(s, true) {
		r.free(s)
	}
}

// consumePrefetched serves the asked requests of a prefetched step: the
// prefix rows are in s.pf (adopted whole into dst when every request is
// asked and dst adopts buffers, else copied into dst's), the step's own
// rows are copied after them.
func (r *Reader) consumePrefetched(s *Step, all bool, nq int, dst Dest) error {
	if err := r.w.WaitSeq(s.pfSeq); err != nil {
		return err
	}
	if s.pfFailed {
		if err := r.w.Err(); err != nil {
			return err
		}
		return fmt.Errorf("%w: the prefetch of step %d was skipped", errs.WriteFailed, s.ID)
	}
	if s.pfState.Load() != pfStarted {
		// The committer passed the read without running it: never the
		// case (the consumer reads itself only what it then serves), but
		// a prefetch not run holds no rows, and serving its empty buffers
		// would deliver a hit without its prefix and without an error.
		// Read it here instead, with every check of a late read.
		if all {
			dst.Size()
		}
		_, err := r.readDirect(s, all, nq, dst, false)
		return err
	}
	r.st.PrefetchUsed.Add(1)
	// The engine's buffers are never adopted: they are not the cache's.
	adopt := all && dst.Adopts() && len(s.into) == 0
	if adopt {
		for k := range s.pf {
			r.pool.put(dst.Adopt(k, s.pf[k]))
			s.pf[k] = nil
		}
	}
	tokOff := s.Offsets()
	for qi := 0; qi < nq; qi++ {
		i := qi
		if !all {
			i = int(s.Qidx[qi])
		}
		if err := s.pfErr[i]; err != nil {
			dst.Fail(qi, err)
			continue
		}
		pre := int(s.Prefix(i))
		if pre > 0 {
			r.st.HitRows.Add(int64(pre))
		}
		for k := range r.lay.Keys {
			rb := r.lay.RowBytes[k]
			out := dst.Rows(qi, k)
			if !adopt && pre > 0 {
				lo := int(s.pfOff[i]) * rb
				// Into the buffers the rows were read into (Plan.ResultInto,
				// the whole step): they are in place.
				if src := s.pf[k][lo : lo+pre*rb]; &src[0] != &out[0] {
					r.parts.Workers.Copy(out[:pre*rb], src)
				}
			}
			if err := r.readOwn(s, i, k, tokOff, out[pre*rb:]); err != nil {
				return err
			}
		}
	}
	return nil
}

// perRequest reports whether err is one request's (its rows cannot be
// served) rather than the whole call's.
func perRequest(err error) bool {
	return errors.Is(err, errs.Reassigned) || errors.Is(err, errs.AbsentRequired)
}
