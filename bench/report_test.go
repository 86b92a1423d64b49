package bench

import "testing"

func TestHitVsMiss(t *testing.T) {
	hit := &Report{Cache: "on", Model: "m", Keys: "k"}
	hit.BySize.add(true, 1000, 30) // bucket 10
	hit.BySize.add(true, 1000, 50)
	hit.BySize.add(true, 5000, 90) // bucket 13: no step of its size without a hit
	hit.BySize.add(false, 1000, 10)
	other := &Report{Cache: "on", Model: "m", Keys: "k"}
	other.BySize.add(false, 600, 30) // bucket 10
	foreign := &Report{Cache: "on", Model: "x", Keys: "k"}
	foreign.BySize.add(false, 1000, 1e6)
	off := &Report{Cache: "off", Model: "m", Keys: "k"}
	off.BySize.add(false, 1000, 1e6)
	h, m, n, misses := HitVsMiss(hit, []*Report{hit, other, foreign, off})
	if h != 40 || m != 20 || n != 2 || misses != 2 {
		t.Fatalf("hit %v miss %v over %d hit steps, %d miss steps: want 40, 20, 2, 2", h, m, n, misses)
	}
	if _, _, n, _ := HitVsMiss(foreign, []*Report{foreign}); n != 0 {
		t.Fatalf("a run without hit steps compared %d", n)
	}
}
