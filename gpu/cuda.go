//go:build cuda

package gpu

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/omnicache/omnicache/internal/hostmem"
)

// Available reports whether this build has the CUDA device.
const Available = true

// CUDA is the CUDA driver API device, through a small cgo shim
// (cuda_driver.go, cuda_cgo.go, cuda_pinned.go).
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
//     then waits for the device to be idle). A pooled buffer Free gives
//     back is kept (up to 4 of a size, 1 GiB in all) and handed out again
//     by an Alloc of its size without a driver call; Close frees them.
//   - Free also accepts device memory allocated elsewhere with cuMemAlloc
//     (owned tensors an engine hands over); it frees it with cuMemFree.
//   - AllocHost returns page-locked (pinned, portable) host memory: mapped
//     2 MiB-aligned as transparent huge pages, faulted in outside the driver
//     and registered with cuMemHostRegister (CUDAOptions.HostAlloc, or a
//     refused registration: cuMemHostAlloc). FreeHost waits for the stream
//     to drain, then unregisters and unmaps (or frees) it.
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
	dev     cuDevice
	ctx     cuContext
	stream  cuStream
	pool    memPool
	usePool bool
	// hostAlloc: AllocHost pins with cuMemHostAlloc (CUDAOptions.HostAlloc).
	hostAlloc bool
	closed    atomic.Bool

	// Batched device→host copies (CopyDtoHBatch): canBatch when the driver
	// has cuMemcpyBatchAsync; the scratch arrays handed to it, under
	// batchMu.
	canBatch bool
	// nreg counts live pages registered in chunks (registerHuge).
	nreg              atomic.Int64
	batchMu           sync.Mutex
	bDst, bSrc, bSize []uint64
	batched           atomic.Int64 // copies issued in batches (BatchedCopies)

	memMu sync.Mutex
	mem   map[uintptr]devAlloc       // live device allocations (Alloc's)
	host  map[uintptr]pinned         // live pinned host allocations
	reg   map[uintptr]unsafe.Pointer // live RegisterHost spans by base address
	// spare keeps pooled buffers Free gave back, by size, for Alloc to
	// hand out again without a driver call (a step's clone costs the
	// engine goroutine two: cuCtxSetCurrent and the pool allocation;
	// BenchmarkStaging op=cache-staging runs that path). Every use of the
	// device's memory is issued
	// on its stream, so a reused buffer's next use runs after its last
	// one, as with the pool's own stream-ordered reuse. At most spareMax
	// buffers a size and spareMaxBytes in all (spareBytes is what is held);
	// Close frees them.
	spare      map[int][]uintptr
	spareBytes int64
	spareOff   bool // Close freed the spares: keep no more

	evMu sync.Mutex
	seq  uint64    // last event handle issued
	done uint64    // every handle <= done has completed
	pend []evEntry // recorded events not yet recycled, handles consecutive
	free []cuEvent
	// streamEv is the event WaitStream records on callers' streams (nil
	// until the first).
	streamEv cuEvent
}

// devAlloc is a live Alloc allocation: its size and whether it came from
// the pool.
type devAlloc struct {
	n      int
	pooled bool
}

// pinned is a live AllocHost allocation: its size and how it was pinned.
type pinned struct {
	n          int
	registered bool // cuMemHostRegister of hostmem memory; else cuMemHostAlloc
}

