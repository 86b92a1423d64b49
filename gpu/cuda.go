//go:build cuda

package gpu

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"gorgonia.org/cu"
)

// Available reports whether this build has the CUDA device.
const Available = true

// CUDA is the CUDA driver API device (gorgonia.org/cu plus a small cgo shim
// for pinned host memory and the memory pool).
//
// It retains the device's primary context and owns one non-blocking stream:
// every copy, allocation from the pool and event record is issued on that
// stream, so they execute in the order they were issued. Contexts are
// current per OS thread: every method locks its goroutine to its thread and
// makes the context current for the duration of the call, so any goroutine
// may call any method, concurrently (the CUDA driver API is thread-safe).
//
// Memory:
//   - Alloc takes device memory from a private stream-ordered pool
//     (cuMemAllocFromPoolAsync on the device's stream; Free is
//     cuMemFreeAsync), so neither allocates nor frees synchronously
//     and a free never waits for the device. The memory is ordered on the
//     device's stream: work on another stream must synchronize with an
//     event first. With CUDAOptions.SyncAlloc, or on a device without
//     memory pools, Alloc and Free are cuMemAlloc and cuMemFree (a free
//     then waits for the device to be idle).
//   - Free also accepts device memory allocated elsewhere with cuMemAlloc
//     (owned tensors an engine hands over); it frees it with cuMemFree.
//   - AllocHost returns page-locked (pinned, portable) host memory from
//     cuMemHostAlloc; FreeHost waits for the stream to drain, then frees it.
//   - A Buffer whose Host field is set is host memory used as a device
//     buffer (the cache does that for owned host tensors of deferred keys):
//     copies from or into it run on the host after the stream drained.
//
// Copies: CopyDtoH into pinned memory is asynchronous: the bytes are there
// once an event recorded after it completed. Into pageable (ordinary Go)
// memory the driver completes the copy before the call returns. CopyHtoD
// from pageable memory returns once the driver staged the source (the
// caller may reuse it); from pinned memory the source must stay unchanged
// until an event recorded after the copy completed.
//
// Events: Record records a pooled CUevent (timing disabled) on the stream
// and returns a handle (a sequence number, 1, 2, ...); Wait(0) returns at
// once; Wait of an older handle whose CUevent was recycled returns at once
// too (events complete in stream order, and a CUevent is recycled only once
// it completed and nobody waits on it).
//
// Close releases the stream, the pool, the events and the context; free
// every buffer and host slice before it.
type CUDA struct {
	ordinal int
	dev     cu.Device
	ctx     cu.CUContext
	stream  cu.Stream
	pool    memPool
	usePool bool
	closed  atomic.Bool

	memMu sync.Mutex
	mem   map[uintptr]bool // live device allocations: true when from the pool
	host  map[uintptr]int  // live pinned host allocations and their sizes

	evMu sync.Mutex
	seq  uint64    // last event handle issued
	done uint64    // every handle <= done has completed
	pend []evEntry // recorded events not yet recycled, handles consecutive
	free []cu.Event
}

type evEntry struct {
	seq     uint64
	ev      cu.Event
	waiters int
}

var errClosed = errors.New("device closed")

// NewCUDA opens device ordinal with the default options.
func NewCUDA(ordinal int) (Device, error) { return NewCUDAWith(ordinal, CUDAOptions{}) }

