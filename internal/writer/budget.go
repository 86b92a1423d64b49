package writer

import (
	"errors"
	"fmt"
	"sync"

	"github.com/omnicache/omnicache/internal/errs"
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

// reserve charges n device bytes, forcing the oldest pending writes out
// while the charge would exceed the budget. A reservation that cannot be met
// even with every pending write forced out (what stays charged then is the
// deferred clones that unconsumed steps pin) fails first, forcing nothing.
// Engine goroutine.
func (p *Path) reserve(n int64) error {
	p.mu.Lock()
	pinned := p.pinnedCharge
	p.mu.Unlock()
	if limit := p.budget.Limit(); n <= limit && n > limit-pinned && p.q.Pending() > 0 {
		// A hit read queued to the committer pins the clones it reads
		// until it ran: let the committer get there, then look again.
		if err := p.drain(); err != nil {
			return err
		}
		p.mu.Lock()
		pinned = p.pinnedCharge
		p.mu.Unlock()
	}
	if limit := p.budget.Limit(); n <= limit && n > limit-pinned {
		return fmt.Errorf("%w: %d bytes wanted, %d of %d pinned by steps not consumed yet", errs.Budget, n, pinned, limit)
	}
	for {
		ok, err := p.budget.TryReserve(n)
		if err != nil {
			return fmt.Errorf("%w: %w", errs.Budget, err)
		}
		if ok {
			return nil
		}
		switch {
		case p.buf.K > 0 && p.buf.W != nil && p.buf.W.DevCharge > 0:
			p.st.BudgetFlushes.Add(1)
			p.flushBuffer(false)
		case p.forceOldestDeferred():
			p.st.BudgetFlushes.Add(1)
		case p.q.Pending() > 0:
			if err := p.drain(); err != nil {
				return err
			}
		default:
			// Nothing left to force out. Bytes may have been released since
			// the attempt (the committer, a Materialize or Discard): try again
			// while they would fit; what is still held then is pinned by
			// steps not consumed yet.
			if ch, _ := p.budget.Charged(); ch+n <= p.budget.Limit() {
				continue
			} else {
				return fmt.Errorf("%w: %d bytes wanted, %d of %d held by steps not consumed yet", errs.Budget, n, ch, p.budget.Limit())
			}
		}
		if err := p.Err(); err != nil {
			return err
		}
	}
}
