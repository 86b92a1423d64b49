package writer

import (
	"errors"
	"sync"
	"time"
)

// ErrTimeout: no page became free within the claim timeout.
var ErrTimeout = errors.New("writer: no free staging page")

// ErrClosed: the pool was closed while waiting.
var ErrClosed = errors.New("writer: pool closed")

// ErrFailed: the pool was failed (the cache's sticky write failure) while
// waiting.
var ErrFailed = errors.New("writer: pool failed")

// Page is one staging page: memory for Capacity token rows of every
// immediate key, allocated on its first use. A page is reference counted;
// it returns to the pool when the last reference is released.
type Page struct {
	Index int
	Mem   []byte // nil until first use
	refs  int32
}

// Pages is a fixed pool of staging pages.
//
// Its lock is taken by the engine goroutine (Claim) and the committer
// (Release): padded like Queue.
type Pages struct {
	_      linePad
	mu     sync.Mutex
	cond   *sync.Cond
	pages  []Page
	free   []int32
	closed bool
	failed bool
	// wake bounds the waits: one timer for the pool, armed (armed true,
	// firing at fireAt) while it fires no later than the earliest waiter's
	// deadline, and left armed when a waiter leaves early. A wait costs no
	// timer call while an armed one fires in time; a timer firing early
	// only makes the waiters check their deadlines and re-arm it.
	wake   *time.Timer
	armed  bool
	fireAt time.Time
	_      linePad
}

// NewPages returns a pool of depth pages (memory allocated lazily by the
// caller through Page.Mem).
func NewPages(depth int) *Pages {
	p := &Pages{pages: make([]Page, depth), free: make([]int32, 0, depth)}
	for i := depth - 1; i >= 0; i-- {
		p.pages[i].Index = i
		p.free = append(p.free, int32(i))
	}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// Claim takes a free page with one reference, waiting up to timeout
// (timeout < 0: do not wait).
func (p *Pages) Claim(timeout time.Duration) (*Page, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// Closed and failed win over a free page: a page Close just freed is
	// not handed to a Save still in flight.
	if err := p.stopped(); err != nil {
		return nil, err
	}
	if pg := p.pop(); pg != nil {
		return pg, nil
	}
	if timeout < 0 {
		return nil, ErrTimeout
	}
	deadline := time.Now().Add(timeout)
	for {
		p.armLocked(deadline)
		p.cond.Wait()
		if err := p.stopped(); err != nil {
			return nil, err
		}
		if pg := p.pop(); pg != nil {
			return pg, nil
		}
		if !time.Now().Before(deadline) {
			return nil, ErrTimeout
		}
	}
}

// armLocked makes sure the pool's timer fires no later than deadline.
func (p *Pages) armLocked(deadline time.Time) {
	if p.armed && !p.fireAt.After(deadline) {
		return
	}
	if p.wake == nil {
		p.wake = time.AfterFunc(time.Hour, p.fire)
	}
	p.wake.Reset(time.Until(deadline))
	p.armed, p.fireAt = true, deadline
}

// fire wakes every waiter to check its deadline.
func (p *Pages) fire() {
	p.mu.Lock()
	p.armed = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *Pages) stopped() error {
	switch {
	case p.closed:
		return ErrClosed
	case p.failed:
		return ErrFailed
	}
	return nil
}

func (p *Pages) pop() *Page {
	n := len(p.free)
	if n == 0 {
		return nil
	}
	pg := &p.pages[p.free[n-1]]
	p.free = p.free[:n-1]
	pg.refs = 1
	return pg
}

// Ref adds a reference to a held page.
func (p *Pages) Ref(pg *Page) {
	p.mu.Lock()
	if pg.refs <= 0 {
		p.mu.Unlock()
		panic("writer: ref of a free page")
	}
	pg.refs++
	p.mu.Unlock()
}

// Release drops a reference; the last one returns the page to the pool.
func (p *Pages) Release(pg *Page) {
	p.mu.Lock()
	pg.refs--
	switch {
	case pg.refs == 0:
		p.free = append(p.free, int32(pg.Index))
		p.cond.Broadcast()
	case pg.refs < 0:
		p.mu.Unlock()
		panic("writer: page released twice")
	}
	p.mu.Unlock()
}

// InUse is the number of pages held now.
func (p *Pages) InUse() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pages) - len(p.free)
}

// Close wakes every waiter; later claims that find no free page fail.
func (p *Pages) Close() {
	p.mu.Lock()
	p.closed = true
	if p.wake != nil {
		p.wake.Stop()
		p.armed = false
	}
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Fail wakes every waiter with ErrFailed; later claims fail the same way.
func (p *Pages) Fail() {
	p.mu.Lock()
	p.failed = true
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Each calls f for every page (for freeing memory at close).
func (p *Pages) Each(f func(*Page)) {
	for i := range p.pages {
		f(&p.pages[i])
	}
}
