package replay

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/omnicache/omnicache"
	"github.com/omnicache/omnicache/gpu"
)

// The replay on a device. Options.Device is the device the cache stages
// through; the replay wraps it in a meteredDevice that counts what the
// cache asks of it. With Options.DeviceOutputs the simulated forward's
// outputs live in that device's memory (deviceOutputs): a ring of buffers
// allocated once per run, filled on the device before Save, and in owned
// mode handed to the cache and taken back when the cache frees them
// through the device, as an engine's allocator would. With the host device
// (gpu.NewHost, whose device buffers are Go memory) the same path runs
// without a GPU, so the host tests cover it.

// meteredDevice wraps the run's device. It counts device→host bytes,
// pinned (AllocHost) bytes and the time spent in Wait and WaitFor (the
// cache waiting for its device→host copies into staging pages: the engine
// goroutine's join in Save and the committer before it scatters), and it
// takes back the replay's own output buffers when the cache frees them.
// Every method may be called from any goroutine, as Device's.
type meteredDevice struct {
	gpu.Device
	outs *deviceOutputs // nil: no output buffers to take back

	dtoh   atomic.Int64
	waitNs atomic.Int64
	waits  atomic.Int64
	pinned atomic.Int64
}

func (m *meteredDevice) CopyDtoH(dst []byte, src gpu.Buffer, srcOff int) error {
	err := m.Device.CopyDtoH(dst, src, srcOff)
	if err == nil {
		m.dtoh.Add(int64(len(dst)))
	}
	return err
}

// CopyDtoHBatch forwards a batch (one driver call on CUDA) and counts its
// bytes.
func (m *meteredDevice) CopyDtoHBatch(dst [][]byte, src []gpu.Buffer) error {
	err := gpu.CopyDtoHAll(m.Device, dst, src)
	if err == nil {
		for _, p := range dst {
			m.dtoh.Add(int64(len(p)))
		}
	}
	return err
}

// RegisterHost and UnregisterHost forward to a device that registers host
// memory (gpu.HostRegistrar: CUDA), so that the cache's mirror chunks are
// registered under MirrorDirect; on another device registration is
// refused and the cache copies through the general path.
func (m *meteredDevice) RegisterHost(p []byte) error {
	if r, ok := m.Device.(gpu.HostRegistrar); ok {
		return r.RegisterHost(p)
	}
	return errNoRegistrar
}

func (m *meteredDevice) UnregisterHost(p []byte) error {
	if r, ok := m.Device.(gpu.HostRegistrar); ok {
		return r.UnregisterHost(p)
	}
	return nil
}

// CopyDtoHRegistered forwards copies into registered memory and counts
// their bytes.
func (m *meteredDevice) CopyDtoHRegistered(dst [][]byte, src []gpu.Buffer) error {
	var err error
	if r, ok := m.Device.(gpu.HostRegistrar); ok {
		err = r.CopyDtoHRegistered(dst, src)
	} else {
		err = gpu.CopyDtoHAll(m.Device, dst, src)
	}
	if err == nil {
		for _, p := range dst {
			m.dtoh.Add(int64(len(p)))
		}
	}
	return err
}

var errNoRegistrar = errors.New("replay: the device does not register host memory")

// Wait times waits for events that may be pending (the host device's
// events are complete when recorded and are handle 0).
func (m *meteredDevice) Wait(e gpu.Event) error {
	if e == 0 {
		return m.Device.Wait(e)
	}
	t := time.Now()
	err := m.Device.Wait(e)
	m.waitNs.Add(time.Since(t).Nanoseconds())
	m.waits.Add(1)
	return err
}

// WaitFor is Wait bounded by a timeout (the cache's engine-side joins and
// reads), timed as Wait.
func (m *meteredDevice) WaitFor(e gpu.Event, timeout time.Duration) error {
	if e == 0 {
		return m.Device.WaitFor(e, timeout)
	}
	t := time.Now()
	err := m.Device.WaitFor(e, timeout)
	m.waitNs.Add(time.Since(t).Nanoseconds())
	m.waits.Add(1)
	return err
}

