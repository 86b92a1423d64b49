package writer

import (
	"sync/atomic"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/mirror"
)

// Mirrors holds one lazily created host mirror per key: a key's mirror is
// made by the committer when the key first writes, so creating a cache
// costs nothing for the mirror's size.
//
// With a registrar (direct writes: Config.Direct on a gpu.HostRegistrar),
// every chunk a mirror makes is registered with the device before its rows
// are written, so that the device copies rows straight into it, and
// unregistered when the mirrors are freed.
type Mirrors struct {
	slots int
	rowB  []int
	m     []atomic.Pointer[mirror.Mirror]
	reg   gpu.HostRegistrar // nil: chunks are not registered
	// regFailed: a registration was refused (a limit on locked memory):
	// copies into the mirror then go through the device's general path,
	// which handles memory not registered. Committer only.
	regFailed bool
}

// NewMirrors prepares (but does not create) the mirrors of keys with the
// given row sizes over numSlots slots; reg, when not nil, registers their
// chunks.
func NewMirrors(numSlots int, rowBytes []int, reg gpu.HostRegistrar) *Mirrors {
	return &Mirrors{slots: numSlots, rowB: rowBytes, m: make([]atomic.Pointer[mirror.Mirror], len(rowBytes)), reg: reg}
}

// Registered reports whether every chunk made so far is registered with
// the device (copies into them may take gpu.HostRegistrar's fast path).
// Committer only.
func (ms *Mirrors) Registered() bool { return ms.reg != nil && !ms.regFailed }

// Get is key k's mirror, nil before its first write. Any goroutine.
func (ms *Mirrors) Get(k int) *mirror.Mirror { return ms.m[k].Load() }

// Make returns key k's mirror, creating it. Committer only.
func (ms *Mirrors) Make(k int) *mirror.Mirror {
	if m := ms.m[k].Load(); m != nil {
		return m
	}
	var h mirror.Hooks
	if ms.reg != nil {
		h.Made = func(b []byte) {
			if ms.reg.RegisterHost(b) != nil {
				ms.regFailed = true
			}
		}
		h.Freed = func(b []byte) { ms.reg.UnregisterHost(b) }
	}
	m, err := mirror.NewWithHooks(ms.slots, ms.rowB[k], h)
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