// NewCUDAWith opens device ordinal: it retains its primary context and
// creates the device's stream and (unless SyncAlloc) its memory pool. It
// fails with ErrNoDevice when the driver did not initialize (no GPU, no
// driver) or there is no such device.
func NewCUDAWith(ordinal int, opt CUDAOptions) (Device, error) {
	if err := initStatus(); err != nil {
		return nil, fmt.Errorf("%w: cuInit: %w", ErrNoDevice, err)
	}
	n, err := cu.NumDevices()
	if err != nil {
		return nil, fmt.Errorf("%w: cuDeviceGetCount: %w", ErrNoDevice, cuErr(err))
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("%w: device %d requested, %d present", ErrNoDevice, ordinal, n)
	}
	dev, err := cu.GetDevice(ordinal)
	if err != nil {
		return nil, fmt.Errorf("%w: cuDeviceGet(%d): %w", ErrNoDevice, ordinal, cuErr(err))
	}
	ctx, err := dev.RetainPrimaryCtx()
	if err != nil {
		return nil, fmt.Errorf("%w: cuDevicePrimaryCtxRetain(%d): %w", ErrNoDevice, ordinal, cuErr(err))
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	fail := func(what string, err error) (Device, error) {
		dev.ReleasePrimaryCtx()
		return nil, fmt.Errorf("%w: %s: %w", ErrAlloc, what, cuErr(err))
	}
	if err := cu.SetCurrentContext(ctx); err != nil {
		return fail("cuCtxSetCurrent", err)
	}
	stream, err := cu.MakeStream(cu.NonBlocking)
	if err != nil {
		return fail("cuStreamCreate", err)
	}
	d := &CUDA{
		ordinal: ordinal,
		dev:     dev,
		ctx:     ctx,
		stream:  stream,
		mem:     make(map[uintptr]bool),
		host:    make(map[uintptr]int),
	}
	if !opt.SyncAlloc && poolsSupported(ordinal) {
		if d.pool, err = poolCreate(ordinal); err != nil {
			stream.Destroy()
			return fail("cuMemPoolCreate", err)
		}
		d.usePool = true
	}
	return d, nil
}

// enter locks the calling goroutine to its OS thread and makes the context
// current on it; leave undoes the lock. Every method that calls the driver
// brackets the calls with them.
func (d *CUDA) enter() error {
	if d.closed.Load() {
		return errClosed
	}
	runtime.LockOSThread()
	if err := cu.SetCurrentContext(d.ctx); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("cuCtxSetCurrent: %w", cuErr(err))
	}
	return nil
}

func (d *CUDA) leave() { runtime.UnlockOSThread() }

// Name is "cuda".
func (d *CUDA) Name() string { return "cuda" }

// AllocMode names how Alloc gets memory: "pool" (stream-ordered) or
// "memalloc" (cuMemAlloc).
func (d *CUDA) AllocMode() string {
	if d.usePool {
		return "pool"
	}
	return "memalloc"
}

// Ordinal is the device's ordinal.
func (d *CUDA) Ordinal() int { return d.ordinal }

func (d *CUDA) Alloc(n int) (Buffer, error) {
	if n < 0 {
		return Buffer{}, fmt.Errorf("%w: negative size %d", ErrAlloc, n)
	}
	if n == 0 {
		return Buffer{}, nil
	}
	if err := d.enter(); err != nil {
		return Buffer{}, fmt.Errorf("%w: %d device bytes: %w", ErrAlloc, n, err)
	}
	defer d.leave()
	var p uintptr
	var err error
	if d.usePool {
		p, err = d.pool.alloc(n, d.stream)
	} else {
		var dp cu.DevicePtr
		dp, err = cu.MemAlloc(int64(n))
		p, err = uintptr(dp), cuErr(err)
	}
	if err != nil {
		return Buffer{}, fmt.Errorf("%w: %d device bytes: %w", ErrAlloc, n, err)
	}
	d.memMu.Lock()
	d.mem[p] = d.usePool
	d.memMu.Unlock()
	return Buffer{Ptr: p, Size: n}, nil
}

func (d *CUDA) Free(b Buffer) {
	if b.Ptr == 0 {
		return
	}
	d.memMu.Lock()
	pooled, ours := d.mem[b.Ptr]
	delete(d.mem, b.Ptr)
	d.memMu.Unlock()
	if d.enter() != nil {
		return // closed: the context's memory went with it
	}
	defer d.leave()
	if ours && pooled {
		freeAsync(b.Ptr, d.stream)
	} else {
		cu.MemFree(cu.DevicePtr(b.Ptr))
	}
}

