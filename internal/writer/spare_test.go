package writer

import (
	"errors"
	"sync"
	"testing"
)

// allocLog is an allocator that records its calls and can block or fail.
type allocLog struct {
	mu    sync.Mutex
	n     int
	fail  map[int]bool // call number → fail
	gate  chan struct{}
	freed int
}

func (a *allocLog) alloc(size int) ([]byte, error) {
	if a.gate != nil {
		<-a.gate
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n++
	if a.fail[a.n] {
		return nil, errors.New("injected")
	}
	return make([]byte, size), nil
}

func (a *allocLog) calls() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

func TestSpareAllocatesOneAhead(t *testing.T) {
	a := &allocLog{}
	s := NewSpare(a.alloc, 64, 3)
	m, err := s.Get()
	if err != nil || len(m) != 64 {
		t.Fatalf("first Get: %d bytes, %v", len(m), err)
	}
	if s.Pending() || a.calls() != 1 {
		t.Fatal("Get allocated ahead by itself: only Ahead may start it")
	}
	s.Ahead()
	// The second page is being allocated (or is) in the background.
	for s.Pending() {
	}
	if got := a.calls(); got != 2 {
		t.Fatalf("%d allocations after the first Get, want 2 (one ahead)", got)
	}
	if _, err := s.Get(); err != nil {
		t.Fatal(err)
	}
	s.Ahead()
	s.Wait()
	if s.Pending() || a.calls() != 3 {
		t.Fatalf("after Wait: pending %v, %d allocations; want the third page allocated", s.Pending(), a.calls())
	}
	if _, err := s.Get(); err != nil {
		t.Fatal(err)
	}
	s.Ahead()
	if got := a.calls(); got != 3 {
		t.Fatalf("%d allocations for 3 pages, want 3", got)
	}
	if s.Pending() || len(s.Close()) != 0 {
		t.Fatal("nothing may be left allocated ahead once every page has memory")
	}
}

func TestSpareGetWaitsAndCloseReturnsLeftover(t *testing.T) {
	a := &allocLog{gate: make(chan struct{})}
	s := NewSpare(a.alloc, 8, 4)
	got := make(chan error)
	go func() { _, err := s.Get(); s.Ahead(); got <- err }()
	a.gate <- struct{}{} // the first, synchronous allocation
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	go func() { _, err := s.Get(); s.Ahead(); got <- err }()
	select {
	case <-got:
		t.Fatal("Get returned before the page allocated ahead was ready")
	default:
	}
	a.gate <- struct{}{} // the background allocation completes; Get takes it
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	// A third allocation is now in flight; Close waits for it and returns it.
	done := make(chan [][]byte)
	go func() { done <- s.Close() }()
	a.gate <- struct{}{}
	if m := <-done; len(m) != 1 || len(m[0]) != 8 {
		t.Fatalf("Close returned %d pages, want the page allocated ahead", len(m))
	}
	if a.calls() != 3 {
		t.Fatalf("%d allocations, want 3 (none after Close)", a.calls())
	}
}

func TestSpareFailedBackgroundAllocationIsRetried(t *testing.T) {
	a := &allocLog{fail: map[int]bool{2: true}}
	s := NewSpare(a.alloc, 8, 2)
	if _, err := s.Get(); err != nil {
		t.Fatal(err)
	}
	s.Ahead()
	for s.Pending() {
	}
	m, err := s.Get() // the background allocation failed: allocated here
	if err != nil || len(m) != 8 {
		t.Fatalf("retry: %d bytes, %v", len(m), err)
	}
	if a.calls() != 3 || s.Pending() {
		t.Fatalf("%d allocations, pending %v; want 3 and no page left to allocate", a.calls(), s.Pending())
	}
	a.fail[4] = true
	s2 := NewSpare(a.alloc, 8, 1)
	if _, err := s2.Get(); err == nil {
		t.Fatal("a failed synchronous allocation must be returned")
	}
	if m, err := s2.Get(); err != nil || len(m) != 8 {
		t.Fatalf("after a failure the page can still be allocated: %v", err)
	}
}

// Fill allocates one page at once and every other one in the background,
// one after another, without any Ahead; Get takes ready memory without
// waiting for the allocation in flight; Close returns what was never taken.
// A failed first allocation allocates nothing; a failed background one
// ends the filling and is retried by the Get that needs it.
func TestSpareFill(t *testing.T) {
	a := &allocLog{gate: make(chan struct{})}
	s := NewSpare(a.alloc, 8, 4)
	filled := make(chan error)
	go func() { filled <- s.Fill() }()
	a.gate <- struct{}{} // the first page, allocated by Fill itself
	if err := <-filled; err != nil {
		t.Fatal(err)
	}
	if !s.Pending() {
		t.Fatal("Fill started no background allocation")
	}
	if m, err := s.Get(); err != nil || len(m) != 8 {
		t.Fatalf("Get of the page Fill allocated: %d bytes, %v", len(m), err)
	}
	a.gate <- struct{}{} // second page
	m, err := s.Get()    // may wait for it
	if err != nil || len(m) != 8 {
		t.Fatalf("second Get: %d bytes, %v", len(m), err)
	}
	a.gate <- struct{}{} // third page
	a.gate <- struct{}{} // fourth page
	s.Wait()
	if s.Pending() || a.calls() != 4 {
		t.Fatalf("after Wait: pending %v, %d allocations; want all 4 pages", s.Pending(), a.calls())
	}
	s.Ahead() // nothing left
	if left := s.Close(); len(left) != 2 {
		t.Fatalf("Close returned %d pages, want the 2 never taken", len(left))
	}

	failing := &allocLog{fail: map[int]bool{1: true}}
	s = NewSpare(failing.alloc, 8, 2)
	if err := s.Fill(); err == nil {
		t.Fatal("Fill: no error from a failed first allocation")
	}
	if s.Pending() || len(s.Close()) != 0 {
		t.Fatal("a failed Fill left an allocation behind")
	}

	failing = &allocLog{fail: map[int]bool{2: true}}
	s = NewSpare(failing.alloc, 8, 3)
	if err := s.Fill(); err != nil {
		t.Fatal(err)
	}
	s.Wait()
	if failing.calls() != 2 {
		t.Fatalf("%d allocations: the failed background one should end the filling", failing.calls())
	}
	for i := 0; i < 3; i++ { // the first page, the failed one retried, the last one
		if m, err := s.Get(); err != nil || len(m) != 8 {
			t.Fatalf("Get %d: %d bytes, %v", i, len(m), err)
		}
	}
	if failing.calls() != 4 {
		t.Fatalf("%d allocations, want 4", failing.calls())
	}
	s.Close()
}
