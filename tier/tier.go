// Package tier is a content-addressed store of per-token outputs, one full
// KV block's rows of one key per value, shared by engine replicas: the rows
// follow the KV when a KV store or connector hands a replica a prefix that
// another replica computed.
//
// # Addresses
//
// A value's address is
//
//	oc:{<model>/<layout>/b<block size>/<hash>}:<key name>
//
// where model is the namespace's model id (no braces), layout a
// fingerprint of the key layout (SHA-256 of every key's name and row
// bytes, in order, 16 hex digits), hash the engine's
// chained block hash (16 hex digits; it already covers the whole prefix and
// its multimodal inputs) and key name the key. The braces are a Redis
// Cluster hash tag: every key of one block lives on one node, so losing a
// node loses whole blocks.
//
// # Values
//
// A value carries a header (format version, row bytes, block size, the
// block hash and the value's own address), the block's rows and a seal: a
// crc32c checksum, or with Options.Secret a keyed MAC (value.go). A value
// read from any address but its own (copied under another model's
// namespace, say), or that fails any other check, is a miss (ErrCorrupt,
// which matches ErrMiss) and is never served; the tier deletes it from a
// backend that can (Deleter), so the next Lookup misses it too. So is a
// value the backend evicted or lost with a node (ErrUnavailable, which
// matches ErrMiss too).
//
// # Backends
//
// Embedded (NewEmbedded): an in-process store bounded in bytes, evicting
// by S3-FIFO or LRU (Policy); the default. Redis (NewRedis): a single node or
// a Redis Cluster through github.com/redis/rueidis, every batch one
// pipelined DoMulti, with ACL user/password and TLS options. Open builds
// either from a spec string ("embedded", "redis://...", "rediss://...",
// "redis-cluster://...").
//
// What a backend may do besides Backend's calls is an optional interface
// the tier asks for: Leader (Lookup without formatting every address),
// Purger, Deleter and Pinner. A Backend of one's own, or a wrapper around
// one of these, implements those it can.
//
// # Operator controls
//
// Options.Histograms records every batch's latency and bytes
// (Histograms); Pin, Unpin and Delete keep or drop blocks by hash
// (optional backend interfaces Pinner and Deleter; ErrUnsupported
// without them); RedisOptions.TTL expires unpinned values on Redis;
// Sightings counts how often blocks were seen, for the cache's
// admission (omnicache.TierConfig.AdmitAfter). docs/tier.md has the
// operator's view.
//
// # Goroutines
//
// A Tier is safe for concurrent use by any number of goroutines. In a
// cache, Lookup runs on the engine goroutine (the scheduler's query),
// Fetch on the importer goroutines, NewValue on the committer (it gathers
// committed rows into values) and PutValues on the publisher goroutines.
// A Tier owns its Backend (Close closes it), the value buffers PutValues
// hands back to NewValue, and its counters; the rows a call fills or
// returns are the caller's.
package tier

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Errors, wrapped with the details of the case; test with errors.Is.
var (
	// ErrMiss: the tier does not hold a valid value for the block: it was
	// never stored, the backend evicted it, it failed its checks
	// (ErrCorrupt) or its node cannot be reached (ErrUnavailable).
	ErrMiss = errors.New("tier: block not held")
	// ErrCorrupt: a stored value failed its header or checksum check (it
	// is treated as a miss: errors.Is(err, ErrMiss) holds too).
	ErrCorrupt = errors.New("tier: value failed its checks")
	// ErrUnavailable: the backend could not be reached or answered with an
	// error (a node down, a timeout). For a read it is a miss as well.
	ErrUnavailable = errors.New("tier: backend unavailable")
	// ErrAuth: the backend refused the credentials (wrong password or ACL
	// user, or a password is required).
	ErrAuth = errors.New("tier: authentication failed")
	// ErrConfig: a bad namespace, option or spec string.
	ErrConfig = errors.New("tier: bad configuration")
	// ErrClosed: the tier or its backend was closed.
	ErrClosed = errors.New("tier: closed")
	// ErrTooLarge: a value larger than the embedded store's whole capacity
	// is not stored.
	ErrTooLarge = errors.New("tier: value larger than the store")
	// ErrNoRoom: the embedded store found no room for a value because the
	// bytes it may hold are all reserved by values other Sets are copying
	// in (a store a few values large, under concurrent publishers), or the
	// OS refused the memory of a new slab (an address-space limit such as
	// ulimit -v); the value is not stored.
	ErrNoRoom = errors.New("tier: no room beside the values being stored")
)

// Key is one per-token output the tier stores: its name and row size.
type Key struct {
	Name     string
	RowBytes int
}

// Namespace is what, besides the block hash and key name, addresses a value:
// two caches share values only when their namespaces are equal.
type Namespace struct {
	// Model identifies the model (and anything else that changes the rows
	// for the same tokens, e.g. its revision or dtype).
	Model string
	// BlockSize is the engine's KV block size in tokens.
	BlockSize int
	// Keys is the key layout, in the cache's key order.
	Keys []Key
}

