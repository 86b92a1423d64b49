//go:build cuda

// Copies and events of the CUDA device: device↔host and device→device
// copies on the stream, and pooled completion events.

package gpu

import (
	"errors"
	"fmt"
	"time"
	"unsafe"
)

func devPtr(b Buffer, off int) uintptr { return b.Ptr + uintptr(off) }

func hostPtr(p []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(p)) }

// hostCopy copies between host memory once the stream has drained (host
// memory used as a Buffer).
func (d *CUDA) hostCopy(dst, src []byte) error {
	if err := d.enter(); err != nil {
		return fmt.Errorf("%w: %w", ErrCopy, err)
	}
	defer d.leave()
	if err := streamSync(d.stream); err != nil {
		return fmt.Errorf("%w: cuStreamSynchronize: %w", ErrCopy, err)
	}
	copy(dst, src)
	return nil
}

func (d *CUDA) CopyDtoD(dst Buffer, dstOff int, src Buffer, srcOff int, n int) error {
	if err := cspan(dst, dstOff, n); err != nil {
		return err
	}
	if err := cspan(src, srcOff, n); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	if dst.Host != nil && src.Host != nil {
		return d.hostCopy(dst.Host[dstOff:dstOff+n], src.Host[srcOff:srcOff+n])
	}
	if err := d.enter(); err != nil {
		return fmt.Errorf("%w: %w", ErrCopy, err)
	}
	defer d.leave()
	var err error
	var op string
	switch {
	case src.Host != nil:
		op, err = "cuMemcpyHtoDAsync", copyHtoD(devPtr(dst, dstOff), hostPtr(src.Host[srcOff:]), n, d.stream)
	case dst.Host != nil:
		op, err = "cuMemcpyDtoHAsync", copyDtoH(hostPtr(dst.Host[dstOff:]), devPtr(src, srcOff), n, d.stream)
	default:
		op, err = "cuMemcpyDtoDAsync", copyDtoD(devPtr(dst, dstOff), devPtr(src, srcOff), n, d.stream)
	}
	if err != nil {
		return fmt.Errorf("%w: %s of %d bytes: %w", ErrCopy, op, n, err)
	}
	return nil
}

func (d *CUDA) CopyDtoH(dst []byte, src Buffer, srcOff int) error {
	n := len(dst)
	if err := cspan(src, srcOff, n); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	if src.Host != nil {
		return d.hostCopy(dst, src.Host[srcOff:srcOff+n])
	}
	if err := d.enter(); err != nil {
		return fmt.Errorf("%w: %w", ErrCopy, err)
	}
	defer d.leave()
	for len(dst) > 0 {
		part := d.split(dst)
		if err := copyDtoH(hostPtr(part), devPtr(src, srcOff), len(part), d.stream); err != nil {
			return fmt.Errorf("%w: cuMemcpyDtoHAsync of %d bytes: %w", ErrCopy, len(part), err)
		}
		dst, srcOff = dst[len(part):], srcOff+len(part)
	}
	return nil
}

// split is the head of host span p that lies in one registration (all of
// p unless p crosses a chunk boundary of a page registered in chunks).
func (d *CUDA) split(p []byte) []byte {
	if end := d.chunked(p); end != 0 {
		return p[:end-uintptr(hostPtr(p))]
	}
	return p
}

func (d *CUDA) CopyHtoD(dst Buffer, dstOff int, src []byte) error {
	n := len(src)
	if err := cspan(dst, dstOff, n); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	if dst.Host != nil {
		return d.hostCopy(dst.Host[dstOff:dstOff+n], src)
	}
	if err := d.enter(); err != nil {
		return fmt.Errorf("%w: %w", ErrCopy, err)
	}
	defer d.leave()
	for len(src) > 0 {
		part := d.split(src)
		if err := copyHtoD(devPtr(dst, dstOff), hostPtr(part), len(part), d.stream); err != nil {
			return fmt.Errorf("%w: cuMemcpyHtoDAsync of %d bytes: %w", ErrCopy, len(part), err)
		}
		src, dstOff = src[len(part):], dstOff+len(part)
	}
	return nil
}

// Record records an event at the stream's current end and returns its
// handle (never 0).
func (d *CUDA) Record() (Event, error) {
	if err := d.enter(); err != nil {
		return 0, fmt.Errorf("%w: record: %w", ErrCopy, err)
	}
	defer d.leave()
	d.evMu.Lock()
	defer d.evMu.Unlock()
	d.reapLocked(true)
	var ev cuEvent
	if k := len(d.free); k > 0 {
		ev = d.free[k-1]
		d.free = d.free[:k-1]
	} else {
		var err error
		if ev, err = eventCreate(); err != nil {
			return 0, fmt.Errorf("%w: cuEventCreate: %w", ErrCopy, err)
		}
	}
	if err := eventRecord(ev, d.stream); err != nil {
		d.free = append(d.free, ev)
		return 0, fmt.Errorf("%w: cuEventRecord: %w", ErrCopy, err)
	}
	d.seq++
	d.pend = append(d.pend, evEntry{seq: d.seq, ev: ev})
	return Event(d.seq), nil
}

// reapLocked recycles the oldest recorded events that have completed and
// that nobody waits on. With query it asks the driver about events not yet
// known complete (the caller then holds the context current).
func (d *CUDA) reapLocked(query bool) {
	for len(d.pend) > 0 {
		e := &d.pend[0]
		if e.waiters > 0 {
			return
		}
		if e.seq > d.done {
			if !query || eventQuery(e.ev) != nil {
				return // not ready (or failed: Wait reports it)
			}
			d.done = e.seq
		}
		d.free = append(d.free, e.ev)
		d.pend = d.pend[1:]
	}
}

