// Package gputest holds the test fakes of the device interface: Faulty
// wraps a gpu.Device and fails, delays or hangs chosen methods, for the
// failure tests and fuzz targets of the cache. Any goroutine may call a
// Faulty (its switches are atomic); it owns nothing but its switches, the
// wrapped device keeps its memory.
package gputest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnicache/omnicache/gpu"
)

// Op names a gpu.Device method that Faulty can make fail.
type Op int

// The gpu.Device methods Faulty injects failures into.
const (
	OpAlloc Op = iota
	OpAllocHost
	OpCopyDtoD
	OpCopyDtoH
	OpCopyHtoD
	OpRecord
	OpWait
	NumOps
)

var opNames = [NumOps]string{"Alloc", "AllocHost", "CopyDtoD", "CopyDtoH", "CopyHtoD", "Record", "Wait"}

func (o Op) String() string {
	if o >= 0 && o < NumOps {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// Faulty wraps a gpu.Device and injects failures into any of its methods
// (each armed to fail once a number of its calls have succeeded), delays
// into Wait, and can hold every Wait until released (a device that never
// completes). Tests use it to drive the cache's failure paths. Safe for
// concurrent use.
type Faulty struct {
	gpu.Device
	left [NumOps]atomic.Int64
	on   [NumOps]atomic.Bool
	// copies: FailAfter's shared counter over the three copy directions.
	copies   atomic.Int64
	copiesOn atomic.Bool
	delay    atomic.Int64 // ns added to every Wait
	mu       sync.Mutex
	hang     chan struct{}               // non-nil: events recorded now hang until it is closed
	seq      gpu.Event                   // Faulty's own event numbering
	evs      map[gpu.Event]gpu.Event     // Faulty event → the wrapped device's
	hung     map[gpu.Event]chan struct{} // events recorded while hanging
}

// NewFaulty returns d wrapped with no failure armed.
func NewFaulty(d gpu.Device) *Faulty { return &Faulty{Device: d} }

// FailAfter arms the copies (device→device, device→host, host→device,
// counted together): n more copies succeed, then every copy fails.
func (f *Faulty) FailAfter(n int64) {
	f.copies.Store(n)
	f.copiesOn.Store(true)
}

// FailOpAfter arms op: n more calls of it succeed, then every call fails.
func (f *Faulty) FailOpAfter(op Op, n int64) {
	f.left[op].Store(n)
	f.on[op].Store(true)
}

// Heal disarms every failure and delay and releases held waits.
func (f *Faulty) Heal() {
	for i := range f.on {
		f.on[i].Store(false)
	}
	f.copiesOn.Store(false)
	f.delay.Store(0)
	f.Release()
}

// DelayWaits makes every Wait take at least d longer.
func (f *Faulty) DelayWaits(d time.Duration) { f.delay.Store(int64(d)) }

// Hang makes every event recorded from now on block Wait until Release: a
// device whose copies never complete. (gpu.Event 0, "nothing recorded", never
// blocks.)
func (f *Faulty) Hang() {
	f.mu.Lock()
	if f.hang == nil {
		f.hang = make(chan struct{})
	}
	f.mu.Unlock()
}

// Release lets held Waits (and later ones) return.
func (f *Faulty) Release() {
	f.mu.Lock()
	if f.hang != nil {
		close(f.hang)
		f.hang = nil
	}
	f.mu.Unlock()
}

func (f *Faulty) fail(op Op) error {
	if f.on[op].Load() && f.left[op].Add(-1) < 0 {
		if op == OpAlloc || op == OpAllocHost {
			return fmt.Errorf("%w: injected %v fault", gpu.ErrAlloc, op)
		}
		return fmt.Errorf("%w: injected %v fault", gpu.ErrCopy, op)
	}
	if (op == OpCopyDtoD || op == OpCopyDtoH || op == OpCopyHtoD) && f.copiesOn.Load() && f.copies.Add(-1) < 0 {
		return fmt.Errorf("%w: injected %v fault", gpu.ErrCopy, op)
	}
	return nil
}

func (f *Faulty) Alloc(n int) (gpu.Buffer, error) {
	if err := f.fail(OpAlloc); err != nil {
		return gpu.Buffer{}, err
	}
	return f.Device.Alloc(n)
}

func (f *Faulty) AllocHost(n int) ([]byte, error) {
	if err := f.fail(OpAllocHost); err != nil {
		return nil, err
	}
	return f.Device.AllocHost(n)
}

func (f *Faulty) CopyDtoD(dst gpu.Buffer, dstOff int, src gpu.Buffer, srcOff int, n int) error {
	if err := f.fail(OpCopyDtoD); err != nil {
		return err
	}
	return f.Device.CopyDtoD(dst, dstOff, src, srcOff, n)
}

func (f *Faulty) CopyDtoH(dst []byte, src gpu.Buffer, srcOff int) error {
	if err := f.fail(OpCopyDtoH); err != nil {
		return err
	}
	return f.Device.CopyDtoH(dst, src, srcOff)
}

func (f *Faulty) CopyHtoD(dst gpu.Buffer, dstOff int, src []byte) error {
	if err := f.fail(OpCopyHtoD); err != nil {
		return err
	}
	return f.Device.CopyHtoD(dst, dstOff, src)
}

func (f *Faulty) Record() (gpu.Event, error) {
	if err := f.fail(OpRecord); err != nil {
		return 0, err
	}
	ev, err := f.Device.Record()
	if err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.evs == nil {
		f.evs, f.hung = map[gpu.Event]gpu.Event{}, map[gpu.Event]chan struct{}{}
	}
	f.seq++
	f.evs[f.seq] = ev
	if f.hang != nil {
		f.hung[f.seq] = f.hang
	}
	return f.seq, nil
}

func (f *Faulty) Wait(e gpu.Event) error { return f.WaitFor(e, -1) }

// WaitFor is Wait bounded by timeout: a hung event returns gpu.ErrTimeout.
func (f *Faulty) WaitFor(e gpu.Event, timeout time.Duration) error {
	if d := f.delay.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	f.mu.Lock()
	h, under := f.hung[e], f.evs[e]
	f.mu.Unlock()
	if h != nil {
		if timeout < 0 {
			<-h
		} else {
			t := time.NewTimer(timeout)
			defer t.Stop()
			select {
			case <-h:
			case <-t.C:
				return fmt.Errorf("%w: event %d after %v (the device hangs)", gpu.ErrTimeout, e, timeout)
			}
		}
	}
	if err := f.fail(OpWait); err != nil {
		return err
	}
	return f.Device.WaitFor(under, timeout)
}
