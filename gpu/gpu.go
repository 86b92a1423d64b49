// Package gpu is the device interface the cache core stages through: device
// buffers, asynchronous device→host copies into staging pages, completion
// events and allocation.
//
// Two implementations exist. Host (the default, always built) keeps "device"
// memory in ordinary Go memory and completes every copy before it returns;
// it is what the tests, the replay and engines without CUDA use. A CUDA
// driver API implementation (a cgo shim over cuda.h) is built with the `cuda` tag
// (see cuda.go); without the tag, NewCUDA returns ErrNoCUDA. The constant
// Available tells which build this is.
//
// Goroutines: a Device is used by the cache's engine goroutine (allocation,
// clones, Record), by its committer (the device→host copies of a step's
// rows, Record, Wait) and by readers (copies of rows still on the device);
// implementations must allow that. Buffers are plain values and carry no finalizers: whoever
// allocates one frees it.
package gpu

import (
	"errors"
	"fmt"
	"time"

	"github.com/omnicache/omnicache/internal/hostmem"
)

// Sentinel errors of the device layer.
var (
	// ErrNoCUDA is returned by NewCUDA in builds without the `cuda` tag.
	ErrNoCUDA = errors.New("gpu: built without the cuda tag")
	// ErrNoDevice is returned by NewCUDA in cuda builds when the driver
	// did not initialize (no GPU, no driver) or the device does not exist.
	ErrNoDevice = errors.New("gpu: no CUDA device")
	// ErrCopy reports a failed device copy (wrapped with the cause).
	ErrCopy = errors.New("gpu: device copy failed")
	// ErrAlloc reports a failed device or staging allocation.
	ErrAlloc = errors.New("gpu: allocation failed")
	// ErrRange reports an offset or length outside a buffer.
	ErrRange = errors.New("gpu: range outside buffer")
	// ErrTimeout reports a WaitFor whose event did not complete in time.
	ErrTimeout = errors.New("gpu: event did not complete in time")
)

// Buffer is a span of device memory. For the host device Host holds the
// bytes; for CUDA Ptr is the device address. Size is the length in bytes.
type Buffer struct {
	Ptr  uintptr
	Host []byte
	Size int
}

// IsZero reports whether b names no memory.
func (b Buffer) IsZero() bool { return b.Size == 0 && b.Host == nil && b.Ptr == 0 }

// Slice is the n bytes of b from offset off (a span inside b; the caller
// checks the bounds).
func (b Buffer) Slice(off, n int) Buffer {
	if b.Host != nil {
		return Buffer{Host: b.Host[off : off+n], Size: n}
	}
	return Buffer{Ptr: b.Ptr + uintptr(off), Size: n}
}

// HostBuffer wraps Go memory as a host-device Buffer.
func HostBuffer(p []byte) Buffer { return Buffer{Host: p, Size: len(p)} }

// Event marks a point in the device's stream; Wait blocks until every copy
// issued before the Record that made it has completed.
type Event uint64

// Device is what the cache needs from an accelerator.
type Device interface {
	// Name names the implementation ("host", "cuda").
	Name() string
	// Alloc returns n bytes of device memory (contents undefined).
	Alloc(n int) (Buffer, error)
	// Free returns memory from Alloc.
	Free(b Buffer)
	// AllocHost returns n bytes of host staging memory (pinned for CUDA).
	AllocHost(n int) ([]byte, error)
	// FreeHost returns memory from AllocHost.
	FreeHost(p []byte)
	// CopyDtoD copies n bytes device→device, asynchronously on the stream.
	CopyDtoD(dst Buffer, dstOff int, src Buffer, srcOff int, n int) error
	// CopyDtoH copies len(dst) bytes from src at srcOff into staging memory,
	// asynchronously on the stream.
	CopyDtoH(dst []byte, src Buffer, srcOff int) error
	// CopyHtoD copies host bytes into device memory, asynchronously.
	CopyHtoD(dst Buffer, dstOff int, src []byte) error
	// Check reports whether b names memory this device can copy b.Size
	// bytes from (ErrRange naming why not). It issues no copy: the cache
	// calls it on every device tensor handed to Save, so that a tensor
	// whose declared size exceeds its memory is a per-call error, not a
	// failed copy.
	Check(b Buffer) error
	// Record marks the stream's current end.
	Record() (Event, error)
	// Wait blocks until e has completed.
	Wait(e Event) error
	// WaitFor is Wait bounded by timeout (< 0: no bound): past it, it
	// returns ErrTimeout and e is still pending.
	WaitFor(e Event, timeout time.Duration) error
	// Close releases the device's own resources.
	Close() error
}

// BatchCopier is a Device that can issue many device→host copies at once
// (CUDA: one cuMemcpyBatchAsync). CopyDtoHBatch(dst, src) is
// CopyDtoH(dst[i], src[i], 0) for every i, in stream order, spans checked
// before anything is issued.
type BatchCopier interface {
	CopyDtoHBatch(dst [][]byte, src []Buffer) error
}

