package omnicache

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/omnicache/omnicache/internal/tierlink"
	"github.com/omnicache/omnicache/tier"
)

// A shared tier (package tier) makes per-token outputs follow the KV across
// replicas. The contract grows three things:
//
//   - Plan.FullBlocks / FullHashes: the full blocks a step computes and
//     their chained hashes. Once their rows are committed to the mirror the
//     cache publishes them to the tier in the background: the blocks ride
//     on the write that completes their rows (writer.Rider), the committer
//     gathers the rows once it landed and hands them to a bounded publish
//     queue; the publisher goroutines store them (one pipelined batch at a
//     time each). A full queue drops the block and counts it
//     (Stats.TierPublishDropped): the engine goroutine never waits on the
//     network.
//   - Cache.Lookup(ctx, hashes): how many leading blocks the tier holds, for the
//     scheduler to intersect with what its KV connector can load. It is the
//     one call that asks the network on its caller's goroutine (bounded by
//     the tier's timeout); Begin, Save, Discard never do.
//   - Plan.TierBlocks / TierHashes: an arrival whose trailing hit blocks'
//     KV was loaded from outside names them (their local block ids are the
//     last TierBlocks[i] of its hit blocks). Begin hands the fetch to an
//     importer goroutine and queues the import to the committer ahead of
//     the step's hit read, so the rows are in the mirror at those slots
//     before any read needs them; Materialize waits for the import (bounded
//     by TierConfig.ImportTimeout). A block the tier no longer holds (or
//     whose value fails its checks, or whose node is down) fails that
//     request, and only it, with a *TierImportError naming the block (see
//     RequestError and Result.Err): the engine recomputes it. Its slots read
//     as reassigned until a write puts rows there: never a wrong row.
//
// A tier keeps immediate keys only: New refuses a tier with deferred keys.
//
// Prefill/decode disaggregation rides on the same three things: the
// prefill instance publishes a request's full blocks (Plan.FullBlocks) and,
// with TierConfig.PublishBarrier, waits for them (Cache.WaitPublished)
// before it reports the request's KV transferred; the decode instance
// names the transferred prompt's blocks as the arrival's hit and as its
// tier blocks (Plan.TierBlocks), so their rows are imported, or the
// request fails with a *TierImportError and the engine recomputes it.

// ErrTierMiss: an arrival's tier block could not be imported (evicted,
// corrupt, unreachable or too slow). The request's error is a
// *TierImportError (errors.As) that matches ErrTierMiss and the tier's own
// cause (tier.ErrMiss, tier.ErrCorrupt, tier.ErrUnavailable).
var ErrTierMiss = errors.New("omnicache: tier block not imported")

// ErrNotPublished: a block WaitPublished waited for was not stored in the
// tier: dropped (the publish queue was full), skipped (its rows were not
// all committed), not admitted (TierConfig.AdmitAfter), refused by the
// store, abandoned (Reset, Close), or never noted. The error is a
// *TierPublishError (errors.As) naming the block and the cause.
var ErrNotPublished = errors.New("omnicache: tier block not published")

// Defaults of TierConfig's zero fields.
const (
	DefaultImportTimeout = 2 * time.Second
	DefaultPublishQueue  = 4096 // blocks
	DefaultPublishBatch  = 64   // blocks per pipelined store
	DefaultImporters     = 2
	DefaultPublishers    = 2

	// Limits New enforces on a TierConfig (ErrConfig names the field).
	MaxImportTimeout = time.Hour // ImportTimeout; also at most WaitTimeout/4
	MaxPublishQueue  = 1 << 20   // PublishQueue, in blocks
	MaxPublishBatch  = 1 << 16   // PublishBatch, in blocks
	MaxTierWorkers   = 256       // Importers, Publishers
	MaxAdmitAfter    = 1 << 16   // AdmitAfter
)

