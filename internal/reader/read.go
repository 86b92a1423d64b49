package reader

import (
	"errors"
	"fmt"
	"time"

	"github.com/omnicache/omnicache/internal/errs"
	"github.com/omnicache/omnicache/internal/spin"
	"github.com/omnicache/omnicache/mirror"
)

// Dest receives a step's rows: Rows(qi, k) is the qi-th asked request's
// buffer for key k, prefix rows first. Size makes those buffers (a
// Materialize of a whole prefetched step leaves them to Adopt when Adopts).
// Adopts reports whether the destination takes buffers of the read path:
// one writing into its caller's memory does not, and a prefetched step's
// hit rows are copied into the buffers Size made. Fits reports whether the
// buffers Size needs are there already (it would allocate nothing). Adopt
// makes buf (laid out as the whole step's rows, every request in batch
// order) key k's buffer and returns the one it replaces. Fail records that
// request qi's rows cannot be served (its rows read as zeros); the other
// requests are served.
type Dest interface {
	Rows(qi, k int) []byte
	Size()
	Adopts() bool
	Fits() bool
	Adopt(k int, buf []byte) []byte
	Fail(qi int, err error)
}

// Read fills dst with, per request asked for (the first nq of s.Qidx, or
// the step's first nq requests when all) and key, `[hit prefix rows | this
// step's rows]`. The step was taken by its one consumer. A request whose
// prefix cannot be served (ErrAbsentRequired; ErrReassigned, only for a
// step read here rather than prefetched) is failed in dst and the others
// are read; an error returned fails the whole call (a write failure).
//
// The step's own rows on a device are copied as one batch (s.batch),
// waited for once before Read returns.
func (r *Reader) Read(s *Step, all bool, nq int, dst Dest) error {
	err := r.read(s, all, nq, dst)
	if ferr := r.w.FinishReads(&s.batch); err == nil {
		err = ferr
	}
	return err
}

func (r *Reader) read(s *Step, all bool, nq int, dst Dest) error {
	if s.Prefetched() {
		if r.readsSelf(s, all, dst) {
			if done, err := r.readAhead(s, all, nq, dst); done {
				return err
			}
		}
		return r.consumePrefetched(s, all, nq, dst)
	}
	_, err := r.readDirect(s, all, nq, dst, false)
	return err
}

// readsSelf decides who reads a prefetched step's hits, its read not
// started yet: the consumer when the committer sleeps (rather than wake
// it and wait), or when the committer, working, does not start the read
// within the ahead wait (a backlog holds it up); while the committer takes
// new buffers for it, the consumer when dst needs none (see "Cold buffers"
// in prefetch.go); else the committer, which the consumer then waits for.
func (r *Reader) readsSelf(s *Step, all bool, dst Dest) bool {
	st := s.pfState.Load()
	if st == pfQueued && !r.prog.Asleep() {
		spin.Until(r.wait, func() bool { return s.pfState.Load() != pfQueued }) // no spin on one P
		st = s.pfState.Load()
	}
	if st == pfAlloc && (!all || dst.Fits()) {
		// The committer is taking the read's buffers: idle ones from the
		// pool in a steady run (it then claims the read within µs), new
		// ones on a cache's first hits (ms to fault in, which the consumer
		// does not wait for). allocSpin tells the two apart.
		spin.Until(allocSpin, func() bool { return s.pfState.Load() != pfAlloc })
		st = s.pfState.Load()
	}
	switch st {
	case pfQueued:
		return true
	case pfAlloc:
		return !all || dst.Fits()
	}
	return false // read, or being read, by the committer
}

// allocSpin bounds the consumer's spin for a committer taking a read's
// buffers before it reads the rows itself (readsSelf): a pool hit is a
// few hundred ns, a new buffer of a cache's first hits ms; 200 µs leaves
// room for the committer to be descheduled meanwhile on a busy machine.
// TestMaterializeLeavesAWorkingCommitterItsRead (subset=true) failed 3
// of 10 runs under -race without it: the consumer saw the committer
// between taking its buffers and claiming the read.
const allocSpin = 200 * time.Microsecond