func (d *CUDA) AllocHost(n int) ([]byte, error) {
	if n < 0 {
		return nil, fmt.Errorf("%w: negative size %d", ErrAlloc, n)
	}
	if n == 0 {
		return []byte{}, nil
	}
	if err := d.enter(); err != nil {
		return nil, fmt.Errorf("%w: %d pinned bytes: %w", ErrAlloc, n, err)
	}
	defer d.leave()
	p, err := hostAlloc(n)
	if err != nil {
		return nil, fmt.Errorf("%w: cuMemHostAlloc of %d bytes: %w", ErrAlloc, n, err)
	}
	d.memMu.Lock()
	d.host[uintptr(unsafe.Pointer(unsafe.SliceData(p)))] = n
	d.memMu.Unlock()
	return p, nil
}

// FreeHost frees memory from AllocHost (other slices are ignored) once the
// stream has drained, so no copy into it is still in flight.
func (d *CUDA) FreeHost(p []byte) {
	if cap(p) == 0 {
		return
	}
	base := unsafe.Pointer(unsafe.SliceData(p))
	d.memMu.Lock()
	_, ours := d.host[uintptr(base)]
	delete(d.host, uintptr(base))
	d.memMu.Unlock()
	if !ours || d.enter() != nil {
		return
	}
	defer d.leave()
	d.stream.Synchronize()
	hostFree(base)
}

// IsPinned reports whether p starts in page-locked host memory the driver
// knows (cuMemHostGetFlags succeeds), as AllocHost's memory does.
func (d *CUDA) IsPinned(p []byte) bool {
	if cap(p) == 0 || d.enter() != nil {
		return false
	}
	defer d.leave()
	return hostPinned(unsafe.Pointer(unsafe.SliceData(p)))
}

// cspan checks [off, off+n) against b (its Host bytes when set, else Size).
func cspan(b Buffer, off, n int) error {
	size := b.Size
	if b.Host != nil {
		size = len(b.Host)
	} else if b.Ptr == 0 && n > 0 {
		return fmt.Errorf("%w: [%d,%d) of a buffer with no memory", ErrRange, off, off+n)
	}
	if off < 0 || n < 0 || off > size || n > size-off {
		return fmt.Errorf("%w: [%d,%d) of %d bytes", ErrRange, off, off+n, size)
	}
	return nil
}

// Check: a host-backed buffer must hold b.Size bytes; a device buffer's
// [Ptr, Ptr+Size) must lie inside one allocation (cuMemGetAddressRange).
func (d *CUDA) Check(b Buffer) error {
	if b.Host != nil || b.Size == 0 {
		return NewHost().Check(b)
	}
	if b.Ptr == 0 {
		return fmt.Errorf("%w: a buffer of %d bytes with no memory", ErrRange, b.Size)
	}
	if err := d.enter(); err != nil {
		return fmt.Errorf("%w: %w", ErrRange, err)
	}
	defer d.leave()
	size, base, err := cu.DevicePtr(b.Ptr).AddressRange()
	if err != nil {
		return fmt.Errorf("%w: 0x%x is no device allocation: cuMemGetAddressRange: %w", ErrRange, b.Ptr, cuErr(err))
	}
	if end := uintptr(base) + uintptr(size); b.Ptr+uintptr(b.Size) > end {
		return fmt.Errorf("%w: [0x%x,+%d) runs %d bytes past its allocation", ErrRange, b.Ptr, b.Size, b.Ptr+uintptr(b.Size)-end)
	}
	return nil
}

func devPtr(b Buffer, off int) cu.DevicePtr { return cu.DevicePtr(b.Ptr + uintptr(off)) }

func hostPtr(p []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(p)) }

