package scratch

import (
	"slices"
	"testing"
)

// Grow reuses the array while it holds n (contents left as they were),
// and makes a larger one with room to spare when it does not.
func TestGrow(t *testing.T) {
	s := Grow[int32](nil, 8)
	if len(s) != 8 || cap(s) != 10 {
		t.Fatalf("len %d cap %d, want 8 and 10", len(s), cap(s))
	}
	s[0] = 7
	r := Grow(s, 10)
	if len(r) != 10 || &r[0] != &s[0] || r[0] != 7 {
		t.Fatalf("Grow within the capacity reallocated or lost the contents")
	}
	if r = Grow(s, 3); len(r) != 3 || &r[0] != &s[0] {
		t.Fatalf("Grow to fewer elements reallocated")
	}
	if r = Grow(s, 11); len(r) != 11 || cap(r) != 13 || &r[0] == &s[0] {
		t.Fatalf("Grow past the capacity: len %d cap %d", len(r), cap(r))
	}
}

// Extend keeps every element and zeroes the new ones; it never shrinks.
func TestExtend(t *testing.T) {
	s := Extend([]int32{1, 2}, 5)
	if !slices.Equal(s, []int32{1, 2, 0, 0, 0}) {
		t.Fatalf("Extend: %v", s)
	}
	s[4] = 9
	if r := Extend(s, 3); !slices.Equal(r, s) {
		t.Fatalf("Extend to fewer elements changed the slice: %v", r)
	}
	// Dirty memory past len is zeroed when it is taken.
	d := make([]int32, 2, 8)
	d[:8][5] = 42
	if r := Extend(d, 8); r[5] != 0 {
		t.Fatalf("Extend kept a stale element past len: %v", r)
	}
}

func TestPop(t *testing.T) {
	a, b := new(int), new(int)
	free := []*int{a, b}
	if p := Pop(&free); p != b || len(free) != 1 || free[:2][1] != nil {
		t.Fatalf("Pop took %p (want %p), left %d with the slot %v", p, b, len(free), free[:2][1])
	}
	if p := Pop(&free); p != a || len(free) != 0 {
		t.Fatalf("Pop took %p, want %p", p, a)
	}
	if p := Pop(&free); p == nil || p == a || p == b {
		t.Fatalf("Pop of an empty list gave %p, want a new record", p)
	}
}

func TestEmpty(t *testing.T) {
	a, b := new(int), new(int)
	s := Empty([]*int{a, b})
	if len(s) != 0 || cap(s) != 2 || s[:2][0] != nil || s[:2][1] != nil {
		t.Fatalf("Empty: len %d cap %d, references %v: want 0, 2, none", len(s), cap(s), s[:2])
	}
}