// HostRegistrar is a Device whose device→host copies run at the copy
// engine's rate only into host memory registered with its driver (CUDA:
// cuMemHostRegister, page-locked). RegisterHost registers p (memory the
// caller mapped and keeps mapped until UnregisterHost returns); a copy into
// memory not registered still lands, synchronously and slower.
// UnregisterHost undoes it once no copy into p is in flight.
// CopyDtoHRegistered is CopyDtoHBatch for destinations that each lie in
// one span registered with RegisterHost: issued as one batch where the
// driver has it, without looking the destinations up.
type HostRegistrar interface {
	RegisterHost(p []byte) error
	UnregisterHost(p []byte) error
	CopyDtoHRegistered(dst [][]byte, src []Buffer) error
}

// CopyDtoHAll issues dst[i] ← src[i] (from offset 0) for every i: in one
// batch when d is a BatchCopier, else one CopyDtoH each, stopping at the
// first error.
func CopyDtoHAll(d Device, dst [][]byte, src []Buffer) error {
	if b, ok := d.(BatchCopier); ok {
		return b.CopyDtoHBatch(dst, src)
	}
	for i := range dst {
		if err := d.CopyDtoH(dst[i], src[i], 0); err != nil {
			return err
		}
	}
	return nil
}

// CUDAOptions tune NewCUDAWith (cuda builds; see cuda.go).
type CUDAOptions struct {
	// SyncAlloc makes Alloc and Free call cuMemAlloc and cuMemFree instead
	// of allocating from the device's stream-ordered memory pool. cuMemFree
	// waits for the device to be idle.
	SyncAlloc bool
	// HostAlloc makes AllocHost pin staging memory with cuMemHostAlloc
	// instead of registering huge-page memory faulted in beforehand
	// (cuMemHostRegister; the default). cuMemHostAlloc faults and pins
	// 4 KiB pages inside the driver call.
	HostAlloc bool
}

// Host is the default device: "device" memory is Go memory and copies are
// synchronous memmoves, so events are complete when recorded.
type Host struct{}

// NewHost returns the host device.
func NewHost() *Host { return &Host{} }

func (*Host) Name() string { return "host" }

func (*Host) Alloc(n int) (Buffer, error) {
	if n < 0 {
		return Buffer{}, fmt.Errorf("%w: negative size %d", ErrAlloc, n)
	}
	return HostBuffer(make([]byte, n)), nil
}

func (*Host) Free(Buffer) {}

// AllocHost maps large staging buffers straight from the OS (zero,
// untouched, no clearing cost); FreeHost unmaps them.
func (*Host) AllocHost(n int) ([]byte, error) {
	if n < 0 {
		return nil, fmt.Errorf("%w: negative size %d", ErrAlloc, n)
	}
	b, err := hostmem.Alloc(n)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrAlloc, err)
	}
	return b, nil
}

func (*Host) FreeHost(p []byte) { hostmem.Free(p) }

func (*Host) CopyDtoD(dst Buffer, dstOff int, src Buffer, srcOff int, n int) error {
	if err := span(dst, dstOff, n); err != nil {
		return err
	}
	if err := span(src, srcOff, n); err != nil {
		return err
	}
	copy(dst.Host[dstOff:dstOff+n], src.Host[srcOff:srcOff+n])
	return nil
}

func (*Host) CopyDtoH(dst []byte, src Buffer, srcOff int) error {
	if err := span(src, srcOff, len(dst)); err != nil {
		return err
	}
	copy(dst, src.Host[srcOff:srcOff+len(dst)])
	return nil
}

func (*Host) CopyHtoD(dst Buffer, dstOff int, src []byte) error {
	if err := span(dst, dstOff, len(src)); err != nil {
		return err
	}
	copy(dst.Host[dstOff:], src)
	return nil
}

// Check: b must hold at least b.Size bytes of Go memory.
func (*Host) Check(b Buffer) error {
	if b.Host == nil && b.Size > 0 {
		return fmt.Errorf("%w: a buffer of %d bytes with no memory", ErrRange, b.Size)
	}
	if len(b.Host) < b.Size {
		return fmt.Errorf("%w: a buffer of %d bytes declares %d", ErrRange, len(b.Host), b.Size)
	}
	return nil
}

func (*Host) Record() (Event, error) { return 0, nil }
func (*Host) Wait(Event) error       { return nil }

// WaitFor returns at once: host copies are complete when they return.
func (*Host) WaitFor(Event, time.Duration) error { return nil }
func (*Host) Close() error                       { return nil }

func span(b Buffer, off, n int) error {
	if off < 0 || n < 0 || off+n > len(b.Host) {
		return fmt.Errorf("%w: [%d,%d) of %d bytes", ErrRange, off, off+n, len(b.Host))
	}
	return nil
}