// Wait blocks until the event with handle e has completed (0: at once).
func (d *CUDA) Wait(e Event) error { return d.WaitFor(e, -1) }

// WaitFor is Wait bounded by timeout. With a bound it polls cuEventQuery,
// backing off from a microsecond to a millisecond, and returns ErrTimeout
// past it with the event still pending; without one (timeout < 0) it
// blocks in cuEventSynchronize. An event already known to be complete
// costs no driver call.
func (d *CUDA) WaitFor(e Event, timeout time.Duration) error {
	if e == 0 {
		return nil
	}
	h := uint64(e)
	d.evMu.Lock()
	if h > d.seq {
		d.evMu.Unlock()
		return fmt.Errorf("%w: event %d was never recorded (last %d)", ErrRange, h, d.seq)
	}
	if h <= d.done {
		d.evMu.Unlock()
		return nil
	}
	// h is pending: every handle in (done, seq] still has its entry; the
	// waiter count keeps it from being recycled while we wait.
	ent := &d.pend[h-d.pend[0].seq]
	ent.waiters++
	ev := ent.ev
	d.evMu.Unlock()

	var err error
	if timeout < 0 {
		if err = d.enter(); err == nil {
			err = eventSync(ev)
			d.leave()
		}
	} else {
		deadline := time.Now().Add(timeout)
		for pause := time.Microsecond; ; pause = min(2*pause, time.Millisecond) {
			if err = d.enter(); err == nil {
				err = eventQuery(ev)
				d.leave()
			}
			if err == nil || !isNotReady(err) {
				break
			}
			if !time.Now().Before(deadline) {
				err = fmt.Errorf("%w: event %d after %v", ErrTimeout, h, timeout)
				break
			}
			time.Sleep(pause)
		}
	}

	d.evMu.Lock()
	if len(d.pend) > 0 && h >= d.pend[0].seq { // (Close empties pend)
		d.pend[h-d.pend[0].seq].waiters--
	}
	if err == nil && h > d.done {
		d.done = h
	}
	d.reapLocked(false)
	d.evMu.Unlock()
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrTimeout):
		return err
	default:
		return fmt.Errorf("%w: wait for event %d: %w", ErrCopy, h, err)
	}
}

// Close waits for the stream to drain and releases the device's events,
// pool, stream and its reference to the primary context. Later calls fail

// CopyDtoHBatch is CopyDtoH(dst[i], src[i], 0) for every i, in stream
// order. When every destination lies in AllocHost memory, every source in
// device memory, and the driver has cuMemcpyBatchAsync (CUDA 12.8+), the
// copies go to the driver as one call (a decode-buffer flush is one copy
// per parked step and key: tens of calls of a few µs each otherwise);
// else they are issued one by one. Spans are checked before anything is
// issued.
func (d *CUDA) CopyDtoHBatch(dst [][]byte, src []Buffer) error {
	if len(dst) != len(src) {
		panic("gpu: CopyDtoHBatch: dst and src lengths differ")
	}
	batch := len(dst) > 1
	for i := range dst {
		if err := cspan(src[i], 0, len(dst[i])); err != nil {
			return err
		}
		batch = batch && src[i].Host == nil
	}
	if batch {
		batch = d.allPinned(dst)
	}
	if !batch || !d.canBatch {
		for i := range dst {
			if err := d.CopyDtoH(dst[i], src[i], 0); err != nil {
				return err
			}
		}
		return nil
	}
	if err := d.enter(); err != nil {
		return fmt.Errorf("%w: %w", ErrCopy, err)
	}
	defer d.leave()
	d.batchMu.Lock()
	defer d.batchMu.Unlock()
	d.bDst, d.bSrc, d.bSize = d.bDst[:0], d.bSrc[:0], d.bSize[:0]
	for i := range dst {
		p, from := dst[i], src[i].Ptr
		for len(p) > 0 {
			part := d.split(p)
			d.bDst = append(d.bDst, uint64(uintptr(hostPtr(part))))
			d.bSrc = append(d.bSrc, uint64(from))
			d.bSize = append(d.bSize, uint64(len(part)))
			p, from = p[len(part):], from+uintptr(len(part))
		}
	}
	if len(d.bDst) == 0 {
		return nil
	}
	if err := batchCopy(d.bDst, d.bSrc, d.bSize, streamPtr(d.stream)); err != nil {
		return fmt.Errorf("%w: cuMemcpyBatchAsync of %d copies: %w", ErrCopy, len(d.bDst), err)
	}
	d.batched.Add(int64(len(d.bDst)))
	return nil
}

// allPinned reports whether every non-empty dst lies inside one AllocHost
// allocation (a handful are live: the staging pages).
func (d *CUDA) allPinned(dst [][]byte) bool {
	d.memMu.Lock()
	defer d.memMu.Unlock()
	for _, p := range dst {
		if _, _, ok := d.pinnedLocked(p); len(p) > 0 && !ok {
			return false
		}
	}
	return true
}

// pinnedLocked finds the AllocHost allocation that holds all of p (a
// handful are live: the staging pages). Caller holds memMu.
func (d *CUDA) pinnedLocked(p []byte) (base uintptr, h pinned, ok bool) {
	lo := uintptr(hostPtr(p))
	hi := lo + uintptr(len(p))
	for base, h := range d.host {
		if lo >= base && hi <= base+uintptr(h.n) {
			return base, h, true
		}
	}
	return 0, pinned{}, false
}

// BatchedCopies is the number of copies issued through cuMemcpyBatchAsync
// so far (0: the driver lacks it, or no batch qualified).
func (d *CUDA) BatchedCopies() int64 { return d.batched.Load() }
