package spin

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// impls are the implementations of Pause this build has: the Go reference
// always, the assembly where it is compiled in.
func impls() map[string]func(int) {
	m := map[string]func(int){"go": pauseGo}
	if Impl != "go" {
		m[Impl] = Pause
	}
	return m
}

// Every implementation returns, for every n (none for n <= 0), and takes
// longer for more hints: a million take longer than a thousand calls of
// one (which an implementation that returns at once fails: its million is
// one call).
func TestPause(t *testing.T) {
	for name, p := range impls() {
		t.Run(name, func(t *testing.T) {
			for _, n := range []int{-1, 0, 1, 2, 3, 1000} {
				p(n)
			}
			t0 := time.Now()
			for range 1000 {
				p(1)
			}
			thousand := time.Since(t0)
			t0 = time.Now()
			p(1 << 20)
			require.Greater(t, time.Since(t0), thousand, "a million hints took less than a thousand calls of one")
		})
	}
	require.Contains(t, []string{"asm", "go"}, Impl)
}

func TestUntil(t *testing.T) {
	if runtime.GOMAXPROCS(0) == 1 { // the spins below need a second P
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	}
	// Done at once: no clock read, true.
	require.True(t, Until(0, func() bool { return true }))
	require.False(t, Until(0, func() bool { return false }))
	require.False(t, Until(-time.Second, func() bool { return false }))
	// Never done: false after about bound.
	t0 := time.Now()
	calls := 0
	require.False(t, Until(2*time.Millisecond, func() bool { calls++; return false }))
	require.GreaterOrEqual(t, time.Since(t0), 2*time.Millisecond)
	require.Greater(t, calls, 1)
	// Done by another goroutine's store.
	var flag atomic.Bool
	go func() {
		time.Sleep(time.Millisecond)
		flag.Store(true)
	}()
	require.True(t, Until(time.Minute, flag.Load))
	// Done on the n-th check.
	n := 0
	require.True(t, Until(time.Minute, func() bool { n++; return n == 40 }))
	require.Equal(t, 40, n)
	// With one P: one check, no spin, whatever the bound.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	n = 0
	require.False(t, Until(50*time.Millisecond, func() bool { n++; return false })) // a spin would check many times
	require.Equal(t, 1, n)
	require.True(t, Until(time.Hour, func() bool { return true }))
}

func TestUntilNoAllocs(t *testing.T) {
	var v atomic.Int32
	allocs := testing.AllocsPerRun(100, func() {
		Until(time.Microsecond, func() bool { return v.Load() != 0 })
	})
	require.Zero(t, allocs)
}

// BenchmarkPause is the time of one hint per implementation.
func BenchmarkPause(b *testing.B) {
	for name, p := range impls() {
		b.Run("impl="+name, func(b *testing.B) {
			for b.Loop() {
				p(1)
			}
		})
	}
}