// Options configures a Tier.
type Options struct {
	// Timeout bounds one batch (Put, Get, Lookup) on the backend; 0:
	// DefaultTimeout.
	Timeout time.Duration
	// RecentWindow is how long a block stored through the tier counts as
	// held for StoredRecently (publishers skip such blocks); 0:
	// DefaultRecentWindow, negative: never (every block is stored). At
	// most MaxRecentWindow.
	RecentWindow time.Duration
	// Secret, when set (at least MinSecretBytes), seals every value with a
	// keyed MAC (HMAC-SHA256, 16 bytes) instead of a crc32c checksum: a
	// value not written by a tier holding the same secret fails its check.
	// Set it where others can write to the store; every replica sharing
	// values needs the same secret (a value sealed one way is corrupt to a
	// tier set the other way). BenchmarkSeal shows its cost per block.
	Secret []byte
	// ProbeInterval is how often, while the circuit is open (a batch ran
	// out of Timeout: see ErrCircuitOpen), a background probe asks the
	// backend for one key; the first answer closes the circuit. 0:
	// DefaultProbeInterval.
	ProbeInterval time.Duration
	// Logger receives a line when the circuit opens and when it closes
	// (nil: slog.Default()).
	Logger *slog.Logger
	// Histograms records every batch's latency and bytes into lock-free
	// histograms (Tier.Histograms): a clock read and a few atomic adds per
	// batch.
	Histograms bool
	// SightingCounters sizes the sketch of block sightings admission uses
	// (Tier.Sightings; made on first use): counters per row, rounded up to
	// a power of two, 16 bytes each (4 rows); 0: DefaultSightingCounters
	// (4 MiB). At most MaxSightingCounters.
	SightingCounters int
}

// DefaultTimeout bounds a batch when Options.Timeout is zero.
const DefaultTimeout = 2 * time.Second

// Limits New enforces.
const (
	MaxBlockSize  = 1 << 20 // Namespace.BlockSize
	MaxNameBytes  = 4096    // Namespace.Model and each Key.Name
	MaxValueBytes = 1 << 31 // one block's rows of one key (BlockSize × RowBytes)
)

// Stats are a tier's cumulative counters.
type Stats struct {
	Puts, PutErrors             int64 // values stored / that failed to store
	BytesPut                    int64 // value bytes stored
	Hits, Misses, Corrupt, Errs int64 // values read: served / absent / failed checks / backend errors
	CorruptDeleted              int64 // values that failed their checks and were deleted from the backend
	CircuitOpens                int64 // times a backend timeout opened the circuit (ErrCircuitOpen)
	CircuitOpen                 bool  // the circuit is open now: calls fail at once
	BytesGot                    int64 // row bytes served
	Lookups, LookupBlocks       int64 // Lookup calls / leading blocks they found
}

// Tier is the content-addressed store over a backend.
type Tier struct {
	b       Backend
	ns      Namespace
	prefix  string   // "oc:{model/layout/bN/"
	tmpl    []string // per key: its addresses, hash digits zero (prefix, 16 digits, "}:", name)
	timeout time.Duration
	seal    *sealer
	brk     *breaker

	pools []valuePool // per key: NewValue's buffers, back from PutValues

	recent recent     // blocks stored lately (StoredRecently)
	h      *tierHists // nil: Options.Histograms off

	sightOnce sync.Once
	sight     *Sightings
	sightW    int

	// The counters, each writer's on lines of their own: the publishers
	// bump puts on every batch, the importers hits, the scheduler's Lookup
	// (the engine goroutine) lookups, and every one of them reads the
	// fields above.
	_                                     [128]byte
	puts, putErrs, bytesPut               atomic.Int64
	_                                     [128]byte
	hits, misses, corrupt, errs, bytesGot atomic.Int64
	corruptDeleted                        atomic.Int64
	_                                     [128]byte
	lookups, lookupBlocks                 atomic.Int64
	_                                     [128]byte
}

