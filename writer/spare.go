package writer

import "sync"

// Spare allocates staging-page memory one page ahead, off the engine
// goroutine. Pinned host memory is slow to allocate (cuMemHostAlloc of a
// 96 MiB page takes 25–50 ms on an H200 host): the first page is allocated
// by the Save that first needs it (the first request pays for it), and
// each page handed out starts the allocation of the next one on a
// background goroutine, while pages without memory remain, so a later Save
// finds its page's memory ready instead of pinning it in the engine's
// step.
//
// Get is called by the engine goroutine (under the caller's page claim);
// Pending by any goroutine; Close once, from any goroutine, after the last
// Get.
type Spare struct {
	alloc func(int) ([]byte, error)
	size  int

	mu     sync.Mutex
	left   int // pages whose memory is neither allocated nor being allocated
	busy   bool
	done   chan struct{} // closed when the allocation in flight ends
	ready  []byte        // memory allocated ahead, not handed out yet
	failed bool          // the last background allocation failed
	closed bool
}

// NewSpare returns a Spare for pages pages of size bytes each, allocated
// with alloc (the device's AllocHost). Nothing is allocated yet.
func NewSpare(alloc func(int) ([]byte, error), size, pages int) *Spare {
	return &Spare{alloc: alloc, size: size, left: pages}
}

// Get returns memory for a page that has none: the page allocated ahead
// (waiting for it if its allocation is in flight), else a new allocation
// made now; then it starts allocating the next page in the background
// while pages without memory remain. A failed background allocation is
// retried here, in the caller's goroutine.
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
	if s.left > 0 && !s.closed {
		s.left--
		s.busy = true
		s.done = make(chan struct{})
		go s.run(s.done)
	}
	s.mu.Unlock()
	return mem, nil
}

func (s *Spare) run(done chan struct{}) {
	mem, err := s.alloc(s.size)
	s.mu.Lock()
	if err == nil {
		s.ready = mem
	} else {
		s.failed = true
	}
	s.busy = false
	close(done)
	s.mu.Unlock()
}

// Pending reports whether a background allocation is in flight.
func (s *Spare) Pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.busy
}

// Close stops allocating ahead: it waits for an allocation in flight and
// returns the memory allocated ahead and never handed out (nil if none),
// for the caller to free.
func (s *Spare) Close() []byte {
	s.mu.Lock()
	s.closed = true
	mem := s.takeLocked()
	s.mu.Unlock()
	return mem
}

// takeLocked waits for the allocation in flight, if any, and takes the
// memory allocated ahead (nil if none). Caller holds mu (released while
// waiting).
func (s *Spare) takeLocked() []byte {
	if s.busy {
		ch := s.done
		s.mu.Unlock()
		<-ch
		s.mu.Lock()
	}
	mem := s.ready
	s.ready = nil
	return mem
}
