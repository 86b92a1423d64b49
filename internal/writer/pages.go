package writer

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnicache/omnicache/internal/spin"
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
// Free pages are kept in the order they were released: Claim takes the
// one released last (its memory is the likeliest to be in the CPU's
// caches, which a CPU filling it wants), or with cold the one released
// first (which a device's DMA filling it wants: the scatter that read a page
// left its lines in the copy workers' caches, and a DMA write into cached
// lines has every one of them invalidated first).
//
// Its lock is taken by the engine goroutine (Claim) and the committer
// (Release): padded like Queue.
type Pages struct {
	_      linePad
	mu     sync.Mutex
	cond   *sync.Cond
	pages  []Page
	free   []int32 // ring of free page indices, oldest release at head
	head   int
	nfree  int
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
	// ready is nfree, or -1 once closed or failed: written under mu, and
	// loaded without it by a claim's spin (see ClaimSpin), on a line of its
	// own so that the spin does not pull the lock's line away.
	_     linePad
	ready atomic.Int32
	_     linePad
}

// spinBound bounds a claim's spin for a page before it sleeps (a variable
// for the tests).
var spinBound = 50 * time.Microsecond

// NewPages returns a pool of depth pages (memory allocated lazily by the
// caller through Page.Mem).
func NewPages(depth int) *Pages {
	p := &Pages{pages: make([]Page, depth), free: make([]int32, depth)}
	for i := depth - 1; i >= 0; i-- {
		p.pages[i].Index = i
		p.push(i)
	}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// Claim takes a free page with one reference, waiting up to timeout
// (timeout < 0: do not wait): the page released last, or with cold the
// page released first (see Pages), without spinning (ClaimSpin).
func (p *Pages) Claim(timeout time.Duration, cold bool) (*Page, error) {
	return p.ClaimSpin(timeout, cold, false)
}

// ClaimSpin is Claim that, with spin, spins for a page before it sleeps:
// up to spinBound (within timeout), without the lock, pausing between its
// checks, and not on one P (internal/spin). A running
// committer frees a page within µs, while a goroutine asleep on the pool's
// condition is woken several µs later (the Go scheduler readies it on the
// committer's P, where it waits for the committer to park or for another
// P to steal it, which the scheduler delays by µs): a wait the engine
// goroutine would pay on every page when its steps outrun the committer.
// The caller asks for no spin when it just woke the committer (Queue.Kick
// reported it asleep): a goroutine readied by a wake runs next on the
// waker's P, which a spin would hold (BenchmarkStep shape=decode64 hit=50
// shows the longer stall, stall-ns/op, with a spin after every wake).
func (p *Pages) ClaimSpin(timeout time.Duration, cold, spin bool) (*Page, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var deadline time.Time
	for tries := 0; ; tries++ {
		// Closed and failed win over a free page: a page Close just freed
		// is not handed to a Save still in flight.
		if err := p.stopped(); err != nil {
			return nil, err
		}
		if pg := p.pop(cold); pg != nil {
			return pg, nil
		}
		switch {
		case timeout < 0:
			return nil, ErrTimeout
		case tries == 0:
			deadline = time.Now().Add(timeout)
			if bound := min(spinBound, timeout); spin && bound > 0 {
				p.mu.Unlock()
				p.spinReady(bound)
				p.mu.Lock()
				continue
			}
		case !time.Now().Before(deadline):
			return nil, ErrTimeout
		}
		p.armLocked(deadline)
		p.cond.Wait()
	}
}

// spinReady spins up to bound, without the lock, until a page is free or
// the pool stopped.
func (p *Pages) spinReady(bound time.Duration) {
	spin.Until(bound, func() bool { return p.ready.Load() != 0 })
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

// pop takes the free page released last (first when cold), nil if none.
func (p *Pages) pop(cold bool) *Page {
	if p.nfree == 0 {
		return nil
	}
	var i int32
	if cold {
		i = p.free[p.head]
		p.head++
		if p.head == len(p.free) {
			p.head = 0
		}
	} else {
		i = p.free[p.slot(p.nfree-1)]
	}
	p.nfree--
	p.setReady()
	pg := &p.pages[i]
	pg.refs = 1
	return pg
}

// push returns page i to the free pages, as the one released last.
func (p *Pages) push(i int) {
	p.free[p.slot(p.nfree)] = int32(i)
	p.nfree++
	p.setReady()
}

// setReady publishes nfree, or -1 once the pool is closed or failed, for
// a claim's spin. Under mu.
func (p *Pages) setReady() {
	n := int32(p.nfree)
	if p.stopped() != nil {
		n = -1
	}
	p.ready.Store(n)
}

// slot is the ring index of the k-th free page from the oldest.
func (p *Pages) slot(k int) int {
	k += p.head
	if k >= len(p.free) {
		k -= len(p.free)
	}
	return k
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
		p.push(pg.Index)
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
	return len(p.pages) - p.nfree
}

// Close wakes every waiter; later claims that find no free page fail.
func (p *Pages) Close() {
	p.mu.Lock()
	p.closed = true
	p.setReady()
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
	p.setReady()
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Each calls f for every page (for freeing memory at close).
func (p *Pages) Each(f func(*Page)) {
	for i := range p.pages {
		f(&p.pages[i])
	}
}
