package writer

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func charged(b *Budget) int64 { c, _ := b.Charged(); return c }
func peak(b *Budget) int64    { _, p := b.Charged(); return p }

func TestBudgetTryReserveNeverOvercommits(t *testing.T) {
	b := NewBudget(100)
	require.EqualValues(t, 100, b.Limit())

	for _, step := range []struct {
		n      int64
		ok     bool
		charge int64
	}{
		{40, true, 40},
		{40, true, 80},
		{21, false, 80}, // 101 > 100: refused, nothing charged
		{20, true, 100}, // exactly the limit fits
		{1, false, 100},
		{0, true, 100}, // a zero reservation always fits
	} {
		ok, err := b.TryReserve(step.n)
		require.NoError(t, err, "TryReserve(%d)", step.n)
		assert.Equal(t, step.ok, ok, "TryReserve(%d) with %d charged", step.n, step.charge)
		assert.Equal(t, step.charge, charged(b), "charged after TryReserve(%d)", step.n)
	}
	assert.EqualValues(t, 100, peak(b))
}

func TestBudgetReservationLargerThanLimit(t *testing.T) {
	b := NewBudget(64)
	ok, err := b.TryReserve(65)
	require.ErrorIs(t, err, ErrOverBudget)
	assert.False(t, ok)
	assert.Contains(t, err.Error(), "65", "the error names the reservation")
	assert.Contains(t, err.Error(), "64", "the error names the budget")
	assert.Zero(t, charged(b), "a refused reservation charges nothing")

	// Larger than the limit is an error even when the budget is partly
	// charged; a reservation that only does not fit now is not.
	ok, err = b.TryReserve(60)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = b.TryReserve(10)
	require.NoError(t, err, "a reservation that fits the limit but not the free bytes is no error")
	assert.False(t, ok)
	_, err = b.TryReserve(1000)
	require.ErrorIs(t, err, ErrOverBudget)
	assert.EqualValues(t, 60, charged(b))

	// A zero budget takes only zero reservations.
	z := NewBudget(0)
	ok, err = z.TryReserve(0)
	require.NoError(t, err)
	assert.True(t, ok)
	_, err = z.TryReserve(1)
	require.ErrorIs(t, err, ErrOverBudget)
}

func TestBudgetRelease(t *testing.T) {
	b := NewBudget(100)
	ok, err := b.TryReserve(70)
	require.NoError(t, err)
	require.True(t, ok)

	ok, _ = b.TryReserve(50)
	require.False(t, ok, "70+50 exceeds 100")
	b.Release(30)
	assert.EqualValues(t, 40, charged(b))
	ok, _ = b.TryReserve(50)
	require.True(t, ok, "40+50 fits once 30 bytes are released")
	assert.EqualValues(t, 90, charged(b))

	b.Release(0) // no-op
	assert.EqualValues(t, 90, charged(b))
	b.Release(90)
	assert.Zero(t, charged(b))

	assert.PanicsWithValue(t, "writer: budget released more than charged", func() { b.Release(1) })
	// The panic left the mutex unlocked.
	_, _ = b.Charged()
}

func TestBudgetPeak(t *testing.T) {
	b := NewBudget(1000)
	reserve := func(n int64) {
		t.Helper()
		ok, err := b.TryReserve(n)
		require.NoError(t, err)
		require.True(t, ok)
	}
	assert.Zero(t, peak(b))
	reserve(300)
	reserve(200)
	assert.EqualValues(t, 500, peak(b))
	b.Release(400)
	assert.EqualValues(t, 100, charged(b))
	assert.EqualValues(t, 500, peak(b), "peak survives releases")
	reserve(300)
	assert.EqualValues(t, 500, peak(b), "a charge below the old peak leaves it")
	reserve(450)
	assert.EqualValues(t, 850, peak(b))
	ok, _ := b.TryReserve(500)
	require.False(t, ok)
	assert.EqualValues(t, 850, peak(b), "a refused reservation does not move the peak")
}

// Many goroutines reserve and release random amounts; a watcher samples the
// charge. The charge never exceeds the limit, the peak never exceeds it,
// and everything is returned at the end.
func TestBudgetConcurrentReserveRelease(t *testing.T) {
	const (
		limit   = 1000
		workers = 8
		rounds  = 2000
	)
	b := NewBudget(limit)
	stop := make(chan struct{})
	watcher := async(func() int64 {
		var worst int64
		for {
			select {
			case <-stop:
				return worst
			default:
			}
			c, p := b.Charged()
			worst = max(worst, c, p)
			runtime.Gosched()
		}
	})
	var wg sync.WaitGroup
	var granted [workers]int
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var held []int64
			for i := 0; i < rounds; i++ {
				if len(held) > 0 && (rng.IntN(2) == 0 || len(held) > 4) {
					j := rng.IntN(len(held))
					b.Release(held[j])
					held = append(held[:j], held[j+1:]...)
					continue
				}
				n := int64(1 + rng.IntN(limit/3))
				ok, err := b.TryReserve(n)
				if err != nil {
					t.Errorf("TryReserve(%d): %v", n, err)
					return
				}
				if ok {
					held = append(held, n)
					granted[w]++
				}
			}
			for _, n := range held {
				b.Release(n)
			}
		}()
	}
	done := async(func() struct{} { wg.Wait(); return struct{}{} })
	recv(t, done, "the workers")
	close(stop)
	worst := recv(t, watcher, "the watcher")

	c, p := b.Charged()
	assert.Zero(t, c, "every reservation was released")
	assert.LessOrEqual(t, p, int64(limit), "peak")
	assert.LessOrEqual(t, worst, int64(limit), "charge sampled during the run")
	total := 0
	for _, g := range granted {
		total += g
	}
	assert.Positive(t, total, "some reservations succeeded")
}
