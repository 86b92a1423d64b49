// Operator controls: Pin, Unpin, Delete and Purge.

package tier

import (
	"context"
	"errors"
	"fmt"
)

// Pin keeps every key's value of blocks hashes from eviction (see
// Pinner) until Unpin or Delete. A block the tier does not hold (every key
// of it) fails with ErrMiss naming it; the embedded store then pins
// nothing, Redis checks every value first (one pipelined EXISTS) and pins
// nothing when one is missing (a value evicted between the check and the
// pin fails alone). ErrUnsupported when the backend is not a Pinner. The
// error joins the failures.
func (t *Tier) Pin(ctx context.Context, hashes []uint64) error {
	return t.pin(ctx, hashes, true)
}

// Unpin makes blocks hashes evictable again (on Redis: they get
// RedisOptions.TTL again, when set). A block not held or not pinned is no
// error. ErrUnsupported when the backend is not a Pinner.
func (t *Tier) Unpin(ctx context.Context, hashes []uint64) error {
	return t.pin(ctx, hashes, false)
}

func (t *Tier) pin(ctx context.Context, hashes []uint64, pin bool) error {
	p, ok := t.b.(Pinner)
	if !ok {
		return fmt.Errorf("%w: backend %s cannot pin", ErrUnsupported, t.b)
	}
	if err := t.brk.check(); err != nil {
		return err
	}
	keys := t.addrs(hashes)
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	var errs []error
	if pin {
		errs = p.Pin(ctx, keys)
	} else {
		errs = p.Unpin(ctx, keys)
	}
	t.brk.observe(ctx, t, firstErr(errs))
	var failed []error
	for i, err := range errs {
		if err != nil && len(failed) < 4 {
			failed = append(failed, fmt.Errorf("tier: pin %v %s: %w", pin, keys[i], err))
		}
	}
	return errors.Join(failed...)
}

// Delete removes every key's value of blocks hashes from the backend
// (ErrUnsupported, which matches ErrConfig too, when it cannot delete: not
// a Deleter). Pinned values are deleted too. The error joins the
// failures.
func (t *Tier) Delete(ctx context.Context, hashes []uint64) error {
	d, ok := t.b.(Deleter)
	if !ok {
		return fmt.Errorf("%w: %w: backend %s cannot delete", ErrUnsupported, ErrConfig, t.b)
	}
	keys := t.addrs(hashes)
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	var failed []error
	for i, err := range d.Delete(ctx, keys) {
		if err != nil && len(failed) < 4 {
			failed = append(failed, fmt.Errorf("tier: delete %s: %w", keys[i], err))
		}
	}
	return errors.Join(failed...)
}

// CanPurge reports whether the backend can purge a namespace (Purger).
func (t *Tier) CanPurge() bool {
	_, ok := t.b.(Purger)
	return ok
}

// Purge removes every value of the tier's namespace from the backend
// (ErrConfig when it cannot: not a Purger) and forgets the blocks stored
// lately; it returns how many values it removed. Other namespaces are
// left alone. Bounded by ctx, not by Options.Timeout (a store of many
// values takes many round trips).
func (t *Tier) Purge(ctx context.Context) (int, error) {
	p, ok := t.b.(Purger)
	if !ok {
		return 0, fmt.Errorf("%w: backend %s cannot purge a namespace", ErrConfig, t.b)
	}
	n, err := p.Purge(ctx, t.prefix)
	t.ForgetRecent()
	return n, err
}
