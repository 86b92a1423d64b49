// The store's contract: Backend and the optional capabilities the tier
// asks a backend for (Purger, Deleter, Pinner, Leader).

package tier

import (
	"context"
	"errors"
)

// Backend stores raw values by address. Implementations: *Embedded, *Redis.
// A Backend is safe for concurrent use.
type Backend interface {
	// Get returns the value of each key, nil where it holds none; errs[i]
	// (wrapping ErrUnavailable) where the backend failed for key i.
	// vals and errs have len(keys) entries. The returned values are the
	// caller's.
	Get(ctx context.Context, keys []string) (vals [][]byte, errs []error)
	// Set stores vals[i] under keys[i]; errs[i] where it failed. Once it
	// returns with no error the backend holds no reference to keys or
	// vals: the caller may reuse them (the embedded store copies them, a
	// server has acknowledged them).
	Set(ctx context.Context, keys []string, vals [][]byte) (errs []error)
	// Exists reports which keys hold a value; errs[i] where it failed. It
	// may answer from key hashes (Embedded does, 64 bits): a key reported
	// held that is not costs a block that Get then misses (Lookup
	// overcounts, the import fails for that block), never a wrong value.
	Exists(ctx context.Context, keys []string) (held []bool, errs []error)
	// Close releases the backend's connections. Later calls fail with
	// ErrClosed.
	Close() error
	// String names the backend for reports ("embedded", "redis://h:p").
	String() string
}

// Purger is a Backend that can remove every value whose address starts
// with a prefix (a namespace: Tier.Purge). Both backends here can: the
// embedded store walks its index, Redis scans each node (SCAN MATCH, DEL).
type Purger interface {
	// Purge removes every key starting with prefix and returns how many.
	Purge(ctx context.Context, prefix string) (int, error)
}

// Deleter is a Backend that can remove values by address (both backends
// here can). The tier deletes a value that failed its checks through it,
// so that Lookup stops reporting the block.
type Deleter interface {
	// Delete removes keys; errs[i] where it failed. A key not held is no
	// error.
	Delete(ctx context.Context, keys []string) (errs []error)
}

// Pinner is a Backend that can keep values from eviction (both backends
// here can): the embedded store never evicts a pinned value; Redis
// stores it without an expiry (RedisOptions.TTL), so that a server whose
// maxmemory-policy is volatile-lru or volatile-ttl never evicts it either.
type Pinner interface {
	// Pin keeps keys; errs[i] where it failed (ErrMiss: key i is not
	// held). The embedded store pins nothing when any key fails.
	Pin(ctx context.Context, keys []string) (errs []error)
	// Unpin makes keys evictable again; a key not held or not pinned is
	// no error.
	Unpin(ctx context.Context, keys []string) (errs []error)
}

// ErrUnsupported: the backend lacks the capability a call needs (Pin and
// Unpin need a Pinner, Delete a Deleter).
var ErrUnsupported = errors.New("tier: the backend cannot do that")

// Leader is a Backend that counts the leading addresses it holds itself,
// stopping at the first it lacks: Lookup (the scheduler's query, on the
// engine goroutine) asks it instead of Exists, and it need not format,
// allocate or probe an address past that first miss. Embedded is one: it
// formats each address into a stack buffer and probes its index by the
// address's hash, a group at a time, with no allocation. A store that
// answers from memory can implement it, as can a wrapper around one
// (forwarding it keeps the fast path); a store over a network gains
// little over Exists' one pipelined batch.
//
// Lookup calls Leading with the caller's ctx, outside Options.Timeout and
// the circuit breaker: it is meant to answer from memory, at most after a
// lock's wait.
type Leader interface {
	// Leading returns n such that addresses 0..n-1 of addrs are held
	// and, when n < addrs.Len(), address n is not. A failure returns
	// its error (ErrClosed for a closed store) with the addresses found
	// held before it. Like Exists it may answer from hashes of the
	// addresses.
	Leading(ctx context.Context, addrs Addrs) (int, error)
}

// Addrs are a Lookup's value addresses, block-major (every key of a block
// in Namespace.Keys order, then the next block's), formatted on demand
// into the caller's buffer: Leader.Leading formats only those it probes.
type Addrs struct {
	t      *Tier
	hashes []uint64
}

// Len is the number of addresses: blocks × keys.
func (a Addrs) Len() int {
	if a.t == nil {
		return 0
	}
	return len(a.hashes) * len(a.t.ns.Keys)
}

// Append appends address i (0 <= i < Len) to b and returns the extended
// buffer, as append does.
func (a Addrs) Append(b []byte, i int) []byte {
	nk := len(a.t.ns.Keys)
	return a.t.appendAddr(b, a.hashes[i/nk], i%nk)
}
