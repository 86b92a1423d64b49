// The publish barrier: with Config.Barrier, every block noted for
// publishing has an outcome (stored, or why not) that WaitPublished waits
// for, so that a prefill instance reports a request's KV transferred only
// once its rows are in the tier too.

package tierlink

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Why a noted block was not published (PublishError.Err wraps one of
// these, or the store's own error).
var (
	ErrPublishDropped    = errors.New("the publish queue was full")
	ErrPublishSkipped    = errors.New("its rows were not all committed when its write landed")
	ErrPublishUnadmitted = errors.New("seen fewer times than AdmitAfter")
	ErrPublishAbandoned  = errors.New("the cache was reset or closed before it was stored")
	ErrPublishUnknown    = errors.New("never noted for publishing, or forgotten since")
)

// PublishError is a block WaitPublished found not published.
type PublishError struct {
	Hash uint64
	Err  error
}

func (e *PublishError) Error() string { return fmt.Sprintf("block %016x: %v", e.Hash, e.Err) }
func (e *PublishError) Unwrap() error { return e.Err }

var errNoBarrier = errors.New("tierlink: WaitPublished without Config.Barrier")

// barrierKeep is how many resolved outcomes the barrier remembers (about
// 48 bytes each): an engine asks for a request's blocks right after it
// finished, while their outcomes are among the latest.
const barrierKeep = 1 << 16

// barrier tracks the outcome of every block noted for publishing.
type barrier struct {
	mu     sync.Mutex
	blocks map[uint64]*outcome
	// order lists the resolutions, oldest first, for forgetting: a block
	// resolved again since an entry (its seq moved on) is not forgotten
	// by that entry.
	order   []resolution
	seq     uint64
	changed chan struct{}
}

type resolution struct{ hash, seq uint64 }

type outcome struct {
	noted time.Time
	// pending counts notes not resolved yet (a block noted by two steps
	// before it was stored); err is the last resolution's error.
	pending int
	done    bool
	err     error
	seq     uint64 // its latest entry in order
}

func newBarrier() *barrier {
	return &barrier{blocks: map[uint64]*outcome{}, changed: make(chan struct{})}
}

// note records hashes as noted for publishing now. Engine goroutine.
func (b *barrier) note(hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	now := time.Now()
	b.mu.Lock()
	for _, h := range hashes {
		o := b.blocks[h]
		if o == nil {
			o = &outcome{}
			b.blocks[h] = o
		}
		if o.pending == 0 {
			o.noted = now
		}
		o.pending++
		o.done = false
	}
	b.mu.Unlock()
}

// unnote takes back notes of hashes not resolved yet (an aborted step's).
func (b *barrier) unnote(hashes []uint64) {
	b.mu.Lock()
	for _, h := range hashes {
		if o := b.blocks[h]; o != nil && o.pending > 0 {
			o.pending--
			if o.pending == 0 && !o.done {
				delete(b.blocks, h)
			}
		}
	}
	b.mu.Unlock()
	b.wake()
}

// resolve records the outcome of one note of each of hashes (err nil:
// stored) and returns the time since each was noted through lag.
func (b *barrier) resolve(hashes []uint64, err error, lag func(time.Duration)) {
	now := time.Now()
	b.mu.Lock()
	for _, h := range hashes {
		o := b.blocks[h]
		if o == nil {
			continue // noted before the barrier forgot it
		}
		if o.pending > 0 {
			o.pending--
		}
		if err == nil && lag != nil {
			lag(now.Sub(o.noted))
		}
		o.err = err
		if o.pending == 0 && !o.done {
			o.done = true
			b.record(h, o)
		}
	}
	b.forgetLocked()
	b.mu.Unlock()
	b.wake()
}

// record appends block h's resolution to order.
func (b *barrier) record(h uint64, o *outcome) {
	b.seq++
	o.seq = b.seq
	b.order = append(b.order, resolution{h, b.seq})
}

// forgetLocked drops the oldest resolved outcomes past barrierKeep (an
// outcome resolved again since keeps its latest).
func (b *barrier) forgetLocked() {
	if len(b.order) <= barrierKeep {
		return
	}
	n := len(b.order) - barrierKeep
	for _, r := range b.order[:n] {
		if o := b.blocks[r.hash]; o != nil && o.done && o.pending == 0 && o.seq == r.seq {
			delete(b.blocks, r.hash)
		}
	}
	b.order = b.order[:copy(b.order, b.order[n:])]
}

// abandon resolves every note still pending (the link closed).
func (b *barrier) abandon() {
	b.mu.Lock()
	for h, o := range b.blocks {
		if !o.done {
			o.pending, o.done, o.err = 0, true, ErrPublishAbandoned
			b.record(h, o)
		}
	}
	b.mu.Unlock()
	b.wake()
}

// wake tells the waiters an outcome changed.
func (b *barrier) wake() {
	b.mu.Lock()
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

// WaitPublished returns once every block of hashes is in the tier: stored
// by this link's publishers since it was last noted, or (a block no
// outcome is known of) stored through this tier lately
// (Store.StoredRecently). It fails with a *PublishError for the first
// block that was not published, or with ctx's error, naming the blocks
// still in flight. Any goroutine.
func (l *Link) WaitPublished(ctx context.Context, hashes []uint64) error {
	b := l.bar
	if b == nil {
		return errNoBarrier
	}
	for {
		pending := 0
		b.mu.Lock()
		ch := b.changed
		var first error
		for _, h := range hashes {
			o := b.blocks[h]
			switch {
			case o == nil:
				if !l.t.StoredRecently(h) {
					first = &PublishError{Hash: h, Err: ErrPublishUnknown}
				}
			case !o.done:
				pending++
			case o.err != nil:
				first = &PublishError{Hash: h, Err: o.err}
			}
			if first != nil {
				break
			}
		}
		b.mu.Unlock()
		switch {
		case first != nil:
			return first
		case pending == 0:
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%d of %d blocks not stored yet: %w", pending, len(hashes), ctx.Err())
		}
	}
}
