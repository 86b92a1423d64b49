package writer

import (
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/omnicache/omnicache/gpu"
)

// regDev wraps a device with gpu.HostRegistrar: it remembers what is
// registered, so that a test sees the mirror's chunks registered as they
// are made and unregistered at Close, and checks that every copy through
// CopyDtoHRegistered lands in registered memory. fail refuses every
// registration.
type regDev struct {
	gpu.Device
	mu       sync.Mutex
	reg      map[uintptr]int
	regCalls int
	copies   int // copies issued through CopyDtoHRegistered
	fail     bool
}

func newRegDev(d gpu.Device, fail bool) *regDev {
	return &regDev{Device: d, reg: map[uintptr]int{}, fail: fail}
}

func addr(p []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(p))) }

func (d *regDev) RegisterHost(p []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.regCalls++
	if d.fail {
		return gpu.ErrAlloc
	}
	d.reg[addr(p)] = len(p)
	return nil
}

func (d *regDev) UnregisterHost(p []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.reg, addr(p))
	return nil
}

func (d *regDev) CopyDtoHRegistered(dst [][]byte, src []gpu.Buffer) error {
	d.mu.Lock()
	for _, p := range dst {
		lo, in := addr(p), false
		for base, n := range d.reg {
			in = in || lo >= base && lo+uintptr(len(p)) <= base+uintptr(n)
		}
		if !in {
			d.mu.Unlock()
			panic("CopyDtoHRegistered into memory not registered")
		}
	}
	d.copies += len(dst)
	d.mu.Unlock()
	return gpu.CopyDtoHAll(d.Device, dst, src)
}

func (d *regDev) registered() (chunks, copies, calls int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.reg), d.copies, d.regCalls
}

func direct(c *Config) { c.Direct, c.DirectMinBytes = true, 1 }

// Direct writes (Config.Direct): a step's device rows land in the mirror
// exactly as the staging path puts them there, over steps that rewrite
// each other's slots, reject drafts and mix host and device keys, with
// writes queued behind a device that holds the committer back (older ones
// skip the slots newer ones replace). The device rows stay live until the
// step is consumed, every copy lands in a mirror chunk registered before
// it, and Close unregisters the chunks and frees everything.
func TestPathDirectWritesLandAtSlots(t *testing.T) {
	var rd *regDev
	f := newFixtureDev(t, true, direct, func(d gpu.Device) gpu.Device { rd = newRegDev(d, false); return rd })
	var refs []*Refs
	save := func(s *Step, direct bool) {
		t.Helper()
		r := f.mustSave(s)
		require.Equal(t, direct, r.Src[keyK].Direct, "direct write")
		refs = append(refs, r)
	}
	save(f.step([]kind{kDev, kDev, kOmit}, req{h: 0, slots: slotRange(0, 6)}, req{h: 1, slots: []int32{8, 9}}), true)
	save(f.step([]kind{kHost, kHost, kOmit}, req{h: 2, slots: slotRange(12, 3)}), false) // host rows only: staged
	f.sync()
	f.check()

	f.fault.Hang()                                                                            // the committer waits at the first write below (owned tensors: no Save waits for a clone)
	save(f.step([]kind{kOwnDev, kOwnDev, kOmit}, req{h: 2, slots: []int32{20, 3, 21}}), true) // rewrites slot 3
	save(f.step([]kind{kOwnDev, kOwnHost, kOmit}, req{h: 3, slots: slotRange(2, 4)}), true)   // rewrites 2..5, one key from the host
	s := f.step([]kind{kOwnDev, kOwnDev, kOmit}, req{h: 1, slots: []int32{9, 10, 30, 4}})
	s.Accepted = []int32{2} // the rows of 30 and 4 rejected
	save(s, true)
	f.fault.Release()
	f.sync()
	f.check()
	// The rejected rows at least (a write scans the queue for newer writes
	// before it issues its copies: those queued after that are not seen).
	require.GreaterOrEqual(t, (&f.p.st).Skipped.Load(), int64(2*2), "the rejected rows of both keys skipped")

	for i, r := range refs {
		if w := r.Src[keyK]; w.Direct {
			require.True(t, w.DevLive, "step %d: device rows live until the step is consumed", i)
		}
	}
	chunks, copies, _ := rd.registered()
	require.Positive(t, chunks, "mirror chunks registered")
	require.Positive(t, copies, "direct copies go through CopyDtoHRegistered")
	f.unpin(refs...)
	dev, _, _ := f.cd.live()
	require.Zero(t, dev, "device rows freed once every step is consumed")
	require.Zero(t, f.charged(), "their charge released")
	f.close()
	chunks, _, _ = rd.registered()
	require.Zero(t, chunks, "Close unregisters every chunk")
}

// A refused registration (a limit on locked memory) leaves direct writes
// exact: their copies go through the device's general path.
func TestPathDirectRegistrationRefused(t *testing.T) {
	var rd *regDev
	f := newFixtureDev(t, false, direct, func(d gpu.Device) gpu.Device { rd = newRegDev(d, true); return rd })
	r := f.mustSave(f.step([]kind{kDev, kDev, kOmit}, req{h: 0, slots: slotRange(0, 8)}))
	f.sync()
	f.check()
	_, copies, calls := rd.registered()
	require.Positive(t, calls, "registration tried")
	require.Zero(t, copies, "no copy takes the registered path")
	f.unpin(r)
}

// Below DirectMinBytes a step takes the staging path.
func TestPathDirectMinBytes(t *testing.T) {
	f := newFixture(t, false, func(c *Config) { c.Direct, c.DirectMinBytes = true, 4*24 })
	small := f.mustSave(f.step([]kind{kDev, kDev, kOmit}, req{h: 0, slots: slotRange(0, 3)})) // 3 rows of 24 bytes
	big := f.mustSave(f.step([]kind{kDev, kDev, kOmit}, req{h: 1, slots: slotRange(4, 4)}))
	require.False(t, small.Src[keyK].Direct)
	require.True(t, big.Src[keyK].Direct)
	f.sync()
	f.check()
	f.unpin(small, big)
}
