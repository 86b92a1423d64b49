// Package scratch sizes the slices the cache keeps from one call to the
// next (a step's slots, per-request offsets, per-handle tables), so that a
// steady run allocates none. Every package of the cache core uses it: the
// root, the read path and the write path.
package scratch

// Grow returns s resized to n elements, reusing its memory when it holds
// n; the contents are undefined (the caller overwrites them). A new array
// gets a quarter more room, so that a size creeping up does not allocate
// at every call.
func Grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n, n+n/4)
	}
	return s[:n]
}

// Extend returns s with at least n elements, the ones it had kept and the
// new ones zero: a table indexed by handle, grown to hold handle n-1.
func Extend[T any](s []T, n int) []T {
	if n <= len(s) {
		return s
	}
	return append(s, make([]T, n-len(s))...)
}

// Pop takes the last record of a free list, or a new one when it is empty:
// the engine goroutine's recycling of step records and writes. The slot
// it leaves is cleared, so the list keeps no reference to a record in use.
func Pop[T any](free *[]*T) *T {
	s := *free
	n := len(s)
	if n == 0 {
		return new(T)
	}
	p := s[n-1]
	s[n-1] = nil
	*free = s[:n-1]
	return p
}

// Empty returns s emptied, its memory kept and its elements cleared, so
// that it keeps no reference alive (borrowed buffers, records).
func Empty[T any](s []T) []T {
	clear(s)
	return s[:0]
}
