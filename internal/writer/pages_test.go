package writer

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type claimResult struct {
	pg  *Page
	err error
}

func claimAsync(p *Pages, timeout time.Duration) <-chan claimResult {
	return async(func() claimResult {
		pg, err := p.Claim(timeout, false)
		return claimResult{pg, err}
	})
}

func mustClaim(t *testing.T, p *Pages) *Page {
	t.Helper()
	r := recv(t, claimAsync(p, -1), "Claim of a free page")
	require.NoError(t, r.err, "Claim with a free page")
	require.NotNil(t, r.pg)
	return r.pg
}

func TestPagesClaimRelease(t *testing.T) {
	p := NewPages(3)
	assert.Zero(t, p.InUse())

	seen := map[int]bool{}
	var held []*Page
	for i := 0; i < 3; i++ {
		pg := mustClaim(t, p)
		assert.EqualValues(t, 1, pg.refs, "a claimed page has one reference")
		assert.False(t, seen[pg.Index], "page %d claimed twice", pg.Index)
		assert.GreaterOrEqual(t, pg.Index, 0)
		assert.Less(t, pg.Index, 3)
		seen[pg.Index] = true
		held = append(held, pg)
		assert.Equal(t, i+1, p.InUse())
	}
	_, err := p.Claim(-1, false)
	require.ErrorIs(t, err, ErrTimeout, "every page held")

	p.Release(held[1])
	assert.Equal(t, 2, p.InUse())
	pg := mustClaim(t, p)
	assert.Same(t, held[1], pg, "the released page is the free one")
	assert.EqualValues(t, 1, pg.refs)

	for _, pg := range held {
		p.Release(pg)
	}
	assert.Zero(t, p.InUse())
}

func TestPagesRefCounts(t *testing.T) {
	p := NewPages(1)
	pg := mustClaim(t, p)
	pg.Mem = []byte{1, 2, 3}
	p.Ref(pg)
	p.Ref(pg)
	assert.EqualValues(t, 3, pg.refs)

	p.Release(pg)
	p.Release(pg)
	assert.Equal(t, 1, p.InUse(), "the page stays held while a reference remains")
	_, err := p.Claim(-1, false)
	require.ErrorIs(t, err, ErrTimeout)

	p.Release(pg)
	assert.Zero(t, p.InUse(), "the last release returns the page")
	again := mustClaim(t, p)
	assert.Same(t, pg, again)
	assert.EqualValues(t, 1, again.refs, "a reclaimed page starts with one reference")
	assert.Equal(t, []byte{1, 2, 3}, again.Mem, "page memory is kept for reuse")
	p.Release(again)
}

func TestPagesReleasePanics(t *testing.T) {
	p := NewPages(2)
	pg := mustClaim(t, p)
	p.Release(pg)
	assert.PanicsWithValue(t, "writer: page released twice", func() { p.Release(pg) })
	assert.PanicsWithValue(t, "writer: ref of a free page", func() { p.Ref(&p.pages[1]) })
	// Both panics left the mutex unlocked.
	assert.GreaterOrEqual(t, p.InUse(), 0)
}

func TestPagesClaimWaitsForRelease(t *testing.T) {
	p := NewPages(1)
	pg := mustClaim(t, p)

	ch := claimAsync(p, deadlockTimeout)
	require.True(t, blocked(ch), "Claim returned while every page was held")
	p.Release(pg)
	r := recv(t, ch, "Claim after a Release")
	require.NoError(t, r.err)
	assert.Same(t, pg, r.pg)
	assert.Equal(t, 1, p.InUse())
	p.Release(r.pg)
}