// TierConfig attaches a shared tier to a cache.
type TierConfig struct {
	// Tier is the store; its namespace must have the cache's block size and
	// keys (names and row bytes, in order). Several caches (replicas) may
	// share one Tier; the cache does not close it.
	Tier *tier.Tier
	// ImportTimeout bounds one import's fetch (and Materialize's wait for
	// it); a fetch that runs out fails its requests with ErrTierMiss. It
	// must be at most a quarter of Config.WaitTimeout.
	ImportTimeout time.Duration
	// PublishQueue bounds the blocks waiting to be published; past it
	// blocks are dropped and counted. PublishBatch bounds one store.
	PublishQueue, PublishBatch int
	// AdmitAfter publishes a full block only once it has been seen (its
	// rows committed by a step that computed it) that many times: 0 or 1
	// publishes every block, 2 only blocks computed again (a prefix some
	// later prompt repeated), so that one-off prompts do not push reused
	// blocks out of the store. Sightings are counted in the tier's sketch
	// (tier.Tier.Sightings: count-min, bounded memory, 4 MiB by default,
	// see tier.Options.SightingCounters), shared by every cache of the
	// Tier value: replicas in one process count together, replicas in
	// separate processes each count their own. A block not yet admitted
	// is counted in Stats.TierPublishUnadmitted. At most MaxAdmitAfter.
	AdmitAfter int
	// Importers is the number of goroutines fetching imports (an import
	// that finds them all busy and their queue full fails at once); with
	// the embedded store the cache keeps up to one fetch buffer per
	// importer, as large as the largest import, for the next imports;
	// Publishers the number storing published blocks.
	Importers, Publishers int
	// OnImport, when set, is called once per import that ran (from the
	// committer goroutine; keep it short) with its blocks, failed blocks,
	// row bytes imported and latency from Begin to the rows being in the
	// mirror.
	OnImport func(ImportEvent)
	// PublishBarrier tracks the outcome of every full block noted for
	// publishing (stored, or why not), so that WaitPublished can wait for
	// a request's blocks: a prefill instance of a disaggregated deployment
	// reports a request's KV transferred only once its rows are in the
	// tier too. It costs the engine goroutine a map update per full block
	// noted and remembers the latest 65,536 outcomes.
	PublishBarrier bool
}

// ImportEvent describes one step's import (TierConfig.OnImport).
type ImportEvent struct {
	Blocks, Failed int
	Bytes          int64
	Latency        time.Duration
}

// TierImportError is a request's error when a block of its tier import was
// not imported (Result.Err, RequestError.Errs).
type TierImportError struct {
	Request int64
	// Index is the block's position in the request's hit blocks; Block its
	// local block id; Hash its chained hash.
	Index int
	Block int32
	Hash  uint64
	Err   error
}

func (e *TierImportError) Error() string {
	return fmt.Sprintf("%v: request %d: hit block %d (local block %d, hash %016x): %v", ErrTierMiss, e.Request, e.Index, e.Block, e.Hash, e.Err)
}

// Unwrap matches ErrTierMiss and the tier's cause.
func (e *TierImportError) Unwrap() []error { return []error{ErrTierMiss, e.Err} }

// TierPublishError is WaitPublished's error for a block that was not
// stored in the tier.
type TierPublishError struct {
	Hash uint64
	Err  error // the cause: the store's error, or why the block was not stored
}

func (e *TierPublishError) Error() string {
	return fmt.Sprintf("%v: block %016x: %v", ErrNotPublished, e.Hash, e.Err)
}

// Unwrap matches ErrNotPublished and the cause.
func (e *TierPublishError) Unwrap() []error { return []error{ErrNotPublished, e.Err} }

// newTierLink validates cfg's tier against the cache's layout and starts
// the link's goroutines (nil, nil without a tier).
func newTierLink(cfg *Config) (*tierlink.Link, error) {
	tc := cfg.Tier
	if tc == nil {
		return nil, nil
	}
	bad := func(format string, a ...any) (*tierlink.Link, error) {
		return nil, fmt.Errorf("%w: tier: "+format, append([]any{ErrConfig}, a...)...)
	}
	if tc.Tier == nil {
		return bad("no Tier")
	}
	ns := tc.Tier.Namespace()
	if ns.BlockSize != cfg.BlockSize || len(ns.Keys) != len(cfg.Keys) {
		return bad("namespace of block size %d and %d keys, the cache has %d and %d", ns.BlockSize, len(ns.Keys), cfg.BlockSize, len(cfg.Keys))
	}
	for i, k := range cfg.Keys {
		if k.Deferred {
			return bad("key %q is deferred: a tier keeps immediate keys only", k.Name)
		}
		if ns.Keys[i].Name != k.Name || ns.Keys[i].RowBytes != k.RowBytes {
			return bad("namespace key %d is %q of %d bytes, the cache's %q of %d", i, ns.Keys[i].Name, ns.Keys[i].RowBytes, k.Name, k.RowBytes)
		}
	}
	c := *tc
	if c.ImportTimeout == 0 {
		c.ImportTimeout = DefaultImportTimeout
	}
	if c.PublishQueue == 0 {
		c.PublishQueue = DefaultPublishQueue
	}
	if c.PublishBatch == 0 {
		c.PublishBatch = DefaultPublishBatch
	}
	if c.Importers == 0 {
		c.Importers = DefaultImporters
	}
	if c.Publishers == 0 {
		c.Publishers = DefaultPublishers
	}
	switch {
	case c.ImportTimeout < 0 || c.ImportTimeout > MaxImportTimeout:
		return bad("ImportTimeout %v not in [0, %v]", c.ImportTimeout, MaxImportTimeout)
	case c.PublishQueue < 0 || c.PublishQueue > MaxPublishQueue:
		return bad("PublishQueue %d not in [0, %d]", c.PublishQueue, MaxPublishQueue)
	case c.PublishBatch < 0 || c.PublishBatch > MaxPublishBatch:
		return bad("PublishBatch %d not in [0, %d]", c.PublishBatch, MaxPublishBatch)
	case c.Importers < 0 || c.Importers > MaxTierWorkers:
		return bad("Importers %d not in [0, %d]", c.Importers, MaxTierWorkers)
	case c.Publishers < 0 || c.Publishers > MaxTierWorkers:
		return bad("Publishers %d not in [0, %d]", c.Publishers, MaxTierWorkers)
	case c.AdmitAfter < 0 || c.AdmitAfter > MaxAdmitAfter:
		return bad("AdmitAfter %d not in [0, %d]", c.AdmitAfter, MaxAdmitAfter)
	}
	// ImportTimeout ≤ MaxImportTimeout: 4× (and the import waits' 1.5× and
	// 2×) cannot wrap.
	if cfg.WaitTimeout >= 0 && 4*c.ImportTimeout > cfg.WaitTimeout {
		return bad("ImportTimeout %v exceeds a quarter of WaitTimeout %v", c.ImportTimeout, cfg.WaitTimeout)
	}
	lc := tierlink.Config{NKeys: len(cfg.Keys), ImportTimeout: c.ImportTimeout, PublishQueue: c.PublishQueue,
		PublishBatch: c.PublishBatch, AdmitAfter: c.AdmitAfter, Importers: c.Importers, Publishers: c.Publishers,
		Barrier: c.PublishBarrier}
	if on := c.OnImport; on != nil {
		lc.OnImport = func(e tierlink.Event) { on(ImportEvent(e)) }
	}
	return tierlink.New(c.Tier, lc), nil
}