func (m *meteredDevice) AllocHost(n int) ([]byte, error) {
	p, err := m.Device.AllocHost(n)
	if err == nil {
		m.pinned.Add(int64(n))
	}
	return p, err
}

// Free takes back the replay's output buffers (owned tensors the cache is
// done with) and frees anything else.
func (m *meteredDevice) Free(b gpu.Buffer) {
	if m.outs != nil && m.outs.put(b) {
		return
	}
	m.Device.Free(b)
}

// deviceName names a device for the report: its Name, with the ordinal
// when it has one ("cuda:0").
func deviceName(d gpu.Device) string {
	if o, ok := d.(interface{ Ordinal() int }); ok {
		return fmt.Sprintf("%s:%d", d.Name(), o.Ordinal())
	}
	return d.Name()
}

// bufAddr identifies a buffer by its memory: the device address, or the
// first byte of host memory used as device memory.
func bufAddr(b gpu.Buffer) uintptr {
	if b.Host != nil {
		return uintptr(unsafe.Pointer(unsafe.SliceData(b.Host)))
	}
	return b.Ptr
}

// deviceOutputs are the simulated forward's output tensors in device
// memory, one buffer per key of capacity maxTokens rows.
//
// Owned mode: each step takes one free buffer per key and hands it to the
// cache (Owned); the cache frees it through the device once its rows are
// in the mirror and every step that could read it was consumed, and the
// meteredDevice puts it back on the free list. The ring is allocated once
// per run with enough buffers for the staging pages, the decode buffer and
// the steps not consumed yet; a step that finds no free buffer allocates
// one more (Allocated counts them all).
//
// Not owned: one buffer per key, reused every step (the cache clones what
// it keeps, device→device, before Save returns).
type deviceOutputs struct {
	dev      gpu.Device // the underlying device (not the meteredDevice)
	rowBytes []int
	maxTok   int
	owned    bool

	mu    sync.Mutex
	free  [][]gpu.Buffer   // per key
	ours  map[uintptr]int  // every buffer of the ring → its key
	out   map[uintptr]bool // buffers handed to the cache and not back yet
	bufs  []gpu.Buffer     // every buffer allocated, to free at the end
	fixed []gpu.Buffer     // not owned: the engine's buffer per key
	// Allocated counts the buffers allocated (all keys).
	Allocated int
	// host holds the --verify oracle's rows of a step before they are
	// copied to the device (one buffer per key, maxTok rows).
	host [][]byte
}

// newDeviceOutputs allocates the ring: ringSteps buffers per key in owned
// mode, one per key otherwise.
func newDeviceOutputs(dev gpu.Device, rowBytes []int, maxTok int, owned bool, ringSteps int) (*deviceOutputs, error) {
	o := &deviceOutputs{dev: dev, rowBytes: rowBytes, maxTok: maxTok, owned: owned,
		free: make([][]gpu.Buffer, len(rowBytes)), ours: map[uintptr]int{}, out: map[uintptr]bool{}}
	n := 1
	if owned {
		n = ringSteps
	}
	for k := range rowBytes {
		for range n {
			b, err := o.alloc(k)
			if err != nil {
				o.close()
				return nil, err
			}
			if owned {
				o.free[k] = append(o.free[k], b)
			} else {
				o.fixed = append(o.fixed, b)
			}
		}
	}
	return o, nil
}

// alloc allocates one buffer of key k. The caller holds mu or owns o.
func (o *deviceOutputs) alloc(k int) (gpu.Buffer, error) {
	b, err := o.dev.Alloc(max(o.maxTok*o.rowBytes[k], 1))
	if err != nil {
		return gpu.Buffer{}, fmt.Errorf("output buffer of key %d: %w", k, err)
	}
	o.ours[bufAddr(b)] = k
	o.bufs = append(o.bufs, b)
	o.Allocated++
	return b, nil
}

