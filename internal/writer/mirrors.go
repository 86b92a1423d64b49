package writer

import (
	"sync/atomic"

	"github.com/omnicache/omnicache/mirror"
)

// Mirrors holds one lazily created host mirror per key: a key's mirror is
// made by the committer when the key first writes, so creating a cache
// costs nothing for the mirror's size.
type Mirrors struct {
	slots int
	rowB  []int
	m     []atomic.Pointer[mirror.Mirror]
}

// NewMirrors prepares (but does not create) the mirrors of keys with the
// given row sizes over numSlots slots.
func NewMirrors(numSlots int, rowBytes []int) *Mirrors {
	return &Mirrors{slots: numSlots, rowB: rowBytes, m: make([]atomic.Pointer[mirror.Mirror], len(rowBytes))}
}

// Get is key k's mirror, nil before its first write. Any goroutine.
func (ms *Mirrors) Get(k int) *mirror.Mirror { return ms.m[k].Load() }

// Make returns key k's mirror, creating it. Committer only.
func (ms *Mirrors) Make(k int) *mirror.Mirror {
	if m := ms.m[k].Load(); m != nil {
		return m
	}
	m, err := mirror.New(ms.slots, ms.rowB[k])
	if err != nil {
		panic(err) // sizes were validated by the cache's New
	}
	ms.m[k].Store(m)
	return m
}

// Free returns every mirror's memory to the OS (the cache is closed).
func (ms *Mirrors) Free() {
	for k := range ms.m {
		if m := ms.m[k].Swap(nil); m != nil {
			m.Free()
		}
	}
}

// ResidentBytes is the host memory backing every mirror.
func (ms *Mirrors) ResidentBytes() int64 {
	var n int64
	for k := range ms.m {
		if m := ms.m[k].Load(); m != nil {
			n += m.ResidentBytes()
		}
	}
	return n
}
