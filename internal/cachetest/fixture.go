package cachetest

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/omnicache/omnicache"
)

// The small fixture: 16 blocks of 4 tokens, block tables of 8 columns.
const (
	BlockSize = 4
	NumBlocks = 16
	Stride    = 8
	// DeadlockTimeout bounds every call the harness makes: a deadlock
	// detector, not a performance threshold.
	DeadlockTimeout = 10 * time.Second
)

// The fixture's keys: a required hidden state, an optional per-token
// tensor, a deferred one (audio codes) and an optional deferred one (codes
// a model emits only on some steps).
var (
	KeyHidden   = omnicache.Key{Name: "hidden", RowBytes: 32}
	KeyAux      = omnicache.Key{Name: "aux", RowBytes: 8, Optional: true}
	KeyCodes    = omnicache.Key{Name: "codes", RowBytes: 12, Deferred: true}
	KeyCodesOpt = omnicache.Key{Name: "codes", RowBytes: 12, Deferred: true, Optional: true}
)

// Config is the small fixture over keys (none: KeyHidden and KeyAux). The
// staging timeout is shorter than the default so that a leaked page fails
// a test with ErrStagingTimeout before the deadlock detector fires.
func Config(keys ...omnicache.Key) omnicache.Config {
	if len(keys) == 0 {
		keys = []omnicache.Key{KeyHidden, KeyAux}
	}
	return omnicache.Config{
		NumBlocks:           NumBlocks,
		BlockSize:           BlockSize,
		Keys:                keys,
		StagingClaimTimeout: 5 * time.Second,
	}
}

// Guard runs f on another goroutine and returns its result; it fails the
// test if f does not return within DeadlockTimeout, and reports a panic of
// f as a failure of what (instead of a crash of the test binary). f must
// not call t.FailNow.
func Guard[T any](t testing.TB, what string, f func() T) T {
	t.Helper()
	ch := make(chan T, 1)
	panicked := make(chan any, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				panicked <- fmt.Sprintf("%v\n%s", r, stack(false))
			}
		}()
		ch <- f()
	}()
	tm := time.NewTimer(DeadlockTimeout)
	defer tm.Stop()
	select {
	case v := <-ch:
		return v
	case p := <-panicked:
		t.Fatalf("%s panicked: %v", what, p)
	case <-tm.C:
		t.Fatalf("%s did not return within %v: deadlock?", what, DeadlockTimeout)
	}
	panic("unreachable")
}

// WaitGoroutines polls until the goroutine count is back to base or
// DeadlockTimeout passed, and fails the test with a stack dump then.
func WaitGoroutines(t testing.TB, base int) {
	t.Helper()
	deadline := time.Now().Add(DeadlockTimeout)
	for {
		n := runtime.NumGoroutine()
		if n <= base {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines leaked: %d running, baseline %d\n%s", n, base, stack(true))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func stack(all bool) []byte {
	buf := make([]byte, 1<<20)
	return buf[:runtime.Stack(buf, all)]
}