// Several waiters and releases: every waiter gets a page exactly once the
// releases make one free, and no page is handed to two holders.
func TestPagesManyWaiters(t *testing.T) {
	const depth, waiters = 2, 6
	p := NewPages(depth)
	held := []*Page{mustClaim(t, p), mustClaim(t, p)}

	var mu sync.Mutex
	owner := map[int]int{} // page index → waiter holding it
	results := make(chan error, waiters)
	release := make(chan int, waiters)
	for w := 0; w < waiters; w++ {
		go func() {
			pg, err := p.Claim(deadlockTimeout, false)
			if err != nil {
				results <- err
				return
			}
			mu.Lock()
			if o, ok := owner[pg.Index]; ok {
				mu.Unlock()
				t.Errorf("page %d handed to waiter %d while waiter %d holds it", pg.Index, w, o)
				results <- nil
				return
			}
			owner[pg.Index] = w
			mu.Unlock()
			release <- pg.Index
			results <- nil
		}()
	}
	for _, pg := range held {
		p.Release(pg)
	}
	for i := 0; i < waiters; i++ {
		idx := recv(t, release, "a waiter's Claim")
		mu.Lock()
		delete(owner, idx)
		mu.Unlock()
		p.Release(&p.pages[idx])
	}
	for i := 0; i < waiters; i++ {
		require.NoError(t, recv(t, results, "a waiter"))
	}
	assert.Zero(t, p.InUse())
}

func TestPagesClaimTimeout(t *testing.T) {
	p := NewPages(1)
	pg := mustClaim(t, p)

	const timeout = 30 * time.Millisecond
	t0 := time.Now()
	r := recv(t, claimAsync(p, timeout), "Claim with a timeout")
	require.ErrorIs(t, r.err, ErrTimeout)
	assert.Nil(t, r.pg)
	assert.GreaterOrEqual(t, time.Since(t0), timeout, "Claim gave up before its timeout")

	r = recv(t, claimAsync(p, 0), "Claim with timeout 0")
	require.ErrorIs(t, r.err, ErrTimeout, "timeout 0 and no free page")

	assert.Equal(t, 1, p.InUse(), "a timed-out claim takes nothing")
	p.Release(pg)
	r = recv(t, claimAsync(p, 0), "Claim with timeout 0 and a free page")
	require.NoError(t, r.err, "a free page is taken even with timeout 0")
	p.Release(r.pg)
}

func TestPagesNegativeTimeoutFailsAtOnce(t *testing.T) {
	p := NewPages(1)
	pg := mustClaim(t, p)
	// NoWait-style claims must not wait at all: the deadlock detector
	// would catch a wait, and a Release only after the call proves it did
	// not need one.
	for _, timeout := range []time.Duration{-1, -time.Hour} {
		r := recv(t, claimAsync(p, timeout), "Claim with a negative timeout")
		require.ErrorIs(t, r.err, ErrTimeout, "timeout %v", timeout)
	}
	p.Release(pg)
}

func TestPagesCloseWakesWaiters(t *testing.T) {
	p := NewPages(1)
	pg := mustClaim(t, p)

	chs := []<-chan claimResult{claimAsync(p, deadlockTimeout), claimAsync(p, deadlockTimeout)}
	for _, ch := range chs {
		require.True(t, blocked(ch), "Claim returned while every page was held")
	}
	p.Close()
	for _, ch := range chs {
		r := recv(t, ch, "a waiter after Close")
		require.ErrorIs(t, r.err, ErrClosed)
		assert.Nil(t, r.pg)
	}

	// After Close every claim fails at once (any timeout), also one that
	// would find a free page: a page Close just freed is never handed out.
	r := recv(t, claimAsync(p, deadlockTimeout), "Claim after Close")
	require.ErrorIs(t, r.err, ErrClosed)
	p.Release(pg)
	r = recv(t, claimAsync(p, deadlockTimeout), "Claim of a free page after Close")
	require.ErrorIs(t, r.err, ErrClosed)
	assert.Nil(t, r.pg)
	assert.Zero(t, p.InUse())
}

func TestPagesFailWakesWaiters(t *testing.T) {
	p := NewPages(1)
	pg := mustClaim(t, p)
	ch := claimAsync(p, deadlockTimeout)
	require.True(t, blocked(ch), "Claim returned while every page was held")
	p.Fail()
	r := recv(t, ch, "a waiter after Fail")
	require.ErrorIs(t, r.err, ErrFailed)
	p.Release(pg)
	r = recv(t, claimAsync(p, -1), "Claim of a free page after Fail")
	require.ErrorIs(t, r.err, ErrFailed)
	assert.Zero(t, p.InUse())
}

