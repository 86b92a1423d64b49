package writer

import (
	"sync"
	"sync/atomic"
)

// Spare allocates staging-page memory off the engine goroutine. Pinned
// host memory is slow to allocate (tens of ms for a 96 MiB page:
// BenchmarkAllocHost in gpu/). By default the first page is allocated by the
// Save that first needs it (the first request pays for it), and once a
// page was handed out, Ahead (at the end of that Save) starts allocating
// the next one on a background goroutine, while pages without memory
// remain, so a later Save finds its page's memory ready instead of pinning
// it in the engine's step. Ahead runs after the Save's own device calls
// were issued: the driver serializes them behind a pinned allocation in
// flight. Fill instead allocates one page at once and every other one in
// the background right away, one after another (Config.AllocStagingAhead).
//
// Get and Ahead are called by the engine goroutine; Fill by New; Pending
// by any goroutine; Close once, from any goroutine, after the last Get.
type Spare struct {
	alloc func(int) ([]byte, error)
	size  int

	mu     sync.Mutex
	left   int // pages whose memory is neither allocated nor being allocated
	busy   bool
	done   chan struct{} // closed when the allocation in flight ends
	ready  [][]byte      // memory allocated ahead, not handed out yet
	failed bool          // the last background allocation failed
	fill   bool          // allocate every page left, one after another (Fill)
	closed bool
	want   atomic.Bool // a page was handed out: Ahead allocates the next
}

// NewSpare returns a Spare for pages pages of size bytes each, allocated
// with alloc (the device's AllocHost). Nothing is allocated yet.
func NewSpare(alloc func(int) ([]byte, error), size, pages int) *Spare {
	return &Spare{alloc: alloc, size: size, left: pages}
}

// Fill allocates one page's memory now (the first Get takes it) and starts
// allocating every other page's on a background goroutine, one after
// another. It returns the first allocation's error, having allocated
// nothing; a background allocation that fails ends the filling (the Get
// that needs its page allocates it again, as without Fill).
func (s *Spare) Fill() error {
	s.mu.Lock()
	if s.left == 0 || s.closed {
		s.mu.Unlock()
		return nil
	}
	s.left--
	s.mu.Unlock()
	mem, err := s.alloc(s.size)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.left++
		return err
	}
	s.ready = append(s.ready, mem)
	s.fill = true
	s.startLocked()
	return nil
}

// Get returns memory for a page that has none: memory allocated ahead
// (waiting for the allocation in flight when none is ready yet), else a
// new allocation made now. A failed background allocation is retried here,
// in the caller's goroutine.
func (s *Spare) Get() ([]byte, error) {
	s.mu.Lock()
	mem := s.takeLocked()
	if mem == nil {
		if s.failed {
			s.failed = false // the failed background allocation's page: ours now
		} else {
			s.left--
		}
		s.mu.Unlock()
		var err error
		if mem, err = s.alloc(s.size); err != nil {
			s.mu.Lock()
			s.left++
			s.mu.Unlock()
			return nil, err
		}
		s.mu.Lock()
	}
	if s.left > 0 && !s.fill {
		s.want.Store(true)
	}
	s.mu.Unlock()
	return mem, nil
}

// Ahead starts allocating the next page's memory in the background when a
// page was handed out since the last call and pages without memory remain.
// It costs an atomic load otherwise.
func (s *Spare) Ahead() {
	if !s.want.Load() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.want.Store(false)
	s.startLocked()
}

// startLocked starts the next background allocation, if a page is left and
// none is in flight. Caller holds mu.
func (s *Spare) startLocked() {
	if s.left > 0 && !s.busy && !s.closed {
		s.left--
		s.busy = true
		s.done = make(chan struct{})
		go s.run(s.done)
	}
}

func (s *Spare) run(done chan struct{}) {
	mem, err := s.alloc(s.size)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		s.ready = append(s.ready, mem)
	} else {
		s.failed = true
		s.fill = false
	}
	s.busy = false
	close(done)
	if s.fill {
		s.startLocked()
	}
}

// Pending reports whether a background allocation is in flight.
func (s *Spare) Pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.busy
}

// Wait waits until no background allocation is in flight (Sync: the cache
// is quiescent after it; with Fill, every page's memory is allocated).
func (s *Spare) Wait() {
	s.mu.Lock()
	for s.busy {
		ch := s.done
		s.mu.Unlock()
		<-ch
		s.mu.Lock()
	}
	s.mu.Unlock()
}

// Close stops allocating ahead: it waits for an allocation in flight and
// returns the memory allocated ahead and never handed out (none: nil), for
// the caller to free.
func (s *Spare) Close() [][]byte {
	s.mu.Lock()
	s.closed = true
	for s.busy {
		ch := s.done
		s.mu.Unlock()
		<-ch
		s.mu.Lock()
	}
	mem := s.ready
	s.ready = nil
	s.mu.Unlock()
	return mem
}

// takeLocked takes memory allocated ahead, waiting for the allocation in
// flight when none is ready (nil if none). Caller holds mu (released while
// waiting).
func (s *Spare) takeLocked() []byte {
	if len(s.ready) == 0 && s.busy {
		ch := s.done
		s.mu.Unlock()
		<-ch
		s.mu.Lock()
	}
	n := len(s.ready)
	if n == 0 {
		return nil
	}
	mem := s.ready[n-1]
	s.ready[n-1] = nil
	s.ready = s.ready[:n-1]
	return mem
}
