package writer

import (
	"runtime"
	"sync"
	"testing"
)

// TestUnpinPinnedChargeRace races the lock-free unpin of one step against
// the locked unpin of another on a pinned deferred write: a consumer that
// found the count at one takes the state lock while the engine pins the
// write for a new step (count two) and that step's consumer drops its pin
// lock-free (back to one). The locked unpin must decide on the count its
// own decrement returns: deciding on a load taken before the lock-free
// decrement keeps the write's pinned charge forever, and later Saves fail
// with ErrBudget.
func TestUnpinPinnedChargeRace(t *testing.T) {
	p := &Path{}
	const charge = 1 << 20
	// Owners stays 1 (the committer's reference), so no unpin releases w:
	// the test sees only the pin count and the pinned charge.
	w := &Write{Deferred: true, Charge: charge, Owners: 1}
	iters := 2000
	if testing.Short() {
		iters = 200
	}
	for i := range iters {
		var r1, r2 Refs
		p.mu.Lock()
		p.pinLocked(&r1, w)
		p.mu.Unlock()
		var wg sync.WaitGroup
		wg.Add(1)
		p.mu.Lock() // the engine holds the state lock (Begin) ...
		go func() { // ... while the first step's consumer finds the count at one
			defer wg.Done()
			p.Unpin(&r1)
		}()
		for range 1 + i%4 {
			runtime.Gosched()
		}
		p.pinLocked(&r2, w) // the new step pins w: count two
		p.mu.Unlock()
		// Wait until the consumer holds the lock, then drop the new step's
		// pin lock-free, inside the consumer's locked unpin.
		for spins := 0; spins < 1000 && p.mu.TryLock(); spins++ {
			p.mu.Unlock()
			runtime.Gosched()
		}
		p.Unpin(&r2)
		wg.Wait()
		if n := w.Pins.Load(); n != 0 {
			t.Fatalf("iteration %d: %d pins left", i, n)
		}
		if p.pinnedCharge != 0 {
			t.Fatalf("iteration %d: pinned charge %d left with no pin (leaked)", i, p.pinnedCharge)
		}
	}
}
