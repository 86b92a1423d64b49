package writer

import (
	"testing"
	"time"
)

// deadlockTimeout bounds every wait in these tests: a deadlock detector,
// not a performance threshold.
const deadlockTimeout = 10 * time.Second

// stillBlocked is how long a test watches a call that must keep blocking
// before it unblocks it. A shorter wait only makes the check weaker, never
// flaky.
const stillBlocked = 50 * time.Millisecond

// recv returns the value from ch, failing the test if none arrives within
// deadlockTimeout.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	tm := time.NewTimer(deadlockTimeout)
	defer tm.Stop()
	select {
	case v := <-ch:
		return v
	case <-tm.C:
		t.Fatalf("%s did not return within %v: deadlock?", what, deadlockTimeout)
		panic("unreachable")
	}
}

// blocked reports whether nothing arrives on ch within stillBlocked.
func blocked[T any](ch <-chan T) bool {
	tm := time.NewTimer(stillBlocked)
	defer tm.Stop()
	select {
	case <-ch:
		return false
	case <-tm.C:
		return true
	}
}

// async runs f on a goroutine and returns a channel that receives its
// result.
func async[T any](f func() T) <-chan T {
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	return ch
}
