// Package spin waits for another goroutine's progress without parking: a
// spin of a few µs where a wake-up (a futex call, an IPI in a VM, the Go
// scheduler's hand-over) would cost as much. Between its checks a spin
// executes the CPU's spin-wait hint (Pause), so that it leaves the core's
// execution resources to the hardware thread sharing the core, which may be
// the goroutine it waits for, and ends without a memory-order machine clear
// when the awaited store lands.
//
// # Implementations
//
//	asm  PAUSE, an avo-generated kernel (pause_amd64.s, make generate)
//	go   a short loop of atomic loads: the reference, and the
//	     implementation on other architectures and with the purego or noasm
//	     build tags
//
// Any goroutine may call anything here.
package spin

import (
	"runtime"
	"sync/atomic"
	"time"
)

const (
	// pausesPerCheck is the hints executed between two checks of a
	// spin's condition: a PAUSE takes tens of ns on CPUs since Skylake,
	// a few before (BenchmarkPause).
	pausesPerCheck = 2
	// checksPerClock is the checks between two readings of the clock.
	checksPerClock = 16
)

// Until checks done until it reports true, pausing between checks, for at
// most bound (done is checked at least once); it reports whether done
// reported true. With one P it does not spin: the goroutine it waits for
// could not run meanwhile.
func Until(bound time.Duration, done func() bool) bool {
	if done() {
		return true
	}
	if bound <= 0 || runtime.GOMAXPROCS(0) == 1 {
		return false
	}
	t0 := time.Now()
	for i := 1; ; i++ {
		Pause(pausesPerCheck)
		if done() {
			return true
		}
		if i%checksPerClock == 0 && time.Since(t0) >= bound {
			return false
		}
	}
}

// sink is loaded by pauseGo: loads the compiler cannot drop.
var sink atomic.Uint32

// pauseGo is the Go implementation of Pause: n atomic loads.
func pauseGo(n int) {
	for range n {
		sink.Load()
	}
}
