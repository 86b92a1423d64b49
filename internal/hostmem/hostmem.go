// Package hostmem hands out large host buffers straight from the operating
// system: anonymous mappings are zero and untouched, so allocating one costs
// the same whatever its size and RSS grows only with the pages written.
// Go's make cannot promise that: a large make that reuses freed heap memory
// clears all of it first, which for a mirror-sized table is milliseconds on
// the engine's first request.
//
// Memory from Alloc is invisible to the garbage collector: it must hold no
// Go pointers, and whoever allocates it calls Free exactly once.
package hostmem

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Threshold is the size from which Alloc maps memory; smaller requests use
// make (and Free leaves them to the collector).
const Threshold = 1 << 20

// ErrNoMemory is the error of a mapping the OS refused (an address-space
// limit such as ulimit -v, or no memory left): Alloc, Map and AllocHuge
// return it (wrapping the system's error) rather than fall back to the Go
// heap, where an allocation the OS refuses is a fatal error of the
// runtime, not an error.
var ErrNoMemory = errors.New("hostmem: the OS refused the mapping")

// mapped records the mappings Alloc made, by base address, so that Free
// never unmaps memory it did not map (a foreign slice).
var mapped sync.Map

// refuseFrom, when positive, makes every mapping of at least that many
// bytes fail as the OS refusing it would (RefuseFrom).
var refuseFrom atomic.Int64

// RefuseFrom makes every later mapping of at least n bytes fail with
// ErrNoMemory, as an address-space limit would (n <= 0: none), until the
// returned function undoes it. For tests of the callers' error paths.
func RefuseFrom(n int) (undo func()) {
	old := refuseFrom.Swap(int64(n))
	return func() { refuseFrom.Store(old) }
}

// mapOS maps n bytes with map (mapAnon or mapHuge), or fails as the OS
// refusing it (RefuseFrom); its error wraps ErrNoMemory.
func mapOS(n int, mapFn func(int) ([]byte, error)) ([]byte, error) {
	if r := refuseFrom.Load(); r > 0 && int64(n) >= r {
		return nil, fmt.Errorf("%w: %d bytes: refused (RefuseFrom)", ErrNoMemory, n)
	}
	b, err := mapFn(n)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoMemory, err)
	}
	return b, nil
}

// Alloc returns n zero bytes: from make below Threshold, else mapped from
// the OS. A mapping the OS refuses is ErrNoMemory.
func Alloc(n int) ([]byte, error) {
	if n < Threshold {
		return make([]byte, n), nil
	}
	return Map(n)
}

// Map is Alloc without the threshold: n zero bytes mapped from the OS
// whatever n (a page at least), outside the Go heap. The host mirror's
// chunks use it: readers may copy rows while the committer overwrites them
// for a newer tenant (the copy is then discarded by the read protocol's
// owner/epoch check), which must not be Go heap memory that the collector
// or the race detector treats as Go data. A mapping the OS refuses is
// ErrNoMemory.
func Map(n int) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	b, err := mapOS(n, mapAnon)
	if err != nil {
		return nil, err
	}
	mapped.Store(unsafe.Pointer(unsafe.SliceData(b)), len(b))
	return b, nil
}

// IsMapped reports whether b starts a mapping that Alloc, Map or AllocHuge
// made (not a small Alloc from make, nor a foreign slice).
func IsMapped(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	if _, ok := mappedHuge.Load(p); ok {
		return true
	}
	_, ok := mapped.Load(p)
	return ok
}

// Free returns memory from Alloc or Map. b must be exactly the slice they
// returned (same pointer and length); memory they did not map is left to
// the collector.
func Free(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	if n, ok := mappedHuge.Load(p); ok && n.(int) == len(b) {
		mappedHuge.Delete(p)
		return unmapHuge(b)
	}
	if n, ok := mapped.Load(p); !ok || n.(int) != len(b) {
		return nil
	}
	mapped.Delete(p)
	return unmap(b)
}

// Release gives the pages of b, a part of the mapping m that Map or
// AllocHuge returned, back to the OS while keeping the mapping (on Linux:
// madvise(MADV_DONTNEED); elsewhere it does nothing): b then reads as zeros
// until written again, and is faulted in afresh. Only whole
// pages inside b are given back. It does nothing when m is not such a
// mapping (memory from the Go heap: a small Alloc, or another system) or b
// is not inside it. Like an unmap it interrupts every CPU the process runs
// on (a TLB shootdown): for rare trims, not a steady path.
func Release(m, b []byte) error {
	if len(b) == 0 || !IsMapped(m) {
		return nil
	}
	lo, hi := uintptr(unsafe.Pointer(unsafe.SliceData(m))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if hi < lo || hi-lo+uintptr(len(b)) > uintptr(len(m)) {
		return nil
	}
	ps := uintptr(os.Getpagesize())
	start, end := (hi+ps-1)&^(ps-1), (hi+uintptr(len(b)))&^(ps-1)
	if end <= start {
		return nil
	}
	off := int(start - lo)
	return release(m[off : off+int(end-start)])
}

// Uint64s returns n zero uint64s (see Alloc); free them with FreeUint64s.
func Uint64s(n int) ([]uint64, error) {
	b, err := Alloc(n * 8)
	if err != nil || n == 0 {
		return nil, err
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), n), nil
}

// FreeUint64s frees memory from Uint64s.
func FreeUint64s(s []uint64) error {
	if len(s) == 0 {
		return nil
	}
	return Free(unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*8))
}

// Uint32s returns n zero uint32s (see Alloc); free them with FreeUint32s.
func Uint32s(n int) ([]uint32, error) {
	b, err := Alloc(n * 4)
	if err != nil || n == 0 {
		return nil, err
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(&b[0])), n), nil
}

// FreeUint32s frees memory from Uint32s.
func FreeUint32s(s []uint32) error {
	if len(s) == 0 {
		return nil
	}
	return Free(unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*4))
}
