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
// A Tier is safe for concurrent use by any number of goroutines.
package tier

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
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
	// in (a store a few values large, under concurrent publishers); the
	// value is not stored.
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

// Addr is the address of block hash's value of key k (Namespace.Keys
// order).
func (t *Tier) Addr(hash uint64, k int) string {
	return string(t.appendAddr(make([]byte, 0, t.addrLen(k)), hash, k))
}

// appendAddr appends Addr(hash, k) to b.
func (t *Tier) appendAddr(b []byte, hash uint64, k int) []byte {
	start := len(b)
	b = append(b, t.tmpl[k]...)
	putHex(b[start+len(t.prefix):], hash)
	return b
}

// addrLen is the length of key k's addresses.
func (t *Tier) addrLen(k int) int { return len(t.tmpl[k]) }

// addrs are the addresses of every key of every block, block-major: views
// into one buffer, so a batch allocates twice, not once per value. Each is
// its key's template with the hash written in: one copy a value (a
// scheduler's Lookup of a long prompt asks for thousands).
func (t *Tier) addrs(hashes []uint64) []string {
	nk := len(t.ns.Keys)
	size := 0
	for k := range t.ns.Keys {
		size += t.addrLen(k)
	}
	buf := make([]byte, 0, size*len(hashes)) // never grown: the views stay valid
	keys := make([]string, 0, len(hashes)*nk)
	for _, h := range hashes {
		for k := range t.ns.Keys {
			start := len(buf)
			buf = t.appendAddr(buf, h, k)
			keys = append(keys, unsafe.String(&buf[start], len(buf)-start))
		}
	}
	return keys
}

// putHex writes h as 16 lower-case hex digits, zero-padded, into b[:16].
func putHex(b []byte, h uint64) {
	const digits = "0123456789abcdef"
	_ = b[15]
	for i := 15; i >= 0; i-- {
		b[i] = digits[h&15]
		h >>= 4
	}
}

// BlockBytes is the size of one block's rows of key k.
func (t *Tier) BlockBytes(k int) int { return t.ns.BlockSize * t.ns.Keys[k].RowBytes }

// ValueBytes is the encoded size of one block's value of key k.
func (t *Tier) ValueBytes(k int) int {
	return t.seal.valueSize(t.addrLen(k), t.ns.BlockSize, t.ns.Keys[k].RowBytes)
}

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
	nk := len(t.ns.Keys)
	if err := t.brk.check(); err != nil {
		t.errs.Add(int64(len(hashes) * nk))
		errs = make([]error, len(hashes))
		for j := range errs {
			errs[j] = err
		}
		return make([][]byte, len(hashes)*nk), errs
	}
	keys := t.addrs(hashes)
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	t0 := t.start()
	vals, berrs := t.b.Get(ctx, keys)
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
	return rows, errs
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

// Lookup returns how many leading blocks of hashes the tier holds (every
// key of each): from a server in one pipelined batch; from the embedded
// store a few keys at a time, stopping at the first it lacks, with no
// allocation. It checks presence only: a value that is corrupt, or evicted
// before it is fetched, is found missing by Get. A backend failure is
// returned with the blocks counted before it.
func (t *Tier) Lookup(ctx context.Context, hashes []uint64) (int, error) {
	t.lookups.Add(1)
	if len(hashes) == 0 {
		return 0, nil
	}
	nk := len(t.ns.Keys)
	if t.h != nil {
		defer since(t.h.lookup, time.Now())
	}
	if e, ok := t.b.(leader); ok {
		n, err := e.leading(t, hashes)
		t.lookupBlocks.Add(int64(n))
		if err != nil {
			return n, fmt.Errorf("tier: lookup %s: %w", t.Addr(hashes[0], 0), err)
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

// leader is a backend that answers Lookup itself, with no allocation
// (Embedded.leading).
type leader interface {
	leading(t *Tier, hashes []uint64) (int, error)
}

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
