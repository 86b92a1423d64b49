package cachetest

// Test devices: wrappers of the host device that hold writes in transit,
// run copies later, count and record what the cache asks of them.

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/omnicache/omnicache/gpu"
)

// GateDevice is the host device whose events recorded while it is armed
// block Wait until the test releases them: it holds chosen writes "in
// transit", which is how a test makes the committer lag behind the engine
// at an exact point. Events recorded while it is not armed (complete at
// once) never block.
type GateDevice struct {
	gpu.Device
	mu      sync.Mutex
	armed   bool
	next    gpu.Event
	last    gpu.Event // the last event gated since Arm
	gates   map[gpu.Event]chan struct{}
	entered chan struct{}
}

// NewGateDevice returns a GateDevice over a new host device, not armed.
func NewGateDevice() *GateDevice {
	return &GateDevice{Device: gpu.NewHost(), gates: map[gpu.Event]chan struct{}{}}
}

// Arm gates every event recorded from now on until Open, or Release of
// that event.
func (d *GateDevice) Arm() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed, d.last = true, 0
	d.entered = make(chan struct{}, 1)
}

// Hold arms the device and returns a function that disarms it and reports
// the last event gated meanwhile (0: none), to Release later.
func (d *GateDevice) Hold() (stop func() gpu.Event) {
	d.Arm()
	return func() gpu.Event {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.armed = false
		return d.last
	}
}

// Release lets the Waits on event ev go.
func (d *GateDevice) Release(ev gpu.Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if g, ok := d.gates[ev]; ok {
		close(g)
		delete(d.gates, ev)
	}
}

// Open disarms the device and releases every gated event.
func (d *GateDevice) Open() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed = false
	for ev, g := range d.gates {
		close(g)
		delete(d.gates, ev)
	}
}

// WaitEntered reports whether a Wait blocked on an event gated since Arm,
// waiting up to timeout for one to.
func (d *GateDevice) WaitEntered(timeout time.Duration) bool {
	d.mu.Lock()
	ch := d.entered
	d.mu.Unlock()
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	select {
	case <-ch:
		return true
	case <-tm.C:
		return false
	}
}

// Record records an event, gated while the device is armed.
func (d *GateDevice) Record() (gpu.Event, error) {
	if _, err := d.Device.Record(); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.next++
	if d.armed {
		d.gates[d.next] = make(chan struct{})
		d.last = d.next
	}
	return d.next, nil
}

// Wait blocks while event e is gated.
func (d *GateDevice) Wait(e gpu.Event) error {
	d.mu.Lock()
	g, entered := d.gates[e], d.entered
	d.mu.Unlock()
	if g != nil {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-g
	}
	return d.Device.Wait(0)
}

// AsyncDevice models a device whose copies run later, in stream order,
// when an event recorded after them is waited for (as on a GPU): a copy's
// source is read only then. Host→device copies take their source at once
// (pageable memory is staged by the driver before the call returns).
type AsyncDevice struct {
	gpu.Host
	mu    sync.Mutex
	ops   []func()
	done  int
	next  gpu.Event
	marks map[gpu.Event]int
}

// NewAsyncDevice returns an AsyncDevice with nothing queued.
func NewAsyncDevice() *AsyncDevice { return &AsyncDevice{marks: map[gpu.Event]int{}} }

func (d *AsyncDevice) enqueue(f func()) {
	d.mu.Lock()
	d.ops = append(d.ops, f)
	d.mu.Unlock()
}

// CopyDtoD queues the copy.
func (d *AsyncDevice) CopyDtoD(dst gpu.Buffer, dstOff int, src gpu.Buffer, srcOff int, n int) error {
	d.enqueue(func() { copy(dst.Host[dstOff:dstOff+n], src.Host[srcOff:srcOff+n]) })
	return nil
}

// CopyDtoH queues the copy.
func (d *AsyncDevice) CopyDtoH(dst []byte, src gpu.Buffer, srcOff int) error {
	d.enqueue(func() { copy(dst, src.Host[srcOff:srcOff+len(dst)]) })
	return nil
}

// CopyHtoD takes src at once and queues the copy.
func (d *AsyncDevice) CopyHtoD(dst gpu.Buffer, dstOff int, src []byte) error {
	staged := append([]byte(nil), src...)
	d.enqueue(func() { copy(dst.Host[dstOff:], staged) })
	return nil
}

// Record marks the copies queued so far.
func (d *AsyncDevice) Record() (gpu.Event, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.next++
	d.marks[d.next] = len(d.ops)
	return d.next, nil
}

