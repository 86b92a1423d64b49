package writer

import (
	"errors"
	"fmt"
	"sync"
)

// ErrOverBudget: a single reservation is larger than the whole budget.
var ErrOverBudget = errors.New("writer: reservation larger than the byte budget")

// Budget charges device bytes against a fixed limit. Reservations never
// overcommit: TryReserve fails when the charge would exceed the limit, and the
// caller forces the oldest pending write out before trying again.
type Budget struct {
	_       linePad // taken by the engine goroutine and the committer: padded like Queue
	mu      sync.Mutex
	limit   int64
	charged int64
	peak    int64
	_       linePad
}

// NewBudget returns a budget of limit bytes.
func NewBudget(limit int64) *Budget { return &Budget{limit: limit} }

// Limit is the budget's size.
func (b *Budget) Limit() int64 { return b.limit }

// TryReserve charges n bytes if they fit and reports whether they did.
// A reservation larger than the whole budget returns ErrOverBudget.
func (b *Budget) TryReserve(n int64) (bool, error) {
	if n > b.limit {
		return false, fmt.Errorf("%w: %d bytes, budget %d", ErrOverBudget, n, b.limit)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.charged+n > b.limit {
		return false, nil
	}
	b.charged += n
	if b.charged > b.peak {
		b.peak = b.charged
	}
	return true, nil
}

// Release returns n charged bytes.
func (b *Budget) Release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.charged -= n
	if b.charged < 0 {
		b.mu.Unlock()
		panic("writer: budget released more than charged")
	}
	b.mu.Unlock()
}

// Charged is the number of bytes held now; Peak the most ever held.
func (b *Budget) Charged() (charged, peak int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.charged, b.peak
}
