// Storing blocks: Put, the in-place NewValue/PutValues path and the
// value buffers it recycles.

package tier

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Block is one full block to store: its chained hash and, per key
// (Namespace.Keys order), BlockSize rows.
type Block struct {
	Hash uint64
	Rows [][]byte
}

// Put stores blocks (every key of each) in one pipelined batch and returns
// the value bytes stored; the error joins the failures (ErrUnavailable,
// ErrTooLarge). A block with rows of the wrong size is ErrConfig and
// nothing is stored.
func (t *Tier) Put(ctx context.Context, blocks []Block) (int64, error) {
	nk := len(t.ns.Keys)
	for _, b := range blocks {
		if len(b.Rows) != nk {
			return 0, fmt.Errorf("%w: block %016x has %d keys' rows, the namespace %d", ErrConfig, b.Hash, len(b.Rows), nk)
		}
		for k, r := range b.Rows {
			if len(r) != t.BlockBytes(k) {
				return 0, fmt.Errorf("%w: block %016x key %q: %d bytes, a block is %d", ErrConfig, b.Hash, t.ns.Keys[k].Name, len(r), t.BlockBytes(k))
			}
		}
	}
	hashes := make([]uint64, 0, len(blocks))
	vals := make([][]byte, 0, len(blocks)*nk)
	for _, b := range blocks {
		hashes = append(hashes, b.Hash)
		for k, r := range b.Rows {
			key := t.ns.Keys[k]
			vals = append(vals, t.seal.encode(make([]byte, 0, t.ValueBytes(k)), t.Addr(b.Hash, k), b.Hash, t.ns.BlockSize, key.RowBytes, r))
		}
	}
	return t.put(ctx, hashes, vals)
}

// NewValue returns a value of block hash's rows of key k, built in place:
// its header is written and rows (BlockBytes(k) bytes, inside val) is where
// the caller puts the rows (every byte: the buffer may be recycled) before
// handing val to PutValues, or back with Recycle. It spares Put's copy of
// the rows, and its buffers come back from PutValues.
func (t *Tier) NewValue(hash uint64, k int) (val, rows []byte) {
	key := t.ns.Keys[k]
	val = t.pools[k].get(t.ValueBytes(k))
	h := t.seal.encodeHeader(val[:0], t.tmpl[k], hash, t.ns.BlockSize, key.RowBytes)
	putHex(h[len(h)-len(t.tmpl[k])+len(t.prefix):], hash) // the template's address, this block's hash
	return val, val[len(h) : len(h)+t.BlockBytes(k)]
}

// Recycle hands values made by NewValue back unstored (block k-major as in
// PutValues: vals[i] is of key i%nk); nil entries are skipped.
func (t *Tier) Recycle(vals [][]byte) {
	nk := len(t.ns.Keys)
	for i, v := range vals {
		if v != nil && len(v) == t.ValueBytes(i%nk) {
			t.pools[i%nk].put(v)
		}
	}
}

// PutValues seals and stores values made by NewValue, vals[j*nk+k] being
// block hashes[j]'s value of key k, in one pipelined batch (see Put). The
// values are the tier's from then on: once every one is stored (the
// backend copied it, or the server acknowledged it) they are recycled by
// later NewValue calls; after a failure they are left to the garbage
// collector (a timed-out request may still be on its way).
func (t *Tier) PutValues(ctx context.Context, hashes []uint64, vals [][]byte) (int64, error) {
	nk := len(t.ns.Keys)
	if len(vals) != len(hashes)*nk {
		return 0, fmt.Errorf("%w: %d values for %d blocks of %d keys", ErrConfig, len(vals), len(hashes), nk)
	}
	for i, v := range vals {
		if len(v) != t.ValueBytes(i%nk) {
			return 0, fmt.Errorf("%w: value %d of %d bytes, want %d", ErrConfig, i, len(v), t.ValueBytes(i%nk))
		}
		t.seal.seal(v)
	}
	n, err := t.put(ctx, hashes, vals)
	if err == nil {
		t.Recycle(vals)
	}
	return n, err
}

// put stores encoded values, block-major.
func (t *Tier) put(ctx context.Context, hashes []uint64, vals [][]byte) (int64, error) {
	if err := t.brk.check(); err != nil {
		t.putErrs.Add(int64(len(vals)))
		return 0, err
	}
	keys := t.addrs(hashes)
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	t0 := t.start()
	errs := t.b.Set(ctx, keys, vals)
	if t.h != nil {
		since(t.h.set, t0)
	}
	t.brk.observe(ctx, t, firstErr(errs))
	var stored int64
	var failed []error
	for i, err := range errs {
		if err != nil {
			t.putErrs.Add(1)
			if len(failed) < 4 {
				failed = append(failed, fmt.Errorf("tier: put %s: %w", keys[i], err))
			}
			continue
		}
		stored += int64(len(vals[i]))
		t.puts.Add(1)
	}
	t.bytesPut.Add(stored)
	if t.h != nil {
		t.h.setBytes.Observe(stored)
	}
	if t.recent.window > 0 {
		nk, now := len(t.ns.Keys), nowTick()
	blocks:
		for j, h := range hashes {
			for _, err := range errs[j*nk : (j+1)*nk] {
				if err != nil {
					continue blocks
				}
			}
			t.recent.note(h, now)
		}
	}
	return stored, errors.Join(failed...)
}

// valuePool recycles one key's value buffers: a publisher stream then
// allocates nothing per value (no garbage to collect, no fresh pages to
// fault in). It keeps at most poolBytes of them.
type valuePool struct {
	mu   sync.Mutex
	free [][]byte
	max  int
}

const poolBytes = 64 << 20

func (p *valuePool) get(size int) []byte {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		v := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return v
	}
	p.mu.Unlock()
	return make([]byte, size)
}

func (p *valuePool) put(v []byte) {
	p.mu.Lock()
	if len(p.free) < p.max {
		p.free = append(p.free, v)
	}
	p.mu.Unlock()
}
