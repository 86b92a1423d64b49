// Reading blocks: Lookup (how many leading blocks are held), Get and
// Fetch (the rows, checked), and the deletion of values that fail their
// checks.

package tier

import (
	"context"
	"fmt"
	"time"
)

// Lookup returns how many leading blocks of hashes the tier holds (every
// key of each): from a Leader (the embedded store) a few keys at a time,
// stopping at the first it lacks, with no allocation; from any other
// backend (a server) in one pipelined Exists batch. It checks presence
// only: a value that is corrupt, or evicted before it is fetched, is found
// missing by Get. A backend failure is returned with the blocks counted
// before it.
func (t *Tier) Lookup(ctx context.Context, hashes []uint64) (int, error) {
	t.lookups.Add(1)
	if len(hashes) == 0 {
		return 0, nil
	}
	nk := len(t.ns.Keys)
	if t.h != nil {
		defer since(t.h.lookup, time.Now())
	}
	if l, ok := t.b.(Leader); ok {
		held, err := l.Leading(ctx, Addrs{t, hashes})
		// A block counts when every key of it is held; a count out of
		// range (a faulty Leader) is clamped to the blocks asked.
		n := min(max(held, 0)/nk, len(hashes))
		t.lookupBlocks.Add(int64(n))
		if err != nil {
			return n, fmt.Errorf("tier: lookup %s: %w", t.Addr(hashes[min(n, len(hashes)-1)], 0), err)
		}
		return n, nil
	}
	if err := t.brk.check(); err != nil {
		return 0, fmt.Errorf("tier: lookup %s: %w", t.Addr(hashes[0], 0), err)
	}
	keys := t.addrs(hashes)
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	held, errs := t.b.Exists(ctx, keys)
	t.brk.observe(ctx, t, firstErr(errs))
	for i := range keys {
		if errs[i] != nil || !held[i] {
			n := i / nk
			t.lookupBlocks.Add(int64(n))
			if errs[i] != nil {
				return n, fmt.Errorf("tier: lookup %s: %w", keys[i], errs[i])
			}
			return n, nil
		}
	}
	t.lookupBlocks.Add(int64(len(hashes)))
	return len(hashes), nil
}

// Get fetches blocks hashes into dst, in one pipelined batch: dst[j*nk+k]
// (nk = len(Namespace.Keys)) receives block j's rows of key k
// (BlockBytes(k) bytes). It returns per block nil (every key served) or why
// not (ErrMiss, possibly with ErrCorrupt or ErrUnavailable); a block not
// served leaves its dst contents undefined. Never a wrong row: every value
// is checked against its header and checksum before it is copied.
func (t *Tier) Get(ctx context.Context, hashes []uint64, dst [][]byte) []error {
	nk := len(t.ns.Keys)
	if len(dst) != len(hashes)*nk {
		panic(fmt.Sprintf("tier: Get of %d blocks into %d buffers (%d keys)", len(hashes), len(dst), nk))
	}
	rows, errs := t.Fetch(ctx, hashes)
	for i, r := range rows {
		if errs[i/nk] != nil {
			continue
		}
		if len(dst[i]) != len(r) {
			panic(fmt.Sprintf("tier: Get buffer of %d bytes for block %016x key %q of %d", len(dst[i]), hashes[i/nk], t.ns.Keys[i%nk].Name, len(r)))
		}
		copy(dst[i], r)
	}
	return errs
}

// Fetch is Get without the copy: rows[j*nk+k] is block j's rows of key k,
// a view into the value fetched (the caller's: every backend returns
// copies), nil where block j was not served (errs[j] says why).
func (t *Tier) Fetch(ctx context.Context, hashes []uint64) (rows [][]byte, errs []error) {
	rows, errs, _ = t.FetchInto(ctx, hashes, nil)
	return rows, errs
}

// FetchInto is Fetch into buf where the backend copies values into a
// caller's buffer (the embedded store; it allocates one when buf is nil or
// too small): used is then the buffer the rows are views into, which the
// caller may hand to a later FetchInto once it is done with them. Other
// backends return fresh values and used nil. A buffer reused keeps its
// pages: a fresh one is faulted in by the copy, page by page (in a VM the
// import's largest cost: 12 MiB takes tens of ms there, against well under
// one ms into memory already touched).
func (t *Tier) FetchInto(ctx context.Context, hashes []uint64, buf []byte) (rows [][]byte, errs []error, used []byte) {
	nk := len(t.ns.Keys)
	if err := t.brk.check(); err != nil {
		t.errs.Add(int64(len(hashes) * nk))
		errs = make([]error, len(hashes))
		for j := range errs {
			errs[j] = err
		}
		return make([][]byte, len(hashes)*nk), errs, nil
	}
	keys := t.addrs(hashes)
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	t0 := t.start()
	var vals [][]byte
	var berrs []error
	if e, ok := t.b.(*Embedded); ok {
		vals, berrs, used = e.getInto(keys, buf)
	} else {
		vals, berrs = t.b.Get(ctx, keys)
	}
	if t.h != nil {
		since(t.h.get, t0)
		var n int64
		for _, v := range vals {
			n += int64(len(v))
		}
		t.h.getBytes.Observe(n)
	}
	t.brk.observe(ctx, t, firstErr(berrs))
	rows = make([][]byte, len(keys))
	errs = make([]error, len(hashes))
	var bad []string // values that failed their checks
	for i := range keys {
		j, k := i/nk, i%nk
		var err error
		key := t.ns.Keys[k]
		switch {
		case berrs[i] != nil:
			t.errs.Add(1)
			err = fmt.Errorf("%w: %w", ErrMiss, berrs[i])
		case vals[i] == nil:
			t.misses.Add(1)
			err = fmt.Errorf("%w: %s", ErrMiss, keys[i])
		default:
			rows[i], err = t.seal.decode(vals[i], keys[i], hashes[j], t.ns.BlockSize, key.RowBytes)
			if err != nil {
				t.corrupt.Add(1)
				err = fmt.Errorf("%s: %w", keys[i], err)
				bad = append(bad, keys[i])
				break
			}
			t.hits.Add(1)
			t.bytesGot.Add(int64(len(rows[i])))
		}
		if err != nil && errs[j] == nil {
			errs[j] = err
		}
	}
	for j, err := range errs {
		if err != nil {
			clear(rows[j*nk : (j+1)*nk]) // a block is served whole or not at all
		}
	}
	if len(bad) > 0 {
		t.deleteCorrupt(ctx, bad)
	}
	return rows, errs, used
}

// deleteCorrupt removes values that failed their checks, so that Lookup
// stops counting their blocks and the next import misses at once instead
// of fetching them again. A value republished between the fetch and the
// delete is deleted too: one more miss, never a wrong row.
func (t *Tier) deleteCorrupt(ctx context.Context, keys []string) {
	d, ok := t.b.(Deleter)
	if !ok {
		return
	}
	for _, err := range d.Delete(ctx, keys) {
		if err == nil {
			t.corruptDeleted.Add(1)
		}
	}
}
