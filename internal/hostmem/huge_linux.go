//go:build linux

package hostmem

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

const hugePages = true

// mapHuge maps n bytes at a HugePage-aligned address (it maps n+HugePage
// and unmaps the unaligned head and the tail) and advises huge pages.
func mapHuge(n int) ([]byte, error) {
	raw, err := unix.MmapPtr(-1, 0, nil, uintptr(n+HugePage), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("hostmem: mmap of %d bytes: %w", n+HugePage, err)
	}
	base := uintptr(raw)
	head := (HugePage - base%HugePage) % HugePage
	if head > 0 {
		unix.MunmapPtr(raw, head) // cannot fail: a page-aligned part of a mapping
	}
	if tail := HugePage - head; tail > 0 {
		unix.MunmapPtr(unsafe.Add(raw, head+uintptr(n)), tail)
	}
	b := unsafe.Slice((*byte)(unsafe.Add(raw, head)), n)
	// Advice only: a kernel without THP (EINVAL) still maps the memory.
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	return b, nil
}

func unmapHuge(b []byte) error {
	if err := unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b))); err != nil {
		return fmt.Errorf("hostmem: munmap of %d bytes: %w", len(b), err)
	}
	return nil
}

// populate faults b in with madvise(MADV_POPULATE_WRITE); false when the
// kernel does not know the advice.
func populate(b []byte) bool { return unix.Madvise(b, unix.MADV_POPULATE_WRITE) == nil }

// release gives b's pages back to the OS (madvise(MADV_DONTNEED)): the
// mapping stays, and reads zeros until written again.
func release(b []byte) error {
	if err := unix.Madvise(b, unix.MADV_DONTNEED); err != nil {
		return fmt.Errorf("hostmem: madvise(MADV_DONTNEED) of %d bytes: %w", len(b), err)
	}
	return nil
}