// hostCopy copies between host memory once the stream has drained (host
// memory used as a Buffer).
func (d *CUDA) hostCopy(dst, src []byte) error {
	if err := d.enter(); err != nil {
		return fmt.Errorf("%w: %w", ErrCopy, err)
	}
	defer d.leave()
	if err := d.stream.Synchronize(); err != nil {
		return fmt.Errorf("%w: cuStreamSynchronize: %w", ErrCopy, cuErr(err))
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
		op, err = "cuMemcpyHtoDAsync", cu.MemcpyHtoDAsync(devPtr(dst, dstOff), hostPtr(src.Host[srcOff:]), int64(n), d.stream)
	case dst.Host != nil:
		op, err = "cuMemcpyDtoHAsync", cu.MemcpyDtoHAsync(hostPtr(dst.Host[dstOff:]), devPtr(src, srcOff), int64(n), d.stream)
	default:
		op, err = "cuMemcpyDtoDAsync", cu.MemcpyDtoDAsync(devPtr(dst, dstOff), devPtr(src, srcOff), int64(n), d.stream)
	}
	if err != nil {
		return fmt.Errorf("%w: %s of %d bytes: %w", ErrCopy, op, n, cuErr(err))
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
	if err := cu.MemcpyDtoHAsync(hostPtr(dst), devPtr(src, srcOff), int64(n), d.stream); err != nil {
		return fmt.Errorf("%w: cuMemcpyDtoHAsync of %d bytes: %w", ErrCopy, n, cuErr(err))
	}
	return nil
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
	if err := cu.MemcpyHtoDAsync(devPtr(dst, dstOff), hostPtr(src), int64(n), d.stream); err != nil {
		return fmt.Errorf("%w: cuMemcpyHtoDAsync of %d bytes: %w", ErrCopy, n, cuErr(err))
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
	var ev cu.Event
	if k := len(d.free); k > 0 {
		ev = d.free[k-1]
		d.free = d.free[:k-1]
	} else {
		var err error
		if ev, err = cu.MakeEvent(cu.DisableTiming); err != nil {
			return 0, fmt.Errorf("%w: cuEventCreate: %w", ErrCopy, cuErr(err))
		}
	}
	if err := ev.Record(d.stream); err != nil {
		d.free = append(d.free, ev)
		return 0, fmt.Errorf("%w: cuEventRecord: %w", ErrCopy, cuErr(err))
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
			if !query || e.ev.Query() != nil {
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
			err = ev.Synchronize()
			d.leave()
		}
	} else {
		deadline := time.Now().Add(timeout)
		for pause := time.Microsecond; ; pause = min(2*pause, time.Millisecond) {
			if err = d.enter(); err == nil {
				err = ev.Query()
				d.leave()
			}
			if err == nil || !errors.Is(err, cu.NotReady) {
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
		return fmt.Errorf("%w: wait for event %d: %w", ErrCopy, h, cuErr(err))
	}
}

// Close waits for the stream to drain and releases the device's events,
// pool, stream and its reference to the primary context. Later calls fail
// (Free and FreeHost do nothing).
func (d *CUDA) Close() error {
	if d.closed.Load() {
		return nil
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cu.SetCurrentContext(d.ctx); err != nil {
		d.closed.Store(true)
		return fmt.Errorf("gpu: close: cuCtxSetCurrent: %w", cuErr(err))
	}
	d.closed.Store(true)
	var errs []error
	if err := d.stream.Synchronize(); err != nil {
		errs = append(errs, fmt.Errorf("cuStreamSynchronize: %w", cuErr(err)))
	}
	d.evMu.Lock()
	for _, e := range d.pend {
		d.free = append(d.free, e.ev)
	}
	d.pend = nil
	for i := range d.free {
		cu.DestroyEvent(&d.free[i])
	}
	d.free = nil
	d.evMu.Unlock()
	if d.usePool {
		if err := d.pool.destroy(); err != nil {
			errs = append(errs, fmt.Errorf("cuMemPoolDestroy: %w", err))
		}
	}
	if err := d.stream.Destroy(); err != nil {
		errs = append(errs, fmt.Errorf("cuStreamDestroy: %w", cuErr(err)))
	}
	if err := d.dev.ReleasePrimaryCtx(); err != nil {
		errs = append(errs, fmt.Errorf("cuDevicePrimaryCtxRelease: %w", cuErr(err)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("gpu: close: %w", err)
	}
	return nil
}
