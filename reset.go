package omnicache

import (
	"context"
	"fmt"
)

// ResetOptions says what Reset drops besides the cache's own rows.
type ResetOptions struct {
	// PurgeTier also removes every value of the tier's namespace from the
	// shared store (tier.Tier.Purge; the backend must be a tier.Purger),
	// for every replica. Without it the shared store is left alone: a
	// change of weights should come with a new namespace (its Model), so
	// that no replica imports rows of the old weights.
	PurgeTier bool
}

// Reset drops every row the cache holds, as an engine does after a weight
// update or a reset of its prefix cache: first it writes out the decode
// buffer and waits until every device→host write in flight has landed
// (bounded by Config.WaitTimeout), then it marks every slot of every key
// never written. Afterwards a hit over any block finds its rows absent
// (ErrAbsentRequired for a required key, zeros for an optional one) and a
// read planned before fails; steps saved before it and not consumed yet
// fail at Materialize with ErrReset (Discard still consumes them), and
// their pages and pins go back then, as for any step. With a tier, the
// blocks queued for publishing are dropped (counted in
// Stats.TierPublishDropped), stores in flight are waited for (bounded by
// WaitTimeout), and the tier forgets what it stored lately; the shared
// store is left alone unless opt.PurgeTier (bounded by ctx).
//
// Like vLLM's reset_prefix_cache, it needs every request gone: with a
// request live, or between Begin and Save, it returns ErrSequence and
// changes nothing. A closed cache returns ErrClosed; after a sticky write
// failure it returns that failure. Engine goroutine only.
func (c *Cache) Reset(ctx context.Context, opt ResetOptions) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.leave()
	if err := c.check(); err != nil {
		return err
	}
	e := &c.eng
	if e.begun {
		return fmt.Errorf("%w: Reset between Begin and Save", ErrSequence)
	}
	if n := e.requests.Len(); n > 0 {
		return fmt.Errorf("%w: Reset with %d live requests: finish or abort them first", ErrSequence, n)
	}
	if opt.PurgeTier && c.tl == nil {
		return fmt.Errorf("%w: ResetOptions.PurgeTier without a tier", ErrConfig)
	}
	if opt.PurgeTier && !c.tl.Store().CanPurge() {
		return fmt.Errorf("%w: ResetOptions.PurgeTier: tier %s cannot purge a namespace", ErrConfig, c.tl.Store())
	}
	// Every write handed over lands, then the committer drops every row,
	// in queue order (writer.Path.Reset).
	c.resetFence.Store(uint64(e.nextStep))
	if err := c.path.Reset(); err != nil {
		return err
	}
	c.resets.Add(1)
	if c.tl == nil {
		return nil
	}
	if err := c.tl.Reset(c.cfg.WaitTimeout); err != nil {
		return err
	}
	if opt.PurgeTier {
		if _, err := c.tl.Store().Purge(ctx); err != nil {
			return fmt.Errorf("omnicache: Reset: the cache's rows are dropped; purging the tier failed: %w", err)
		}
	}
	return nil
}
