// Package slotstest runs tests and benchmarks once per implementation of
// package slots that this build and CPU can run.
package slotstest

import (
	"testing"

	"github.com/omnicache/omnicache/slots"
)

// Run runs f as a subtest "impl=<name>" once per available implementation of
// package slots, with that implementation selected, and restores the previous
// choice afterwards. f must not call t.Parallel.
func Run(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	for _, name := range slots.Implementations() {
		t.Run("impl="+name, func(t *testing.T) {
			restore, ok := slots.Select(name)
			if !ok {
				t.Fatalf("slots.Select(%q) failed for a listed implementation", name)
			}
			defer restore()
			f(t)
		})
	}
}

// Bench is Run for benchmarks.
func Bench(b *testing.B, f func(b *testing.B)) {
	b.Helper()
	for _, name := range slots.Implementations() {
		b.Run("impl="+name, func(b *testing.B) {
			restore, ok := slots.Select(name)
			if !ok {
				b.Fatalf("slots.Select(%q) failed for a listed implementation", name)
			}
			defer restore()
			f(b)
		})
	}
}