// Lookup returns how many leading blocks of hashes the tier holds (every
// key of each): the scheduler intersects it with what its KV connector can
// load. It asks the tier over the network, on the caller's goroutine,
// bounded by ctx and the tier's timeout; while the tier's circuit is open
// (a backend timeout, tier.ErrCircuitOpen) it fails at once. A tier error
// is returned with the blocks counted before it. ErrConfig without a tier.
// Any goroutine.
func (c *Cache) Lookup(ctx context.Context, hashes []uint64) (int, error) {
	if c.tl == nil {
		return 0, fmt.Errorf("%w: Lookup without a tier (Config.Tier)", ErrConfig)
	}
	if c.closed.Load() {
		return 0, ErrClosed
	}
	return c.tl.Lookup(ctx, hashes)
}

// WaitPublished returns once every block of hashes (the chained hashes
// the engine gave as Plan.FullHashes: a request's full prompt blocks) is in
// the tier: stored by this cache since it was last computed, or found
// stored by this tier lately. It needs TierConfig.PublishBarrier (else
// ErrConfig). A block that was not stored fails it at once with a
// *TierPublishError (ErrNotPublished); ctx bounds the wait (its error
// says how many blocks were still being stored). Call it once the steps
// that computed the blocks were saved: a block noted by a step not begun
// yet is unknown. Any goroutine.
func (c *Cache) WaitPublished(ctx context.Context, hashes []uint64) error {
	if c.tl == nil || !c.cfg.Tier.PublishBarrier {
		return fmt.Errorf("%w: WaitPublished without a tier's PublishBarrier (Config.Tier)", ErrConfig)
	}
	if c.closed.Load() {
		return ErrClosed
	}
	err := c.tl.WaitPublished(ctx, hashes)
	if pe, ok := errors.AsType[*tierlink.PublishError](err); ok {
		return &TierPublishError{Hash: pe.Hash, Err: pe.Err}
	}
	return err
}

// ---- the link's answers in the calls ----

// failImports fails in dst every request whose import j lost a block
// (after waiting, bounded, for the import). The consumer's goroutine.
func (c *Cache) failImports(j *tierlink.Import, dst *Result) {
	for _, f := range j.Failures(c.parts.Progress, dst.ids) {
		dst.fail(f.QI, &TierImportError{Request: f.Request, Index: f.Index, Block: f.Block, Hash: f.Hash, Err: f.Err})
	}
}

// tierStats adds the tier's counters.
func (c *Cache) tierStats(s *Stats) {
	if c.tl == nil {
		return
	}
	ts := c.tl.Stats()
	s.TierPublished, s.TierPublishDropped, s.TierPublishSkipped = ts.Published, ts.Dropped, ts.Skipped
	s.TierPublishErrors, s.TierBytesPublished, s.TierPublishPending = ts.PublishErrors, ts.BytesPublished, ts.Pending
	s.TierPublishRecent, s.TierPublishUnadmitted = ts.Recent, ts.Unadmitted
	s.TierImported, s.TierImportFailed, s.TierBytesImported = ts.Imported, ts.ImportFailed, ts.BytesImported
	s.TierCircuitOpens = ts.CircuitOpens
	if ts.CircuitOpen {
		s.TierCircuitOpen = 1
	}
}
