package tier

import (
	"sync"
	"testing"
)

func TestSightingsCount(t *testing.T) {
	s := NewSightings(1 << 12)
	if s.Bytes() != 4*(1<<12)*4 {
		t.Fatalf("bytes %d", s.Bytes())
	}
	for i := 1; i <= 5; i++ {
		if got := s.See(42); got != i {
			t.Fatalf("sighting %d counted %d", i, got)
		}
	}
	if s.Count(42) != 5 || s.Count(43) != 0 {
		t.Fatalf("counts %d, %d; want 5, 0", s.Count(42), s.Count(43))
	}
}

// TestSightingsOverestimate: never under the true count, and with half as
// many distinct hashes as counters a row, few over it.
func TestSightingsOverestimate(t *testing.T) {
	const w = 1 << 12
	s := NewSightings(w)
	n := w / 2
	for h := 0; h < n; h++ {
		s.See(uint64(h) * 0x9e3779b97f4a7c15)
	}
	over := 0
	for h := 0; h < n; h++ {
		c := s.Count(uint64(h) * 0x9e3779b97f4a7c15)
		if c < 1 {
			t.Fatalf("hash %d counted %d, seen once", h, c)
		}
		if c > 1 {
			over++
		}
	}
	if over > n/20 { // (1-e^-0.5)^4 = 2.4% expected
		t.Fatalf("%d of %d hashes counted twice", over, n)
	}
}

// TestSightingsAging: the 8 × w-th sighting halves every counter.
func TestSightingsAging(t *testing.T) {
	s := NewSightings(64)
	for i := 0; i < 10; i++ {
		s.See(7)
	}
	s.adds.Store(8*s.w - 2) // as after that many sightings of others
	s.See(7)                // the 11th: not yet
	if c := s.Count(7); c != 11 {
		t.Fatalf("before aging 7 counts %d, want 11", c)
	}
	s.See(7) // the 12th reaches 8 × w: halved
	if c, n := s.Count(7), s.adds.Load(); c != 6 || n != 0 {
		t.Fatalf("after aging 7 counts %d (%d adds since), want 6 (0)", c, n)
	}
}

func TestSightingsConcurrent(t *testing.T) {
	s := NewSightings(1 << 10)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				s.See(1)
			}
		}()
	}
	wg.Wait()
	if c := s.Count(1); c != 400 {
		t.Fatalf("count %d, want 400", c)
	}
}

func TestSightingCountersOption(t *testing.T) {
	e, _ := NewEmbedded(0)
	defer e.Close()
	if _, err := New(e, testNS, Options{SightingCounters: -1}); err == nil {
		t.Fatal("negative SightingCounters accepted")
	}
	tr, err := New(e, testNS, Options{SightingCounters: 100})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Sightings().Bytes() != 4*128*4 {
		t.Fatalf("sketch of %d bytes, want 128 counters a row", tr.Sightings().Bytes())
	}
}
