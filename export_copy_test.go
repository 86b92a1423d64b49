package omnicache

import (
	"sync"
	"sync/atomic"
	"time"
)

// SetSplitBytes sets the smallest copy split across the copy workers for
// caches made afterwards (0: the default) and returns a func that restores
// it. Tests only: it forces the split path on small steps.
func SetSplitBytes(n int) (restore func()) {
	old := splitBytes
	splitBytes = n
	return func() { splitBytes = old }
}

// SetLazyBytes sets the largest step write handed over lazily for caches
// made afterwards (0: the default) and returns a func that restores it.
// Tests only: small steps then take the paths of a prefill's write
// (Plan.ResultInto filled by Save).
func SetLazyBytes(n int) (restore func()) {
	old := lazyBytes
	lazyBytes = n
	return func() { lazyBytes = old }
}

// CopySplits is the number of copies c split across its copy workers.
func CopySplits(c *Cache) int64 { return c.parts.Workers.Splits() }

// HoldCommitter queues in-order work that holds the committer until
// release is called (once; later calls do nothing): everything queued
// after it waits.
func HoldCommitter(c *Cache) (release func()) {
	g := make(gate)
	c.path.PushRead(g)
	c.parts.Progress.Kick()
	return sync.OnceFunc(func() { close(g) })
}

type gate chan struct{}

func (g gate) RunInOrder(bool) { <-g }

// HoldWorkingCommitter is HoldCommitter that returns once the committer
// runs the held work: it is working (not asleep) until release.
func HoldWorkingCommitter(c *Cache) (release func()) {
	g := enteredGate{in: make(chan struct{}), out: make(chan struct{})}
	c.path.PushRead(g)
	c.parts.Progress.Kick()
	<-g.in
	return sync.OnceFunc(func() { close(g.out) })
}

type enteredGate struct{ in, out chan struct{} }

func (g enteredGate) RunInOrder(bool) { close(g.in); <-g.out }

// SetAheadWait sets c's bound on a consumer's wait for a working committer
// to start a prefetched read (reader.DefaultAheadWait).
func SetAheadWait(c *Cache, d time.Duration) { c.rd.SetAheadWait(d) }

// ReadsHandedBack counts the hit reads Materialize began itself and handed
// back to the committer (a row it found claimed since the plan).
func ReadsHandedBack(c *Cache) int64 { return c.parts.Counters.HandedBack.Load() }

// HoldMaterialize holds c's next Materialize once it took its step, before
// it reads it, until release (once; later calls do nothing): held is
// closed once it waits there. Set it while no Materialize runs.
func HoldMaterialize(c *Cache) (held <-chan struct{}, release func()) {
	in, out := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	c.testTaken = func() {
		if first.CompareAndSwap(false, true) { // the next one only: later ones go on
			close(in)
			<-out
		}
	}
	return in, sync.OnceFunc(func() { close(out) })
}

// Delivered is the position live request id's rows were delivered up to
// (-1: not live). Not while Begin runs.
func Delivered(c *Cache, id int64) int32 {
	h, ok := c.eng.requests.Lookup(id)
	if !ok {
		return -1
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.eng.delivered[h].pos
}
