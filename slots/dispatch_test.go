package slots

import "testing"

// TestSelectToggles checks that Select turns on exactly the chosen
// implementation's toggle and that restore puts every toggle back.
func TestSelectToggles(t *testing.T) {
	impls := registry()
	state := func() []bool {
		s := make([]bool, len(impls))
		for i, im := range impls {
			if im.use != nil {
				s[i] = *im.use
			}
		}
		return s
	}
	initial := state()
	if useGeneric {
		t.Fatal("the reference is selected by default")
	}
	for _, im := range impls {
		if !im.available {
			continue
		}
		restore, ok := Select(im.name)
		if !ok {
			t.Fatalf("Select(%q) failed", im.name)
		}
		for i, on := range state() {
			// "go" has no toggle: it runs when every toggle is off.
			if on != (impls[i].name == im.name && im.use != nil) {
				t.Errorf("after Select(%q): %s toggle is %v", im.name, impls[i].name, on)
			}
		}
		restore()
		for i, on := range state() {
			if on != initial[i] {
				t.Errorf("after restoring from %q: %s toggle is %v, was %v", im.name, impls[i].name, on, initial[i])
			}
		}
	}
	if restore, ok := Select("nonesuch"); ok {
		restore()
		t.Error("Select accepted an unknown name")
	}
}

// TestDivider checks the reciprocal division against the hardware's over
// edge divisors and numerators up to math.MaxInt32.
func TestDivider(t *testing.T) {
	sizes := []int{1, 2, 3, 5, 6, 7, 9, 15, 17, 48, 100, 544, 1000, 4095, 4097, 65535, 65537, 1_000_003,
		1<<30 - 1, 1<<30 + 1, 1<<31 - 1}
	nums := []int32{0, 1, 2, 3, 15, 16, 17, 1<<16 - 1, 1 << 16, 1<<24 + 7, 1<<30 - 1, 1 << 30, 1<<31 - 2, 1<<31 - 1}
	for _, s := range sizes {
		d := newDivider(s)
		check := func(n int32) {
			q, r := d.split(n)
			if int64(q) != int64(n)/int64(s) || int64(r) != int64(n)%int64(s) {
				t.Fatalf("split(%d) by %d = %d, %d; want %d, %d", n, s, q, r, int64(n)/int64(s), int64(n)%int64(s))
			}
		}
		for _, n := range nums {
			check(n)
		}
		// Around multiples of s: where a rounded reciprocal goes wrong.
		for k := int64(1); k*int64(s) <= 1<<31-1; k = k*3 + 1 {
			for _, n := range []int64{k*int64(s) - 1, k * int64(s), k*int64(s) + 1} {
				if n <= 1<<31-1 {
					check(int32(n))
				}
			}
		}
	}
}
