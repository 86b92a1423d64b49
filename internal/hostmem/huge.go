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
// get Map's memory (never the Go heap). Free it with Free.
func AllocHuge(n int) ([]byte, error) {
	if n < HugePage {
		return Map(n)
	}
	b, err := mapHuge(n)
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