func TestPagesEach(t *testing.T) {
	p := NewPages(3)
	pg := mustClaim(t, p)
	pg.Mem = make([]byte, 4)
	var idx []int
	withMem := 0
	p.Each(func(pg *Page) {
		idx = append(idx, pg.Index)
		if pg.Mem != nil {
			withMem++
		}
	})
	assert.Equal(t, []int{0, 1, 2}, idx)
	assert.Equal(t, 1, withMem)
	p.Release(pg)
}

// Claimers and releasers under -race: InUse never exceeds the depth and
// every page comes back.
func TestPagesConcurrent(t *testing.T) {
	const depth, workers, rounds = 3, 6, 300
	p := NewPages(depth)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				pg, err := p.Claim(deadlockTimeout, false)
				if err != nil {
					errs <- err
					return
				}
				if n := p.InUse(); n > depth {
					t.Errorf("InUse %d > depth %d", n, depth)
				}
				if i%3 == 0 {
					p.Ref(pg)
					p.Release(pg)
				}
				p.Release(pg)
			}
		}()
	}
	recv(t, async(func() struct{} { wg.Wait(); return struct{}{} }), "the workers")
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Zero(t, p.InUse())
}

// TestPagesClaimOrder: Claim takes the page released last, cold the
// one released first, and the ring wraps through many rounds of both.
func TestPagesClaimOrder(t *testing.T) {
	p := NewPages(4)
	var held []*Page
	for range 4 {
		pg, err := p.Claim(-1, false)
		require.NoError(t, err)
		held = append(held, pg)
	}
	order := []int{2, 0, 3, 1}
	for _, i := range order {
		p.Release(held[i])
	}
	pg, err := p.Claim(-1, true)
	require.NoError(t, err)
	assert.Same(t, held[2], pg, "cold: the page released first")
	pg, err = p.Claim(-1, false)
	require.NoError(t, err)
	assert.Same(t, held[1], pg, "warm: the page released last")
	pg, err = p.Claim(-1, true)
	require.NoError(t, err)
	assert.Same(t, held[0], pg)
	pg, err = p.Claim(-1, false)
	require.NoError(t, err)
	assert.Same(t, held[3], pg)
	_, err = p.Claim(-1, true)
	require.ErrorIs(t, err, ErrTimeout, "every page held")
	assert.Equal(t, 4, p.InUse())

	// A model of the free list through wrapping rounds.
	for _, pg := range held {
		p.Release(pg)
	}
	model := []int{held[0].Index, held[1].Index, held[2].Index, held[3].Index}
	for round := range 50 {
		cold := round%3 != 0
		var pg *Page
		if cold {
			pg, err = p.Claim(-1, true)
		} else {
			pg, err = p.Claim(-1, false)
		}
		require.NoError(t, err)
		want := model[len(model)-1]
		if cold {
			want = model[0]
			model = model[1:]
		} else {
			model = model[:len(model)-1]
		}
		require.Equal(t, want, pg.Index, "round %d (cold %v)", round, cold)
		if round%2 == 0 {
			p.Release(pg)
			model = append(model, pg.Index)
		} else {
			pg2, err := p.Claim(-1, false)
			require.NoError(t, err)
			require.Equal(t, model[len(model)-1], pg2.Index)
			model = model[:len(model)-1]
			p.Release(pg2)
			p.Release(pg)
			model = append(model, pg2.Index, pg.Index)
		}
		require.Equal(t, 4-len(model), p.InUse())
	}
}

// setSpin sets the claim spin's bound for one test, with a second P where
// GOMAXPROCS is 1 (the spin needs one: internal/spin).
func setSpin(t *testing.T, bound time.Duration) {
	b0 := spinBound
	spinBound = bound
	t.Cleanup(func() { spinBound = b0 })
	if runtime.GOMAXPROCS(0) == 1 {
		p0 := runtime.GOMAXPROCS(2)
		t.Cleanup(func() { runtime.GOMAXPROCS(p0) })
	}
}