// readAhead serves a prefetched step whose read the committer has not
// started yet on the consumer's goroutine, as a step without prefetch is
// read, instead of waking the committer and waiting for it to get there
// (a step consumed right after it was saved, with no forward in between).
// Claiming the read (pfEngine) holds the committer at it: no write queued
// after the plan lands until the claim ends, so the rows found are the
// planned ones unless the blocks were claimed before the read began, which
// the checks of readDirect see. Any request it cannot serve that way
// (ErrReassigned: the blocks were rewritten after the plan; or absent
// rows) hands the read back (pfQueued) to the committer, which runs it in
// order and so still finds the planned rows (see "Late reads" in
// docs/design.md). done reports that dst was served (or err failed the
// call).
func (r *Reader) readAhead(s *Step, all bool, nq int, dst Dest) (done bool, err error) {
	if st := s.pfState.Load(); st != pfQueued && st != pfAlloc {
		return false, nil // read, or being read, by the committer
	}
	s.engMu.Lock()
	defer s.engMu.Unlock()
	if !s.pfState.CompareAndSwap(pfQueued, pfEngine) && !s.pfState.CompareAndSwap(pfAlloc, pfEngine) {
		return false, nil
	}
	if testHookReadingAhead != nil {
		testHookReadingAhead(s)
	}
	if all {
		dst.Size()
	}
	ok, err := r.readDirect(s, all, nq, dst, true)
	if !ok && err == nil {
		s.pfState.Store(pfQueued) // the committer reads it in order
		r.st.HandedBack.Add(1)
		return false, nil
	}
	s.pfState.Store(pfTaken)
	r.uncharge(s) // its buffers will not be taken
	if err == nil {
		r.st.ReadsAhead.Add(1)
	}
	return true, err
}

// readDirect reads the hit prefixes and the step's own rows of the asked
// requests into dst on the calling goroutine. A request whose prefix
// cannot be served is failed in dst, or, with whole, ends the read (ok
// false, dst partly written) before anything was counted.
func (r *Reader) readDirect(s *Step, all bool, nq int, dst Dest, whole bool) (ok bool, err error) {
	tokOff := s.Offsets()
	hitRows := int64(0)
	for qi := 0; qi < nq; qi++ {
		i := qi
		if !all {
			i = int(s.Qidx[qi])
		}
		pre := int(s.Prefix(i))
		failed := false
		for k := range r.lay.Keys {
			rb := r.lay.RowBytes[k]
			out := dst.Rows(qi, k)
			if pre > 0 {
				if err := r.readPrefix(s, i, k, pre, out[:pre*rb], false); err != nil {
					if !perRequest(err) {
						return false, err
					}
					if whole {
						return false, nil
					}
					if s.noBudget && errors.Is(err, errs.Reassigned) {
						err = fmt.Errorf("%w (the step was not prefetched: the read-ahead budget was exhausted at Begin)", err)
					}
					dst.Fail(qi, fmt.Errorf("request %d, key %q: %w", s.IDs[i], r.lay.Keys[k].Name, err))
					failed = true
					break
				}
			}
			if err := r.readOwn(s, i, k, tokOff, out[pre*rb:]); err != nil {
				return false, err
			}
		}
		if !failed {
			hitRows += int64(pre)
		}
	}
	if hitRows > 0 {
		r.st.HitRows.Add(hitRows)
	}
	return true, nil
}

// readOwn copies request i's rows of this step for key k into out.
func (r *Reader) readOwn(s *Step, i, k int, tokOff []int32, out []byte) error {
	cnt := int(s.Count[i])
	if cnt == 0 {
		return nil
	}
	if s.Omit[k] {
		clear(out[:cnt*r.lay.RowBytes[k]]) // the step did not emit the key
		return nil
	}
	w := s.Src[k]
	if w == nil {
		return fmt.Errorf("%w: step %d has no rows for key %q", errs.WriteFailed, s.ID, r.lay.Keys[k].Name)
	}
	return r.w.ReadRows(w, k, int(s.SrcOff[k])+int(tokOff[i]), cnt, out, &s.batch)
}

