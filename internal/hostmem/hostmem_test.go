package hostmem

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// mapAnonIsOS: on unix, mapAnon maps from the OS.
var mapAnonIsOS = runtime.GOOS != "windows" && runtime.GOOS != "plan9" && runtime.GOOS != "js" && runtime.GOOS != "wasip1"

func rss(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Skip("no /proc/self/statm")
	}
	f := strings.Fields(string(b))
	n, _ := strconv.ParseInt(f[1], 10, 64)
	return n * int64(os.Getpagesize())
}

func TestAllocZeroAndFree(t *testing.T) {
	for _, n := range []int{0, 1, Threshold - 1, Threshold, 3*Threshold + 5} {
		b, err := Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != n {
			t.Fatalf("len %d, want %d", len(b), n)
		}
		for i := 0; i < n; i += 4093 {
			if b[i] != 0 {
				t.Fatalf("byte %d of %d not zero", i, n)
			}
			b[i] = 1
		}
		if err := Free(b); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTypedSlices(t *testing.T) {
	u, err := Uint64s(Threshold)
	if err != nil {
		t.Fatal(err)
	}
	u[len(u)-1] = 7
	if err := FreeUint64s(u); err != nil {
		t.Fatal(err)
	}
	v, err := Uint32s(Threshold)
	if err != nil {
		t.Fatal(err)
	}
	v[len(v)-1] = 7
	if err := FreeUint32s(v); err != nil {
		t.Fatal(err)
	}
}

// A large mapping is not resident until written.
func TestLazy(t *testing.T) {
	before := rss(t)
	b, err := Alloc(8 << 30)
	if err != nil {
		t.Skipf("cannot map 8 GiB here: %v", err)
	}
	defer Free(b)
	b[0], b[len(b)-1] = 1, 1
	if grown := rss(t) - before; grown > 4<<20 {
		t.Fatalf("RSS grew by %d bytes after touching two pages of an 8 GiB mapping", grown)
	}
}

// Free leaves memory it did not map alone (a make'd slice of the same size).
func TestFreeForeign(t *testing.T) {
	b := make([]byte, 2*Threshold)
	b[0] = 1
	if err := Free(b); err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] = 1 // still mapped: the collector owns it
}

// Map maps even small sizes from the OS (zero, outside the Go heap), and
// Free unmaps exactly what it mapped.
func TestMapSmall(t *testing.T) {
	for _, n := range []int{1, 100, 4096, 5000} {
		b, err := Map(n)
		if err != nil || len(b) != n {
			t.Fatalf("Map(%d): len %d, %v", n, len(b), err)
		}
		for i, v := range b {
			if v != 0 {
				t.Fatalf("Map(%d): byte %d is %d", n, i, v)
			}
		}
		b[n-1] = 7
		if _, ok := mapped.Load(unsafe.Pointer(unsafe.SliceData(b))); !ok && mapAnonIsOS {
			t.Fatalf("Map(%d) did not map from the OS", n)
		}
		if err := Free(b); err != nil {
			t.Fatal(err)
		}
		if _, ok := mapped.Load(unsafe.Pointer(unsafe.SliceData(b))); ok {
			t.Fatalf("Free(%d) left the mapping registered", n)
		}
	}
	if b, _ := Map(0); b != nil {
		t.Fatal("Map(0) returned memory")
	}
}

// AllocHuge: zero, HugePage-aligned from HugePage up, lazy (touching one
// byte makes at most one huge page resident), and freed by Free.
func TestAllocHuge(t *testing.T) {
	for _, n := range []int{1, Threshold, HugePage - 1, HugePage, 3*HugePage + 4096} {
		b, err := AllocHuge(n)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != n {
			t.Fatalf("len %d, want %d", len(b), n)
		}
		if n >= HugePage && uintptr(unsafe.Pointer(&b[0]))%HugePage != 0 {
			t.Fatalf("AllocHuge(%d) at %p: not %d-aligned", n, &b[0], HugePage)
		}
		for i := 0; i < n; i += 4093 {
			if b[i] != 0 {
				t.Fatalf("byte %d of %d not zero", i, n)
			}
			b[i] = 1
		}
		b[n-1] = 1
		if err := Free(b); err != nil {
			t.Fatal(err)
		}
	}
	before := rss(t)
	b, err := AllocHuge(1 << 30)
	if err != nil {
		t.Skipf("cannot map 1 GiB here: %v", err)
	}
	defer Free(b)
	b[len(b)/2] = 1
	if grown := rss(t) - before; grown > HugePage+(2<<20) {
		t.Fatalf("RSS grew by %d bytes after touching one byte of a 1 GiB huge-page mapping", grown)
	}
}

// Populate (and its portable path, touch) makes a mapping resident (RSS
// grows by its size) and keeps its bytes: zero where unwritten.
func TestPopulate(t *testing.T) {
	Populate(nil)
	for _, fn := range []struct {
		name string
		f    func([]byte)
	}{{"populate", Populate}, {"touch", touch}, {"parallel", func(b []byte) { PopulateParallel(b, 3) }}} {
		for _, n := range []int{1, 4096, HugePage + 4096, 16 << 20, 40<<20 + 4096} {
			b, err := AllocHuge(n)
			if err != nil {
				t.Fatal(err)
			}
			b[n/2] = 7
			before := rss(t)
			fn.f(b)
			if grown := rss(t) - before; n >= 8<<20 && grown < int64(n)*3/4 {
				t.Fatalf("%s of %d bytes grew RSS by %d only", fn.name, n, grown)
			}
			for i := 0; i < n; i += 4093 {
				if i != n/2 && b[i] != 0 {
					t.Fatalf("%s: byte %d of %d is %d", fn.name, i, n, b[i])
				}
			}
			if b[n/2] != 7 {
				t.Fatalf("%s changed a written byte of %d", fn.name, n)
			}
			if err := Free(b); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestRelease: Release gives back the whole pages inside b (on Linux they
// read zeros), leaves the partial pages at its ends and the rest of the mapping
// as they were, and does nothing to memory it did not map.
func TestRelease(t *testing.T) {
	ps := os.Getpagesize()
	m, err := Map(8 * ps)
	if err != nil {
		t.Fatal(err)
	}
	defer Free(m)
	fill := func(b []byte) {
		for i := range b {
			b[i] = 7
		}
	}
	fill(m)
	// From the middle of page 1 to the middle of page 5: pages 2-4 go.
	if err := Release(m, m[ps+ps/2:5*ps+ps/2]); err != nil {
		t.Fatal(err)
	}
	for i, v := range m {
		want := byte(7)
		if runtime.GOOS == "linux" && i >= 2*ps && i < 5*ps {
			want = 0
		}
		if v != want {
			t.Fatalf("byte %d (page %d) is %d after Release, want %d", i, i/ps, v, want)
		}
	}
	// Memory from the Go heap, or outside m: untouched.
	h := make([]byte, 8*ps)
	fill(h)
	if err := Release(h, h); err != nil {
		t.Fatal(err)
	}
	other, _ := Map(4 * ps)
	defer Free(other)
	fill(other)
	if err := Release(m, other); err != nil {
		t.Fatal(err)
	}
	for _, b := range [][]byte{h, other} {
		for i, v := range b {
			if v != 7 {
				t.Fatalf("byte %d of memory Release was not given is %d", i, v)
			}
		}
	}
}

// TestRefusedMapping: a mapping the OS refuses is ErrNoMemory from Alloc,
// Map and AllocHuge (never a fall back to the Go heap, where the runtime
// dies of it); smaller Allocs still come from make, and mappings work
// again once the refusal is undone.
func TestRefusedMapping(t *testing.T) {
	undo := RefuseFrom(Threshold)
	for name, f := range map[string]func(int) ([]byte, error){"Alloc": Alloc, "Map": Map, "AllocHuge": AllocHuge} {
		for _, n := range []int{Threshold, HugePage, 3 * HugePage} {
			b, err := f(n)
			if !errors.Is(err, ErrNoMemory) || b != nil {
				t.Errorf("%s(%d) with mappings refused: %d bytes, %v; want ErrNoMemory", name, n, len(b), err)
			}
		}
	}
	if b, err := Alloc(Threshold - 1); err != nil || len(b) != Threshold-1 {
		t.Errorf("Alloc below the threshold: %d bytes, %v", len(b), err)
	}
	undo()
	b, err := AllocHuge(HugePage)
	if err != nil || !IsMapped(b) {
		t.Fatalf("AllocHuge after the refusal was undone: %v", err)
	}
	Free(b)
}