// Wait runs the copies queued before event e.
func (d *AsyncDevice) Wait(e gpu.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for ; d.done < d.marks[e]; d.done++ {
		d.ops[d.done]()
	}
	return nil
}

// WaitFor is Wait (it never times out).
func (d *AsyncDevice) WaitFor(e gpu.Event, _ time.Duration) error { return d.Wait(e) }

// CountDevice counts the bytes every device call moves or allocates.
type CountDevice struct {
	gpu.Device
	DtoDBytes, DtoHBytes, HtoDBytes, AllocBytes atomic.Int64
}

// NewCountDevice returns a CountDevice over a new host device.
func NewCountDevice() *CountDevice { return &CountDevice{Device: gpu.NewHost()} }

// Alloc counts n.
func (d *CountDevice) Alloc(n int) (gpu.Buffer, error) {
	d.AllocBytes.Add(int64(n))
	return d.Device.Alloc(n)
}

// CopyDtoD counts n.
func (d *CountDevice) CopyDtoD(dst gpu.Buffer, dstOff int, src gpu.Buffer, srcOff int, n int) error {
	d.DtoDBytes.Add(int64(n))
	return d.Device.CopyDtoD(dst, dstOff, src, srcOff, n)
}

// CopyDtoH counts the bytes of dst.
func (d *CountDevice) CopyDtoH(dst []byte, src gpu.Buffer, srcOff int) error {
	d.DtoHBytes.Add(int64(len(dst)))
	return d.Device.CopyDtoH(dst, src, srcOff)
}

// CopyHtoD counts the bytes of src.
func (d *CountDevice) CopyHtoD(dst gpu.Buffer, dstOff int, src []byte) error {
	d.HtoDBytes.Add(int64(len(src)))
	return d.Device.CopyHtoD(dst, dstOff, src)
}

// BatchDevice is the host device with a batch copy (gpu.BatchCopier), as
// CUDA's cuMemcpyBatchAsync: it counts batches (Batches, of Batched
// copies) and single copies (Singles), and a batch waits for Hold to be
// closed when it is set.
type BatchDevice struct {
	*gpu.Host
	Batches, Batched, Singles atomic.Int64
	Hold                      chan struct{}
}

// NewBatchDevice returns a BatchDevice over a new host device.
func NewBatchDevice() *BatchDevice { return &BatchDevice{Host: gpu.NewHost()} }

// CopyDtoH counts a single copy.
func (d *BatchDevice) CopyDtoH(dst []byte, src gpu.Buffer, off int) error {
	d.Singles.Add(1)
	return d.Host.CopyDtoH(dst, src, off)
}

// CopyDtoHBatch copies every src[i] into dst[i] (after Hold is closed, when
// set) and counts the batch.
func (d *BatchDevice) CopyDtoHBatch(dst [][]byte, src []gpu.Buffer) error {
	if d.Hold != nil {
		<-d.Hold
	}
	for i := range dst {
		if len(src[i].Host) < len(dst[i]) {
			return fmt.Errorf("%w: batch copy %d", gpu.ErrRange, i)
		}
	}
	for i := range dst {
		copy(dst[i], src[i].Host)
	}
	d.Batches.Add(1)
	d.Batched.Add(int64(len(dst)))
	return nil
}

// PinLog is the host device with its staging (pinned host) allocations
// recorded.
type PinLog struct {
	*gpu.Host
	mu    sync.Mutex
	live  map[unsafe.Pointer]int
	total int
}

// NewPinLog returns a PinLog over a new host device.
func NewPinLog() *PinLog { return &PinLog{Host: gpu.NewHost(), live: map[unsafe.Pointer]int{}} }

// AllocHost records the allocation.
func (d *PinLog) AllocHost(n int) ([]byte, error) {
	b, err := d.Host.AllocHost(n)
	if err == nil {
		d.mu.Lock()
		d.live[unsafe.Pointer(unsafe.SliceData(b))] = n
		d.total++
		d.mu.Unlock()
	}
	return b, err
}

// FreeHost records the free.
func (d *PinLog) FreeHost(b []byte) {
	d.mu.Lock()
	delete(d.live, unsafe.Pointer(unsafe.SliceData(b)))
	d.mu.Unlock()
	d.Host.FreeHost(b)
}

// Counts reports the allocations not freed yet and every allocation made.
func (d *PinLog) Counts() (live, total int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.live), d.total
}
