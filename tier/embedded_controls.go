// The embedded store's operator controls: Delete, Purge, Pin and Unpin.

package tier

import (
	"context"
	"fmt"
)

// Delete implements Deleter: it drops keys as an eviction would (counted
// in Usage's evicted).
func (e *Embedded) Delete(_ context.Context, keys []string) []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return closedErrs(len(keys))
	}
	for _, k := range keys {
		if x := e.find(e.hash(k), k); x >= 0 {
			e.remove(x)
			e.evicts++
		}
	}
	return make([]error, len(keys))
}

// Purge implements Purger: it removes every value whose key starts with
// prefix (a walk of the index under the store's lock; counted in Usage's
// evicted like Delete).
func (e *Embedded) Purge(_ context.Context, prefix string) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, ErrClosed
	}
	var drop []int32
	for _, head := range e.idx {
		for i := head; i >= 0; i = e.ents[i].coll {
			en := &e.ents[i]
			if k := e.bytesOf(en)[:en.klen]; len(k) >= len(prefix) && string(k[:len(prefix)]) == prefix {
				drop = append(drop, i)
			}
		}
	}
	for _, x := range drop {
		e.remove(x)
		e.evicts++
	}
	return len(drop), nil
}

// Pin implements Pinner: every key's value is kept (out of the eviction
// queues, never evicted) until Unpin or Delete; a Set of a pinned key
// keeps the new value pinned. A key not held is ErrMiss and then nothing
// is pinned (every key is checked first). Pinned bytes count in the
// bound: a Set that finds no room beside them fails with ErrNoRoom.
func (e *Embedded) Pin(_ context.Context, keys []string) []error {
	return e.control(keys, func(hs []uint64, errs []error) {
		xs := make([]int32, len(keys))
		failed := false
		for i, k := range keys {
			if xs[i] = e.find(hs[i], k); xs[i] < 0 {
				errs[i] = fmt.Errorf("%w: %s", ErrMiss, k)
				failed = true
			}
		}
		if failed {
			return
		}
		for _, x := range xs {
			if en := &e.ents[x]; !en.kept {
				e.unlink(x)
				en.kept = true
				e.pinned += int64(en.klen) + int64(en.vlen)
			}
		}
	})
}

// Unpin implements Pinner: the values go back to the eviction queues (the
// main one's head: they were kept for a reason). A key not held, or not
// pinned, is no error.
func (e *Embedded) Unpin(_ context.Context, keys []string) []error {
	return e.control(keys, func(hs []uint64, _ []error) {
		for i, k := range keys {
			if x := e.find(hs[i], k); x >= 0 && e.ents[x].kept {
				en := &e.ents[x]
				en.kept = false
				e.pinned -= int64(en.klen) + int64(en.vlen)
				e.push(x, qMain)
			}
		}
	})
}

// control runs f with keys' hashes and a nil error per key under the
// store's lock, and returns the errors f left; ErrClosed for every key
// once the store is closed.
func (e *Embedded) control(keys []string, f func(hs []uint64, errs []error)) []error {
	errs := make([]error, len(keys))
	hs := e.hashKeys(keys)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return closedErrs(len(keys))
	}
	f(hs, errs)
	return errs
}

// Pinned reports the bytes of pinned values (in Usage's used).
func (e *Embedded) Pinned() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pinned
}
