package tier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// ErrCircuitOpen: a batch ran out of its time on the backend (a hung or
// unreachable server), and the tier fails every call at once until a
// background probe gets an answer again. It wraps ErrUnavailable (and so
// ErrMiss for reads): a replica recomputes instead of waiting out the
// timeout on every step of an outage.
var ErrCircuitOpen = fmt.Errorf("%w: circuit open after a backend timeout", ErrUnavailable)

// DefaultProbeInterval is Options.ProbeInterval when zero.
const DefaultProbeInterval = 100 * time.Millisecond

// breaker fails calls fast while the backend is known to hang. A batch
// that runs out of its deadline opens it; a probe goroutine then asks the
// backend for one key every probe interval (bounded by the tier's
// timeout) and closes it at the first answer, so recovery takes at most
// one interval after the server answers again.
type breaker struct {
	open     atomic.Bool
	opens    atomic.Int64 // times opened (Stats.CircuitOpens)
	interval time.Duration
	log      *slog.Logger

	mu      sync.Mutex
	opened  chan struct{} // closed when the circuit opens (wakes waiters); replaced when it closes
	probing bool
	stop    chan struct{} // closed by Close: the probe ends
	since   time.Time
}

func newBreaker(interval time.Duration, log *slog.Logger) *breaker {
	return &breaker{interval: interval, log: log, opened: make(chan struct{}), stop: make(chan struct{})}
}

// check returns ErrCircuitOpen while the circuit is open. One atomic load.
func (b *breaker) check() error {
	if b.open.Load() {
		return ErrCircuitOpen
	}
	return nil
}

// Opened returns a channel closed when the circuit opens next (or is
// already closed while it is open): an import waiting on a fetch gives
// up when it is.
func (b *breaker) Opened() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.opened
}

// observe opens the circuit when a call on the backend ran out of its
// deadline (ctx done after the call, or an error that is a timeout).
func (b *breaker) observe(ctx context.Context, t *Tier, err error) {
	if ctx.Err() != context.DeadlineExceeded && !isTimeout(err) {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.stop:
		return // closed
	default:
	}
	if b.open.Load() {
		return
	}
	b.open.Store(true)
	b.opens.Add(1)
	b.since = time.Now()
	close(b.opened)
	b.log.Warn("omnicache tier: backend timed out; failing tier calls fast until it answers",
		"backend", t.b.String(), "probe_interval", b.interval)
	if !b.probing {
		b.probing = true
		go b.probe(t)
	}
}

// probe asks the backend for one key until it answers, then closes the
// circuit.
func (b *breaker) probe(t *Tier) {
	key := []string{t.Addr(0, 0)}
	tick := time.NewTicker(b.interval)
	defer tick.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), t.timeout)
		_, errs := t.b.Exists(ctx, key)
		late := ctx.Err() != nil
		cancel()
		if errs[0] == nil && !late {
			b.mu.Lock()
			// The line goes out before calls resume: whoever sees the circuit
			// closed finds it logged.
			b.log.Info("omnicache tier: backend answers again; tier calls resume",
				"backend", t.b.String(), "open_for", time.Since(b.since).Round(time.Millisecond))
			b.open.Store(false)
			b.opened = make(chan struct{})
			b.probing = false
			b.mu.Unlock()
			return
		}
		if errors.Is(errs[0], ErrClosed) {
			return
		}
	}
}

// close ends the probe.
func (b *breaker) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
}

// isTimeout reports whether err is (or wraps) a deadline or a network
// timeout.
func isTimeout(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}
