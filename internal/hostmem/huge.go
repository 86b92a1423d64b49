package hostmem

import (
	"sync"
	"unsafe"
)

// HugePage is the size and alignment of a transparent huge page (x86-64,
// arm64 with 4 KiB base pages).
const HugePage = 2 << 20

// AllocHuge is Alloc for memory written in large runs (mirror chunks): a
// request of at least HugePage bytes is mapped at a HugePage-aligned
// address and, on Linux, advised as a transparent huge page region
// (madvise(MADV_HUGEPAGE), honoured when
// /sys/kernel/mm/transparent_hugepage/enabled is "always" or "madvise").
// The first write into each 2 MiB then faults once instead of 512 times.
// Nothing is touched: RSS still grows only with what is written, by up to
// 2 MiB at a time. Smaller requests, other systems and a refused advice
// get Map's memory (never the Go heap); so does a request whose aligned
// mapping (HugePage bytes larger) the OS refused. A mapping the OS refuses
// is ErrNoMemory. Free it with Free.
func AllocHuge(n int) ([]byte, error) {
	if n < HugePage {
		return Map(n)
	}
	b, err := mapOS(n, mapHuge)
	if err != nil {
		return Map(n)
	}
	mappedHuge.Store(unsafe.Pointer(unsafe.SliceData(b)), len(b))
	return b, nil
}

// mappedHuge records the mappings AllocHuge made, by base address.
var mappedHuge sync.Map

// HugePages reports whether AllocHuge advises huge pages on this system
// (Linux); whether the kernel grants them is its policy.
const HugePages = hugePages

// Populate faults every page of b in for writing, so that later writes
// (and a driver pinning b) find it resident. On Linux it asks the kernel to
// do it in one call (madvise(MADV_POPULATE_WRITE), Linux 5.14+), which
// faults a huge-page region 2 MiB at a time; elsewhere, or when the kernel
// refuses, it rewrites one byte of every 4 KiB page. The cost is the kernel zeroing the pages: b must be memory
// nobody else writes yet.
//
// The kernel holds the process's mmap lock (shared) while it populates a
// range, and a thread that maps memory (the Go runtime growing its heap or
// a stack, a driver call) waits for it: Populate asks HugePage bytes at a
// time, so such a wait is one huge page's zeroing, not the whole buffer's.
func Populate(b []byte) {
	for len(b) > 0 {
		n := min(len(b), HugePage)
		if !populate(b[:n]) {
			touch(b)
			return
		}
		b = b[n:]
	}
}

// PopulateParallel is Populate split over up to workers goroutines, each
// faulting in its own HugePage-aligned share (page zeroing runs on as many
// cores; a 96 MiB staging page is tens of ms on one core of a VM). Shares
// are at least 16 MiB.
func PopulateParallel(b []byte, workers int) {
	const minShare = 16 << 20
	n := min(workers, len(b)/minShare)
	if n <= 1 {
		Populate(b)
		return
	}
	share := (len(b)/n + HugePage - 1) &^ (HugePage - 1)
	var wg sync.WaitGroup
	for lo := 0; lo < len(b); lo += share {
		part := b[lo:min(lo+share, len(b))]
		wg.Add(1)
		go func() {
			defer wg.Done()
			Populate(part)
		}()
	}
	wg.Wait()
}

// touch is Populate's portable path: a write of every 4 KiB page. It
// XORs each byte it writes with zeroByte (always 0: a variable, so that
// the compiler keeps the store), so written memory keeps its contents.
func touch(b []byte) {
	for i := 0; i < len(b); i += 4096 {
		b[i] ^= zeroByte
	}
	b[len(b)-1] ^= zeroByte
}

var zeroByte byte