// New returns a tier over b for namespace ns. The tier owns b: Close closes
// it.
func New(b Backend, ns Namespace, opt Options) (*Tier, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: no backend", ErrConfig)
	}
	if ns.BlockSize <= 0 || len(ns.Keys) == 0 || ns.BlockSize > MaxBlockSize {
		return nil, fmt.Errorf("%w: namespace of block size %d and %d keys", ErrConfig, ns.BlockSize, len(ns.Keys))
	}
	// No braces in the model: the address's braces are the Redis Cluster
	// hash tag, and with none inside them an address names exactly one
	// (model, layout, block size, hash, key).
	if len(ns.Model) > MaxNameBytes || strings.ContainsAny(ns.Model, "{}") {
		return nil, fmt.Errorf("%w: model %q (braces, or over %d bytes)", ErrConfig, ns.Model, MaxNameBytes)
	}
	h := sha256.New()
	seen := map[string]bool{}
	for _, k := range ns.Keys {
		if k.Name == "" || k.RowBytes <= 0 || len(k.Name) > MaxNameBytes || seen[k.Name] ||
			int64(k.RowBytes)*int64(ns.BlockSize) > MaxValueBytes {
			return nil, fmt.Errorf("%w: key %q of %d row bytes (empty, duplicate, over %d bytes of name, no rows, or a block over %d bytes)",
				ErrConfig, k.Name, k.RowBytes, MaxNameBytes, int64(MaxValueBytes))
		}
		seen[k.Name] = true
		var n [12]byte
		binary.LittleEndian.PutUint32(n[:], uint32(len(k.Name)))
		binary.LittleEndian.PutUint64(n[4:], uint64(k.RowBytes))
		h.Write(n[:4])
		h.Write([]byte(k.Name))
		h.Write(n[4:])
	}
	if opt.ProbeInterval == 0 {
		opt.ProbeInterval = DefaultProbeInterval
	}
	if opt.ProbeInterval < 0 || opt.ProbeInterval > time.Minute {
		return nil, fmt.Errorf("%w: probe interval %v not in (0, 1m]", ErrConfig, opt.ProbeInterval)
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if len(opt.Secret) > 0 && len(opt.Secret) < MinSecretBytes {
		return nil, fmt.Errorf("%w: a secret of %d bytes, at least %d", ErrConfig, len(opt.Secret), MinSecretBytes)
	}
	if opt.Timeout == 0 {
		opt.Timeout = DefaultTimeout
	}
	if opt.Timeout < 0 {
		return nil, fmt.Errorf("%w: negative timeout %v", ErrConfig, opt.Timeout)
	}
	if opt.RecentWindow == 0 {
		opt.RecentWindow = DefaultRecentWindow
	}
	if opt.SightingCounters < 0 || opt.SightingCounters > MaxSightingCounters {
		return nil, fmt.Errorf("%w: %d sighting counters, want 0..%d", ErrConfig, opt.SightingCounters, MaxSightingCounters)
	}
	if opt.RecentWindow > MaxRecentWindow {
		return nil, fmt.Errorf("%w: recent window %v over %v", ErrConfig, opt.RecentWindow, MaxRecentWindow)
	}
	ns.Keys = append([]Key(nil), ns.Keys...)
	t := &Tier{
		b: b, ns: ns, timeout: opt.Timeout, seal: newSealer(opt.Secret),
		brk:    newBreaker(opt.ProbeInterval, opt.Logger),
		prefix: fmt.Sprintf("oc:{%s/%016x/b%d/", ns.Model, binary.BigEndian.Uint64(h.Sum(nil)), ns.BlockSize),
		pools:  make([]valuePool, len(ns.Keys)),
		recent: newRecent(opt.RecentWindow),
	}
	if opt.Histograms {
		t.h = newTierHists()
	}
	if t.sightW = opt.SightingCounters; t.sightW == 0 {
		t.sightW = DefaultSightingCounters
	}
	for _, key := range ns.Keys {
		t.tmpl = append(t.tmpl, t.prefix+"0000000000000000}:"+key.Name)
	}
	for k := range t.pools {
		t.pools[k].max = max(16, poolBytes/t.ValueBytes(k))
	}
	return t, nil
}

// Namespace is the tier's namespace.
func (t *Tier) Namespace() Namespace { return t.ns }

// Backend is the tier's backend.
func (t *Tier) Backend() Backend { return t.b }

// String names the backend.
func (t *Tier) String() string { return t.b.String() }

// Close closes the backend (and ends a circuit probe).
func (t *Tier) Close() error {
	t.brk.close()
	return t.b.Close()
}

// CircuitOpen reports whether the circuit is open: a batch ran out of its
// time on the backend and no probe got an answer since, so every call
// fails at once with ErrCircuitOpen.
func (t *Tier) CircuitOpen() bool { return t.brk.open.Load() }

// CircuitOpened returns a channel that is closed once the circuit opens
// (at once while it is open): a caller waiting on a fetch can give up
// with it.
func (t *Tier) CircuitOpened() <-chan struct{} { return t.brk.Opened() }

// Stats returns the tier's counters.
func (t *Tier) Stats() Stats {
	return Stats{
		Puts: t.puts.Load(), PutErrors: t.putErrs.Load(), BytesPut: t.bytesPut.Load(),
		Hits: t.hits.Load(), Misses: t.misses.Load(), Corrupt: t.corrupt.Load(), Errs: t.errs.Load(),
		BytesGot: t.bytesGot.Load(), CorruptDeleted: t.corruptDeleted.Load(),
		CircuitOpens: t.brk.opens.Load(), CircuitOpen: t.brk.open.Load(), Lookups: t.lookups.Load(), LookupBlocks: t.lookupBlocks.Load(),
	}
}

// firstErr is the first non-nil error of errs.
func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