// readPrefix reads request i's hit prefix of key k (pre rows) into out.
// inOrder: the committer runs the read in queue order (prefetch), so no
// write can have replaced a planned row: the checks against a newer write
// are skipped (a deferred slot's word may already name a newer pending
// write whose rows have not landed).
func (r *Reader) readPrefix(s *Step, i, k, pre int, out []byte, inOrder bool) error {
	if r.lay.ImmIdx[k] >= 0 {
		return r.readJoined(s, i, k, pre, out, inOrder)
	}
	base := int(s.defOff[i]) + r.lay.DefIdx[k]*pre
	rb := r.lay.RowBytes[k]
	occ := r.parts.Occ[k]
	for t := 0; t < pre; t++ {
		e := base + t
		d := out[t*rb : (t+1)*rb]
		switch s.pKind[e] {
		case srcZero:
			clear(d)
		case srcAbsent:
			return fmt.Errorf("%w: position %d (slot %d) never written", errs.AbsentRequired, t, s.pSlot[e])
		case srcMirror:
			sl, word := s.pSlot[e], s.snap.Words[e]
			if !inOrder && occ.Word(sl) != word {
				return fmt.Errorf("%w: position %d (slot %d)", errs.Reassigned, t, sl)
			}
			m := r.parts.Mirrors.Get(k)
			if m == nil {
				return fmt.Errorf("%w: position %d (slot %d): committed slot without mirror", errs.Reassigned, t, sl)
			}
			m.ReadRow(d, sl)
			if !inOrder && occ.Word(sl) != word {
				return fmt.Errorf("%w: position %d (slot %d)", errs.Reassigned, t, sl)
			}
		case srcClone:
			if err := r.w.ReadRows(s.snap.Clones[e], k, int(s.snap.Rows[e]), 1, d, nil); err != nil {
				return err
			}
		case srcFailed:
			if err := r.w.Err(); err != nil {
				return err
			}
			return fmt.Errorf("%w: position %d (slot %d): its write was dropped", errs.WriteFailed, t, s.pSlot[e])
		}
	}
	return nil
}

// readJoined reads a hit prefix of an immediate key from the mirror once
// every write handed over before the plan has landed. A block holds the
// planned rows only if its owner is at most the plan's maxOwner (no newer
// write touched it) and none of its slots is stale (no planned write
// skipped one because a newer write claimed it); otherwise the block was
// claimed after the plan (ErrReassigned). The written bit tells absent
// rows. If a scatter overlapped the copies (the committer's epoch moved),
// the owners and stale bits are checked again once it is over: a scatter
// publishes them when its rows are in.
func (r *Reader) readJoined(s *Step, i, k, pre int, out []byte, inOrder bool) error {
	if !inOrder {
		if err := r.w.WaitSeq(s.joinSeq); err != nil {
			return err
		}
	}
	sl := s.hitSlots(i, pre, r.lay.BlockSize)
	rb := r.lay.RowBytes[k]
	m := r.parts.Mirrors.Get(k)
	ten := r.parts.Tenancy
	opt := r.lay.Keys[k].Optional
	ki := r.lay.ImmIdx[k]
	e1 := r.prog.Epoch()
	if r.allWritten(s, ki, sl) {
		// Every row written, present and owned (the common case): check
		// them all, then copy them, a run of consecutive slots (a hit's
		// block) at a time, split across the copy workers when large.
		m.ReadSplit(r.parts.Workers, out, sl)
	} else if err := r.copyChecked(s, ki, sl, rb, opt, m, out); err != nil {
		return err
	}
	if inOrder || e1&1 == 0 && r.prog.Epoch() == e1 {
		return nil // in order: the committer itself runs this, no scatter overlaps
	}
	r.prog.EvenEpoch()
	for t, slot := range sl {
		if ten.Owner(slot) > s.maxOwner || ten.Stale(slot) {
			return fmt.Errorf("%w: position %d (slot %d)", errs.Reassigned, t, slot)
		}
	}
	return nil
}

// allWritten reports whether every slot of sl holds a planned row of
// immediate key ki: owned by a write no newer than the plan, not stale,
// written, and not omitted. If not, the row-by-row copy reports which (or
// zeroes absent optional rows).
func (r *Reader) allWritten(s *Step, ki int, sl []int32) bool {
	ten := r.parts.Tenancy
	for _, slot := range sl {
		if ten.Owner(slot) > s.maxOwner || ten.Stale(slot) || !ten.Written(slot) || ten.Absent(ki, slot) {
			return false
		}
	}
	return true
}

// copyChecked copies sl's rows of immediate key ki into out one by one,
// each after checking its owner, stale, written and absent bits.
func (r *Reader) copyChecked(s *Step, ki int, sl []int32, rb int, opt bool, m *mirror.Mirror, out []byte) error {
	ten := r.parts.Tenancy
	for t, slot := range sl {
		d := out[t*rb : (t+1)*rb]
		switch {
		case ten.Owner(slot) > s.maxOwner || ten.Stale(slot):
			return fmt.Errorf("%w: position %d (slot %d)", errs.Reassigned, t, slot)
		case opt && (!ten.Written(slot) || ten.Absent(ki, slot)):
			clear(d)
		case !ten.Written(slot):
			return fmt.Errorf("%w: position %d (slot %d) never written", errs.AbsentRequired, t, slot)
		default:
			m.ReadRow(d, slot)
		}
	}
	return nil
}
