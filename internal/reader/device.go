package reader

import (
	"fmt"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/errs"
	"github.com/omnicache/omnicache/internal/scratch"
)

// Device results (Plan.ResultDev). A step begun with device buffers for
// its Result has, once its prefetch read the hit rows into the read's
// buffers on the committer, those rows copied up into the device buffers
// at once (copyUp), still during the engine's forward; Save puts the
// step's own rows there (the root package). The consumer (ReadDev) then
// only waits for the copies. A step whose hits the committer did not read
// (no prefetch, the budget exhausted) is read into host memory and copied
// up by the consumer (the root package's fallback).

// SetResultDev records the step's device buffers for its Result (per key,
// laid out as the Result: per request [prefix | step rows], batch order).
// Engine goroutine, before the step's read is queued.
func (s *Step) SetResultDev(bufs []gpu.Buffer) { s.dev = append(s.dev[:0], bufs...) }

// ResultDev returns the buffers SetResultDev recorded (empty: none).
func (s *Step) ResultDev() []gpu.Buffer { return s.dev }

// copyUp copies every served hit prefix of s from the read's buffers into
// its device buffers and records the event the consumer waits for. The
// committer, right after the read (RunInOrder). A copy that fails is kept
// in devErr: the consumer returns it.
func (r *Reader) copyUp(s *Step) {
	d := r.opt.Dev
	for i := range s.IDs {
		pre := int(s.Prefix(i))
		if pre == 0 || s.pfErr[i] != nil {
			continue
		}
		for k, rb := range r.lay.RowBytes {
			lo := int(s.pfOff[i]) * rb
			if err := d.CopyHtoD(s.dev[k], lo, s.pf[k][lo:lo+pre*rb]); err != nil {
				s.devErr = err
				return
			}
		}
	}
	s.devEv, s.devErr = d.Record()
	s.devUp = s.devErr == nil
}

// settleDev waits until no copy into s's device buffers, or out of its
// read buffers, is in flight. Whoever frees the step's buffers.
func (r *Reader) settleDev(s *Step) {
	if s.devEv != 0 {
		_ = r.opt.Dev.Wait(s.devEv) // a failed copy is the consumer's to report (devErr, or the next device call)
		s.devEv = 0
	}
}

// ReadDev serves a step begun with device buffers (SetResultDev) from the
// copies made while the engine worked: done reports that every served
// row is in the device buffers (the hit prefixes copied up by the
// committer and waited for; the step's own rows are the caller's). A
// request whose prefix could not be served is failed in dst (its device
// rows are the caller's to clear). Not done (no error): the committer
// did not read the step's hits (not prefetched, or read by nobody yet):
// the caller reads the step into host memory (Read) and copies it up.
// The step's consumer.
func (r *Reader) ReadDev(s *Step, nq int, dst Dest) (done bool, err error) {
	if len(s.dev) == 0 {
		return false, nil
	}
	if !s.HasHits() {
		return true, nil
	}
	if !s.Prefetched() {
		return false, nil
	}
	// Left to the committer (its copy up follows the read): waking it
	// costs less than a read here, which would then copy up on this
	// goroutine.
	if err := r.w.WaitSeq(s.pfSeq); err != nil {
		return false, err
	}
	if s.pfFailed {
		if err := r.w.Err(); err != nil {
			return false, err
		}
		return false, fmt.Errorf("%w: the prefetch of step %d was skipped", errs.WriteFailed, s.ID)
	}
	if s.pfState.Load() != pfStarted || !s.devUp {
		if s.devErr != nil {
			return false, fmt.Errorf("%w: copying step %d's hit rows to the device: %w", errs.WriteFailed, s.ID, s.devErr)
		}
		return false, nil
	}
	if err := r.opt.Dev.Wait(s.devEv); err != nil {
		return false, fmt.Errorf("%w: copying step %d's hit rows to the device: %w", errs.WriteFailed, s.ID, err)
	}
	s.devEv = 0
	r.st.PrefetchUsed.Add(1)
	var hitRows int64
	for i := 0; i < nq; i++ {
		if err := s.pfErr[i]; err != nil {
			dst.Fail(i, err)
			continue
		}
		hitRows += int64(s.Prefix(i))
	}
	if hitRows > 0 {
		r.st.HitRows.Add(hitRows)
	}
	return true, nil
}

// resetDev empties s's device-result state (Reset).
func (s *Step) resetDev() {
	s.dev = scratch.Empty(s.dev)
	s.devEv, s.devErr, s.devUp = 0, nil, false
}