// take fills ts with the step's tensors of n tokens (engine goroutine).
func (o *deviceOutputs) take(ts []omnicache.Tensor, n int) error {
	if n > o.maxTok {
		return fmt.Errorf("step of %d tokens, output buffers hold %d", n, o.maxTok)
	}
	if !o.owned {
		for k := range ts {
			ts[k] = omnicache.Tensor{Dev: o.fixed[k], Rows: n}
		}
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for k := range ts {
		var b gpu.Buffer
		if l := o.free[k]; len(l) > 0 {
			b = l[len(l)-1]
			o.free[k] = l[:len(l)-1]
		} else {
			var err error
			if b, err = o.alloc(k); err != nil {
				return err
			}
		}
		o.out[bufAddr(b)] = true
		ts[k] = omnicache.Tensor{Dev: b, Rows: n, Owned: true}
	}
	return nil
}

// put takes back a buffer of the ring the cache freed; false for any other
// buffer. A buffer freed twice is a cache bug: it panics.
func (o *deviceOutputs) put(b gpu.Buffer) bool {
	a := bufAddr(b)
	o.mu.Lock()
	defer o.mu.Unlock()
	k, ok := o.ours[a]
	if !ok {
		return false
	}
	if !o.out[a] {
		panic(fmt.Sprintf("bench: output buffer %#x of key %d freed while not handed to the cache", a, k))
	}
	delete(o.out, a)
	o.free[k] = append(o.free[k], b)
	return true
}

// fill produces the step's rows on the device (the forward's work, not
// cache time): with oracle rows from ver, copied host→device; else a
// device memset of the step's rows to a per-step byte.
func (o *deviceOutputs) fill(ts []omnicache.Tensor, n int, step int, produce func(bufs [][]byte)) error {
	if produce != nil {
		if o.host == nil {
			o.host = make([][]byte, len(o.rowBytes))
			for k, rb := range o.rowBytes {
				o.host[k] = make([]byte, o.maxTok*rb)
			}
		}
		bufs := make([][]byte, len(o.rowBytes))
		for k, rb := range o.rowBytes {
			bufs[k] = o.host[k][:n*rb]
		}
		produce(bufs)
		for k := range ts {
			if err := o.dev.CopyHtoD(ts[k].Dev, 0, bufs[k]); err != nil {
				return fmt.Errorf("forward: oracle rows to the device: %w", err)
			}
		}
		return nil
	}
	f, ok := o.dev.(gpu.Filler)
	if !ok {
		return fmt.Errorf("forward: device %s cannot fill memory (no gpu.Filler)", o.dev.Name())
	}
	for k, rb := range o.rowBytes {
		if err := f.Fill(ts[k].Dev, 0, n*rb, byte(step)|1); err != nil {
			return fmt.Errorf("forward: fill: %w", err)
		}
	}
	return nil
}

// errOutputsHeld reports owned output buffers the cache never freed.
var errOutputsHeld = errors.New("owned output buffers not freed by the cache after Close")

// outstanding is the number of owned buffers handed to the cache and not
// freed back.
func (o *deviceOutputs) outstanding() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.out)
}

// close frees every buffer of the ring (after the cache closed).
func (o *deviceOutputs) close() {
	o.mu.Lock()
	bufs := o.bufs
	o.bufs, o.free, o.fixed = nil, nil, nil
	o.mu.Unlock()
	for _, b := range bufs {
		o.dev.Free(b)
	}
}

// holdFor holds the engine goroutine for d, the modelled forward: the
// device's copies issued so far run meanwhile. It sleeps, then spins the
// last stretch so that short holds are not rounded up to the timer's
// granularity, and returns the time held.
func holdFor(d time.Duration, spin bool) int64 {
	if d <= 0 {
		return 0
	}
	t := time.Now()
	if !spin && d > 200*time.Microsecond {
		time.Sleep(d - 100*time.Microsecond)
	}
	for time.Since(t) < d {
	}
	return time.Since(t).Nanoseconds()
}