type evEntry struct {
	seq     uint64
	ev      cuEvent
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
	n, err := deviceCount()
	if err != nil {
		return nil, fmt.Errorf("%w: cuDeviceGetCount: %w", ErrNoDevice, err)
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("%w: device %d requested, %d present", ErrNoDevice, ordinal, n)
	}
	dev, err := deviceGet(ordinal)
	if err != nil {
		return nil, fmt.Errorf("%w: cuDeviceGet(%d): %w", ErrNoDevice, ordinal, err)
	}
	ctx, err := primaryRetain(dev)
	if err != nil {
		return nil, fmt.Errorf("%w: cuDevicePrimaryCtxRetain(%d): %w", ErrNoDevice, ordinal, err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	fail := func(what string, err error) (Device, error) {
		primaryRelease(dev)
		return nil, fmt.Errorf("%w: %s: %w", ErrAlloc, what, err)
	}
	if err := ctxSetCurrent(ctx); err != nil {
		return fail("cuCtxSetCurrent", err)
	}
	stream, err := streamCreate()
	if err != nil {
		return fail("cuStreamCreate", err)
	}
	d := &CUDA{
		ordinal:   ordinal,
		dev:       dev,
		ctx:       ctx,
		stream:    stream,
		mem:       make(map[uintptr]devAlloc),
		hostAlloc: opt.HostAlloc,
		host:      make(map[uintptr]pinned),
		reg:       make(map[uintptr]unsafe.Pointer),
	}
	d.canBatch = batchInit()
	if !opt.SyncAlloc && poolsSupported(ordinal) {
		if d.pool, err = poolCreate(ordinal); err != nil {
			streamDestroy(stream)
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
	if err := ctxSetCurrent(d.ctx); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("cuCtxSetCurrent: %w", err)
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
	if d.usePool && !d.closed.Load() {
		if p := d.takeSpare(n); p != 0 {
			return Buffer{Ptr: p, Size: n}, nil // no driver call
		}
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
		p, err = memAlloc(n)
	}
	if err != nil {
		return Buffer{}, fmt.Errorf("%w: %d device bytes: %w", ErrAlloc, n, err)
	}
	d.memMu.Lock()
	d.mem[p] = devAlloc{n: n, pooled: d.usePool}
	d.memMu.Unlock()
	return Buffer{Ptr: p, Size: n}, nil
}

// Bounds of the spare buffers (see CUDA.spare).
const (
	spareMax      = 4
	spareMaxBytes = 1 << 30
)

// takeSpare returns a spare buffer of n bytes, registered live, or 0.
func (d *CUDA) takeSpare(n int) uintptr {
	d.memMu.Lock()
	defer d.memMu.Unlock()
	l := d.spare[n]
	if len(l) == 0 {
		return 0
	}
	p := l[len(l)-1]
	d.spare[n] = l[:len(l)-1]
	d.spareBytes -= int64(n)
	d.mem[p] = devAlloc{n: n, pooled: true}
	return p
}

// keepSpare keeps pooled buffer p of n bytes for reuse, if the bounds
// allow; false: free it.
func (d *CUDA) keepSpare(p uintptr, n int) bool {
	d.memMu.Lock()
	defer d.memMu.Unlock()
	if d.spareOff {
		return false
	}
	if d.spare == nil {
		d.spare = make(map[int][]uintptr)
	}
	if len(d.spare[n]) >= spareMax || d.spareBytes+int64(n) > spareMaxBytes {
		return false
	}
	d.spare[n] = append(d.spare[n], p)
	d.spareBytes += int64(n)
	return true
}

func (d *CUDA) Free(b Buffer) {
	if b.Ptr == 0 {
		return
	}
	d.memMu.Lock()
	a, ours := d.mem[b.Ptr]
	delete(d.mem, b.Ptr)
	d.memMu.Unlock()
	if ours && a.pooled && !d.closed.Load() && d.keepSpare(b.Ptr, a.n) {
		return // no driver call
	}
	if d.enter() != nil {
		return // closed: the context's memory went with it
	}
	defer d.leave()
	if ours && a.pooled {
		freeAsync(b.Ptr, d.stream)
	} else {
		memFree(b.Ptr)
	}
}

func (d *CUDA) AllocHost(n int) ([]byte, error) {
	if n < 0 {
		return nil, fmt.Errorf("%w: negative size %d", ErrAlloc, n)
	}
	if n == 0 {
		return []byte{}, nil
	}
	if !d.hostAlloc {
		if p, ok := d.registerHuge(n); ok {
			return p, nil
		}
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
	d.host[uintptr(unsafe.Pointer(unsafe.SliceData(p)))] = pinned{n: n}
	d.memMu.Unlock()
	return p, nil
}

// regChunk is the size of one cuMemHostRegister call: a registration
// holds the driver's lock for its whole length (milliseconds for a page
// of tens of MiB: BenchmarkAllocHost), so a page registered in background
// while the engine
// issues copies is registered a chunk at a time, and the engine's calls
// wait for one chunk at most. Copies into or out of such a page are split
// at chunk boundaries (a copy stays inside one registration).
const regChunk = 8 << 20

// registerHuge pins n bytes the fast way: memory mapped 2 MiB-aligned and
// advised as transparent huge pages (hostmem.AllocHuge), faulted in by the
// kernel before the driver sees it (hostmem.PopulateParallel: the page
// zeroing runs on the machine's cores, outside any driver call, so no
// driver lock is held that the engine's copies would queue behind), then
// registered (cuMemHostRegister) regChunk bytes a call, which pins 2 MiB
// pages, not 4 KiB ones. false (nothing held) when the mapping or a
// registration is refused: AllocHost falls back to cuMemHostAlloc.
func (d *CUDA) registerHuge(n int) ([]byte, bool) {
	p, err := hostmem.AllocHuge(n)
	if err != nil || !hostmem.IsMapped(p) {
		return nil, false
	}
	hostmem.PopulateParallel(p, runtime.GOMAXPROCS(0))
	done := 0
	for done < n && err == nil {
		if err = d.enter(); err == nil {
			m := min(regChunk, n-done)
			if err = hostRegister(hostPtr(p[done:]), m); err == nil {
				done += m
			}
			d.leave()
		}
	}
	if err != nil {
		if d.enter() == nil {
			for off := 0; off < done; off += regChunk {
				hostUnregister(hostPtr(p[off:]))
			}
			d.leave()
		}
		hostmem.Free(p)
		return nil, false
	}
	d.memMu.Lock()
	d.host[uintptr(hostPtr(p))] = pinned{n: n, registered: true}
	d.memMu.Unlock()
	d.nreg.Add(1)
	return p, true
}

// chunked returns the end of the registration chunk that holds the first
// byte of p when p lies in a page registered in chunks and runs past that
// chunk, else 0: copies into or out of p are split there.
func (d *CUDA) chunked(p []byte) uintptr {
	if d.nreg.Load() == 0 {
		return 0
	}
	d.memMu.Lock()
	base, h, ok := d.pinnedLocked(p)
	d.memMu.Unlock()
	if !ok || !h.registered {
		return 0
	}
	lo := uintptr(hostPtr(p))
	if end := base + (lo-base)/regChunk*regChunk + regChunk; lo+uintptr(len(p)) > end {
		return end
	}
	return 0
}

// FreeHost frees memory from AllocHost (other slices are ignored) once the
// stream has drained, so no copy into it is still in flight.
func (d *CUDA) FreeHost(p []byte) {
	if cap(p) == 0 {
		return
	}
	base := unsafe.Pointer(unsafe.SliceData(p))
	d.memMu.Lock()
	h, ours := d.host[uintptr(base)]
	delete(d.host, uintptr(base))
	d.memMu.Unlock()
	if !ours || d.enter() != nil {
		return
	}
	defer d.leave()
	streamSync(d.stream)
	if !h.registered {
		hostFree(base)
		return
	}
	ok := true
	for off := 0; off < h.n; off += regChunk {
		ok = hostUnregister(unsafe.Add(base, off)) == nil && ok
	}
	if ok {
		hostmem.Free(unsafe.Slice((*byte)(base), h.n))
	}
	d.nreg.Add(-1)
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
	// A buffer at the base of an allocation this device made and within
	// its size needs no driver call (Save checks every device tensor of
	// every step; a decode step's tensors are the engine's own buffers).
	d.memMu.Lock()
	a, ours := d.mem[b.Ptr]
	d.memMu.Unlock()
	if ours && b.Size <= a.n {
		return nil
	}
	if err := d.enter(); err != nil {
		return fmt.Errorf("%w: %w", ErrRange, err)
	}
	defer d.leave()
	base, size, err := addressRange(b.Ptr)
	if err != nil {
		return fmt.Errorf("%w: 0x%x is no device allocation: cuMemGetAddressRange: %w", ErrRange, b.Ptr, err)
	}
	if end := uintptr(base) + uintptr(size); b.Ptr+uintptr(b.Size) > end {
		return fmt.Errorf("%w: [0x%x,+%d) runs %d bytes past its allocation", ErrRange, b.Ptr, b.Size, b.Ptr+uintptr(b.Size)-end)
	}
	return nil
}

// (Free and FreeHost do nothing).
func (d *CUDA) Close() error {
	if d.closed.Load() {
		return nil
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := ctxSetCurrent(d.ctx); err != nil {
		d.closed.Store(true)
		return fmt.Errorf("gpu: close: cuCtxSetCurrent: %w", err)
	}
	d.closed.Store(true)
	var errs []error
	if err := streamSync(d.stream); err != nil {
		errs = append(errs, fmt.Errorf("cuStreamSynchronize: %w", err))
	}
	d.evMu.Lock()
	for _, e := range d.pend {
		d.free = append(d.free, e.ev)
	}
	d.pend = nil
	for _, ev := range d.free {
		eventDestroy(ev)
	}
	d.free = nil
	if d.streamEv != nil {
		eventDestroy(d.streamEv)
		d.streamEv = nil
	}
	d.evMu.Unlock()
	d.memMu.Lock()
	for _, l := range d.spare {
		for _, p := range l {
			freeAsync(p, d.stream)
		}
	}
	d.spare, d.spareBytes, d.spareOff = nil, 0, true
	for _, p := range d.reg {
		hostUnregister(p) // still mapped by its owner, who unregisters no more
	}
	clear(d.reg)
	d.memMu.Unlock()
	if d.usePool {
		if err := d.pool.destroy(); err != nil {
			errs = append(errs, fmt.Errorf("cuMemPoolDestroy: %w", err))
		}
	}
	if err := streamDestroy(d.stream); err != nil {
		errs = append(errs, fmt.Errorf("cuStreamDestroy: %w", err))
	}
	if err := primaryRelease(d.dev); err != nil {
		errs = append(errs, fmt.Errorf("cuDevicePrimaryCtxRelease: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("gpu: close: %w", err)
	}
	return nil
}