// spinClaimAsync claims with ClaimSpin(timeout, false, spin).
func spinClaimAsync(p *Pages, timeout time.Duration, spin bool) <-chan claimResult {
	return async(func() claimResult {
		pg, err := p.ClaimSpin(timeout, false, spin)
		return claimResult{pg, err}
	})
}

// A spinning claim (ClaimSpin with spin, more than one P)
// takes a page released during its spin, and fails as a sleeping claim
// does on Close, Fail and its timeout (the spin within it); past its
// bound it sleeps like Claim. With fewer Ps, or without spin, it does not
// spin (its bound of an hour would outlast the test's deadlock timeout).
func TestPagesClaimSpin(t *testing.T) {
	setSpin(t, time.Hour) // a spinning claim spins through the test
	p := NewPages(1)
	pg := mustClaim(t, p)

	ch := spinClaimAsync(p, deadlockTimeout, true)
	require.True(t, blocked(ch), "a spinning claim returned while every page was held")
	p.mu.Lock()
	armed := p.armed // only a sleeping claim arms the pool's timer
	p.mu.Unlock()
	require.False(t, armed, "the claim slept instead of spinning")
	p.Release(pg)
	r := recv(t, ch, "a spinning claim once a page was released")
	require.NoError(t, r.err)
	pg = r.pg

	// The timeout bounds the spin: ErrTimeout after it, nothing taken.
	t0 := time.Now()
	r = recv(t, spinClaimAsync(p, 20*time.Millisecond, true), "a spinning claim with a timeout")
	require.ErrorIs(t, r.err, ErrTimeout)
	require.GreaterOrEqual(t, time.Since(t0), 20*time.Millisecond)
	require.Equal(t, 1, p.InUse())

	// Fail ends the spin with ErrFailed, Close with ErrClosed.
	ch = spinClaimAsync(p, deadlockTimeout, true)
	require.True(t, blocked(ch))
	p.Fail()
	require.ErrorIs(t, recv(t, ch, "a spinning claim after Fail").err, ErrFailed)
	p.Release(pg)
	require.Zero(t, p.InUse())

	p = NewPages(1)
	pg = mustClaim(t, p)
	ch = spinClaimAsync(p, deadlockTimeout, true)
	require.True(t, blocked(ch))
	p.Close()
	require.ErrorIs(t, recv(t, ch, "a spinning claim after Close").err, ErrClosed)
	p.Release(pg)

	// Past its bound the claim sleeps, and a release wakes it.
	setSpin(t, time.Millisecond)
	p = NewPages(1)
	pg = mustClaim(t, p)
	ch = spinClaimAsync(p, deadlockTimeout, true)
	time.Sleep(5 * time.Millisecond) // well past the spin
	require.True(t, blocked(ch))
	p.Release(pg)
	r = recv(t, ch, "a claim that spun, then slept, once a page was released")
	require.NoError(t, r.err)
	p.Release(r.pg)
}

// The spin needs spin and a second P: otherwise a claim sleeps at once,
// which a spin of an hour (ended by nothing but a free page) would not.
// Seen through the pool's timer: only a sleeping claim arms it.
func TestPagesClaimNoSpin(t *testing.T) {
	setSpin(t, time.Hour)
	for _, tc := range []struct {
		name  string
		spin  bool
		procs int
	}{
		{"spin=false", false, 0}, // GOMAXPROCS as setSpin left it: at least 2
		{"one P", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.procs == 1 {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			}
			p := NewPages(1)
			pg := mustClaim(t, p)
			ch := spinClaimAsync(p, deadlockTimeout, tc.spin)
			require.Eventually(t, func() bool {
				p.mu.Lock()
				defer p.mu.Unlock()
				return p.armed
			}, deadlockTimeout, time.Millisecond, "the claim never slept")
			p.Release(pg)
			r := recv(t, ch, "a sleeping claim once a page was released")
			require.NoError(t, r.err)
			p.Release(r.pg)
		})
	}
}
