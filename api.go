// Package omnicache is the prefix-cache core of a multimodal inference
// engine: it keeps stage 0's per-token outputs (hidden states, per-token
// multimodal tensors) in a host mirror keyed by KV slot, and when the
// engine's KV prefix cache skips a prefix it hands back
// `cached prefix rows ++ this step's rows`, exactly as if nothing had hit.
//
// In this package the engine is the inference engine that drives the
// cache through the contract below, and the engine goroutine the one that
// calls Begin, Save, Abort and Sync; the engine state (engineState,
// engine.go) is what the cache keeps on that goroutine: the live requests
// and the begun step.
//
// The engine contract, once per real step:
//
//	Begin(plan)             before the engine drops finished requests
//	  ...forward...
//	id := Save(outputs)     after the forward
//	Materialize(id, reqs)   or Discard(id): exactly one, once per id
//
// A forward that fails after Begin calls Abort instead of Save. A call that
// fails changes nothing (a failed Save also undoes its Begin); only
// ErrWriteFailed is sticky.
//
// Goroutines: Begin, Save, Abort and Sync are called by one goroutine (the
// engine goroutine). Materialize and Discard may be called from any
// goroutine, concurrently with the engine goroutine and with each other (a
// step late is normal). Stats and Close may be called from any goroutine at
// any moment: calls in flight complete or fail with ErrClosed, and Close
// frees nothing before the last of them left. The cache runs one background
// goroutine of its own, the committer (pprof label omnicache=committer),
// which moves host-ready rows into the mirror, and Config.CopyWorkers-1
// copy workers (omnicache=copy-worker) that large scatters and hit gathers
// are split across. With a tier (Config.Tier) it also runs
// TierConfig.Importers importers (omnicache=tier-importer) and
// TierConfig.Publishers publishers (omnicache=tier-publisher), the only
// goroutines that talk to the tier's network.
//
// Layout: this package is the engine contract (its types, errors and
// defaults) with one short orchestration per call; docs/design.md says
// which files hold each call. Underneath, internal to the module, calls
// go one way (docs/design.md states the directions; make test checks
// them): the root calls the read path (internal/reader), which asks the
// write path (internal/writer) for rows still queued; the root hands
// steps to the write path, which owns the committer, the staging pages
// and the mirrors; the shared tier sits behind one link
// (internal/tierlink), which the write path tells of landed blocks (to
// publish) and which queues imports to it. Nothing calls back up but
// completion signals. The public building blocks are writer (the write
// path on its own), mirror, slots, soa, gpu, tier and metrics.
//
// Plans and outputs are borrowed for the call only: the cache copies what it
// keeps. Outputs marked Owned are handed to the cache and must not be touched
// by the engine afterwards.
package omnicache

import (
	"runtime"
	"time"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/writer"
)

// Key describes one per-token output the cache keeps.
type Key struct {
	// Name identifies the key (unique).
	Name string
	// RowBytes is the size of one token's row.
	RowBytes int
	// Deferred keys keep their rows on the device clone and write them when
	// the request finishes or aborts (or earlier under budget pressure).
	Deferred bool
	// Optional keys read absent rows as exact zeros. Required keys (the
	// default, e.g. the hidden state) fail a hit over absent rows.
	Optional bool
}

// NoWait as Config.StagingClaimTimeout makes a Save that finds no free
// staging page fail at once.
const NoWait time.Duration = -1

// Defaults applied by New to zero Config fields. The write path's are
// package writer's table, which a writer.Writer defaults to as well.
const (
	DefaultStagingDepth          = writer.DefaultStagingDepth // 4 pages
	DefaultStagingCapacityTokens = writer.DefaultStagingRows  // 1024 rows
	DefaultStagingClaimTimeout   = writer.DefaultClaimTimeout // 30 s
	DefaultDeviceBudgetBytes     = writer.DefaultBudgetBytes  // 512 MiB
	DefaultDeferredChunkBytes    = 16 << 20
	DefaultWaitTimeout           = writer.DefaultWaitTimeout // 60 s
	MaxSyncSpin                  = time.Second               // Config.SyncSpin
	DefaultReadAheadBytes        = 1 << 30
)

// DefaultCopyWorkers is Config.CopyWorkers when left zero: GOMAXPROCS-1,
// at least 1 and at most 16.
func DefaultCopyWorkers() int { return max(1, min(16, runtime.GOMAXPROCS(0)-1)) }

// Config configures a Cache. Zero fields take the defaults above.
type Config struct {
	// NumBlocks and BlockSize size the KV slot space: slots are
	// [0, NumBlocks*BlockSize).
	NumBlocks int
	BlockSize int
	// Keys are the per-token outputs kept, in the order Outputs.Tensors
	// supplies them.
	Keys []Key
	// StagingDepth is the number of staging pages; every saved step id
	// holds one until it is materialized or discarded.
	StagingDepth int
	// StagingCapacityTokens is the number of token rows one page holds: the
	// largest step, and the largest decode-buffer flush.
	StagingCapacityTokens int
	// StagingClaimTimeout bounds a Save's wait for a free page (NoWait: fail
	// at once).
	StagingClaimTimeout time.Duration
	// AllocStagingAtNew makes New allocate every staging page before it
	// returns (one allocation of StagingDepth pages), failing with an error
	// wrapping gpu.ErrAlloc when the device refuses it. New then takes the
	// pinning time (tens of ms for hundreds of MiB of pinned memory;
	// BenchmarkAllocHost in gpu/ measures it) and no step ever waits for,
	// or runs beside, an allocation of pinned memory. Off (the default),
	// the first page is allocated by the first Save that needs one, and
	// each later page in the background after the Save that took the one
	// before it: nothing is allocated for a cache that is never used, and
	// the first step pays for one page.
	AllocStagingAtNew bool
	// AllocStagingAhead makes New allocate the first staging page (failing
	// with an error wrapping gpu.ErrAlloc when the device refuses it) and
	// start allocating the other pages at once on a background goroutine,
	// one after another: New takes one page's pinning time, and an engine
	// that warms up before its first real step finds every page ready. A
	// Save that needs a page before its memory is ready waits for it (as
	// stall); a background allocation that fails is retried by that Save.
	// Not together with AllocStagingAtNew.
	AllocStagingAhead bool
	// DeviceBudgetBytes bounds every device-side copy the cache holds (step
	// clones, deferred clones, parked decode rows).
	DeviceBudgetBytes int64
	// DeferredChunkBytes bounds one device→host copy of deferred rows.
	DeferredChunkBytes int64
	// WaitTimeout bounds every wait on the committer: a hit read joining
	// the writes it reads, Sync, a write forced out by budget pressure, and
	// Close (waiting for calls in flight and for the committer to stop). A
	// wait that runs out means the device never completed a copy: it fails
	// the cache with ErrWriteFailed wrapping ErrDeviceTimeout (Close
	// returns ErrDeviceTimeout and leaves the cache's memory allocated, as
	// a stuck copy may still write it). Negative: no bound.
	WaitTimeout time.Duration
	// SyncSpin is how long Sync waits for the committer by spinning before
	// it parks (0: 50µs, as every wait on the committer; the spin counts
	// against WaitTimeout; at most MaxSyncSpin). A parked engine goroutine
	// may resume on another core, its caches cold for the calls that
	// follow: an engine that calls Sync where its thread would wait on its
	// device anyway (a forward under CUDA's default scheduling keeps its
	// core) can spin through the committer's work instead.
	SyncSpin time.Duration
	// DisableDecodeBuffer writes every step at once instead of parking
	// pure-decode steps.
	DisableDecodeBuffer bool
	// DisablePrefetch reads hit prefixes at Materialize, on the caller's
	// goroutine, instead of prefetching them. With prefetch (the default),
	// Begin queues a step's hit read to the committer right behind the
	// writes handed over so far: the committer and the copy workers move
	// the prefix rows into buffers laid out as the step's Result while the
	// engine runs its forward, before any later write can overwrite them,
	// and Materialize of the whole step adopts those buffers (no copy).
	// Without prefetch, a Materialize late enough that a newer write
	// claimed the hit's blocks first fails that request with
	// ErrReassigned.
	DisablePrefetch bool
	// ReadAheadBytes bounds the prefetch buffers held by steps not
	// consumed yet (a step holds Σ over keys of its Result's rows × RowBytes
	// from Begin until Materialize or Discard), and the idle buffers kept
	// for reuse. A step that does not fit is not prefetched: it is read at
	// Materialize, and a request whose blocks a newer write claimed first
	// fails with ErrReassigned, naming the exhausted budget.
	ReadAheadBytes int64
	// CopyWorkers is the number of goroutines a large host copy is split
	// across: the committer's scatter of a step's rows into the mirror, and
	// Materialize's gather of hit rows from it, each counting the goroutine
	// that asks (the committer, the Materialize caller). The cache starts
	// CopyWorkers-1 long-lived goroutines (pprof label
	// omnicache=copy-worker) shared by both; a copy under 1 MiB
	// (mirror.DefaultSplitBytes: a decode step of 64 rows of 4 KiB is 256
	// KiB), or a scatter of rows under 512 bytes, never leaves its
	// goroutine. 0 means DefaultCopyWorkers(): one less than GOMAXPROCS,
	// at most 16, so that a scatter never holds every P and the engine
	// goroutine, woken while it runs, gets one at once (with every P
	// copying, it would wait for a part of the copy to finish).
	// The workers run only while a large copy is in progress, which is
	// while the engine's forward runs on the device; 1 copies on one
	// goroutine. At most MaxCopyWorkers.
	CopyWorkers int
	// Device stages copies; nil means the host device (gpu.NewHost()).
	Device gpu.Device
	// MirrorDirect makes the committer copy a step's device rows (of at
	// least MirrorDirectMinBytes) straight from the device into the host mirror, a run of
	// consecutive slots per copy, instead of into the step's staging page
	// and then across the host's cores into the mirror: the rows reach the
	// mirror at the copy engine's rate, and no host core copies them
	// (BenchmarkStaging in gpu/: op=cache-pipelined-direct against
	// op=cache-pipelined). On a device that registers host memory
	// (gpu.HostRegistrar: CUDA), each mirror chunk is registered as it is
	// first written, so the mirror's written memory is page-locked: it
	// cannot be swapped out. A direct step keeps its device rows (the clone
	// of a tensor not owned, or the owned tensor) until it is consumed,
	// and Materialize reads them from the device: DeviceBudgetBytes must
	// hold StagingDepth+1 pages of immediate rows (New refuses it
	// otherwise). Host tensors and the decode buffer's writes take the
	// staging path either way.
	MirrorDirect bool
	// MirrorDirectMinBytes is the least a step's immediate rows weigh to
	// be written direct under MirrorDirect (0: 1 MiB; smaller steps take
	// the staging path, where one copy into the page beats a device copy
	// per run of slots).
	MirrorDirectMinBytes int64
	// Histograms records latencies and sizes into lock-free histograms
	// (Cache.Histograms; the metrics package exports them): the hit read
	// wait of Materialize, the staging page wait, the engine goroutine's
	// waits for the committer, the device→host copies' time and bytes, and
	// a tier's own (tier.Options.Histograms). An observation is a few
	// atomic adds, plus a clock read only where a wait was timed anyway or
	// a Materialize read hits; BenchmarkStep (collector=off vs on) shows
	// no measurable cost per step.
	Histograms bool
	// Tier, when set, shares full blocks' rows with other caches through a
	// content-addressed tier (see TierConfig and Plan.FullBlocks,
	// Plan.TierBlocks, Cache.Lookup). Immediate keys only.
	Tier *TierConfig
	// ReleaseHost, when set, is called once for every owned host tensor
	// (with the Host slice handed to Save) when the cache no longer needs
	// it: its rows have landed in the mirror and every step that could read
	// it was consumed, or the cache closed. The engine may then reuse the
	// buffer. It runs on one of the cache's goroutines (the committer, a
	// Materialize or Discard caller, or the engine's) with no lock held;
	// keep it short. Without it, owned host buffers are left to the garbage
	// collector. When Save returns an error, ReleaseHost has been or will
	// be called for every owned tensor it took.
	ReleaseHost func([]byte)
}

// Plan is one real step's schedule, struct-of-arrays, borrowed for the
// duration of Begin.
type Plan struct {
	// The batch in token order: per scheduled request its id, its row in the
	// block table, its first scheduled position (num_computed) and its
	// scheduled token count.
	IDs   []int64
	Rows  []int32
	Start []int32
	Count []int32
	// Table is the engine's block table, row-major [rows][Stride].
	Table  []int32
	Stride int

	// Arrivals are requests seen for the first time this step, with their
	// hit length (= num_computed at arrival, block aligned) and the hit's
	// block ids: HitBlocks concatenates HitTokens[i]/BlockSize ids per
	// arrival, in arrival order. A live id arriving again is a streamed
	// continuation, not a hit, unless it is also in Resumed: a preempted
	// request resuming with a hit (scheduled from its hit length).
	Arrivals  []int64
	HitTokens []int32
	HitBlocks []int32

	// Finished holds finished and aborted request ids: their open writes
	// still land. Preempted and Resumed name requests preempted (their
	// blocks may be freed) and resumed this step. The cache knows up to
	// which position each request's rows were delivered (a Materialize
	// that returned them; a Discard delivers nothing): a resumed request
	// recomputes rows, and Materialize leaves out those below that
	// position and below what its older steps not consumed yet will
	// deliver, so what it receives has no gap and no repeat when a
	// request's steps are consumed in order (Result.From says where its
	// rows start).
	Finished  []int64
	Preempted []int64
	Resumed   []int64

	// Replaced names live requests whose tokens from ReplacedFrom[i] on
	// were replaced (streaming input): their rows from that position on
	// are neither hit nor delivered any more (steps saved before and not
	// consumed yet leave them out; a hit not served yet is cut to the
	// blocks before it), and delivery restarts there: the engine
	// recomputes from that position. A position past the tokens the
	// request's saved steps cover, or a request not live, is ErrPlan.
	Replaced     []int64
	ReplacedFrom []int32

	// With a tier (Config.Tier; see tier.go):
	//
	// FullBlocks are the full blocks this step's rows complete, with their
	// chained hashes in FullHashes: once their rows are committed the cache
	// publishes them to the tier in the background. Without a tier they
	// are ignored.
	FullBlocks []int32
	FullHashes []uint64
	// TierBlocks holds, per arrival (empty: none), how many of its hit
	// blocks, the last ones, had their KV loaded from outside and have
	// their rows imported from the tier; TierHashes concatenates those
	// blocks' chained hashes, in arrival order. They count in HitTokens
	// and HitBlocks like any hit block.
	TierBlocks []int32
	TierHashes []uint64

	// ResultInto, when set, holds per key (Config.Keys order) the
	// engine's buffer for the step's Result: the rows of every request in
	// batch order, laid out as Materialize of the whole step lays them out
	// (per request its hit prefix, then its scheduled tokens: at least
	// StepRows(id, nil) rows of the key's RowBytes once the step is
	// saved). The cache fills it as it goes, so that Materialize of the
	// whole step into the same buffers (Result.Into, reqs nil) finds the
	// rows in place and copies nothing it has not:
	//   - a prefetched hit (see Config.DisablePrefetch) is read into it
	//     while the engine runs its forward;
	//   - a step of more than 4 MiB of immediate rows (a prefill) whose
	//     only hit, if any, is its first request's has its host rows
	//     copied into it by Save, instead of into a staging page, while
	//     the committer writes them to the mirror from the engine's
	//     tensor; Save returns once both are done.
	// Buffers smaller than the step's rows are left unused (Materialize
	// then copies as without them). They are borrowed from Begin until the
	// step is consumed (its Materialize, Discard or Abort returned, its
	// Save failed) or the cache closed: the engine must neither write nor
	// free them meanwhile. A Materialize of some requests only into
	// buffers that overlap them, or of the whole step into them shifted,
	// is ErrOutputs (rows would move across one another). Empty, or one
	// buffer per key; else ErrPlan.
	ResultInto [][]byte

	// ResultDev, when set, holds per key (Config.Keys order) a buffer of
	// the cache's device (Config.Device) for the step's Result, laid out
	// as ResultInto (at least StepRows(id, nil) rows of the key's
	// RowBytes once the step is saved), for MaterializeDev of the whole
	// step into the same buffers: the rows move while the engine works,
	// and MaterializeDev waits for them rather than copy them.
	//   - a prefetched hit's rows (see Config.DisablePrefetch) are read
	//     while the engine runs its forward, as without, and copied up
	//     into the buffers by the committer right after;
	//   - Save copies the step's own rows into them from the engine's
	//     tensors (device to device; a host tensor host to device; an
	//     omitted key's rows are zeroed) and returns once done.
	// A hit not prefetched (prefetch off, the read-ahead budget
	// exhausted) is read by MaterializeDev and copied up then. Buffers
	// smaller than the step's rows are left unused (MaterializeDev then
	// reads the step and copies every row up). Borrowed as ResultInto
	// is, from Begin until the step is consumed or the cache closed.
	// Empty, or one buffer per key with ResultInto empty; else ErrPlan.
	ResultDev []gpu.Buffer
}

// Tensor is one key's output rows for a step.
//
// The zero Tensor (Host nil and Dev zero; Rows and Owned are then ignored)
// omits an optional key: the step
// did not emit it. Nothing is staged, cloned, copied or charged for it; the
// step's rows of that key read back as exact zeros (Materialize of the step,
// and any later hit over those slots until a later step supplies the key
// there again). A zero Tensor for a required key fails Save with ErrOutputs.
type Tensor struct {
	// Host holds the rows when they are in host memory; otherwise Dev.
	Host []byte
	Dev  gpu.Buffer
	// Rows is the number of rows the tensor holds (≥ Outputs.Tokens).
	Rows int
	// Owned marks a tensor private to the cache: it is kept without a
	// defensive clone (parked by reference, written straight from it) and
	// is handed over for good: the engine must never write or reuse it
	// again. Host memory is left to the garbage collector once the cache is
	// done with it; device memory is freed through Device.Free. A tensor
	// that is not owned is copied before Save returns (a device tensor is
	// cloned on the device and Save waits for the clone), so the engine may
	// overwrite it at once, on any stream. Owned tensors spare that copy
	// and that wait.
	Owned bool
}

// Outputs are one step's per-token outputs, borrowed for Save.
type Outputs struct {
	// Tokens is the step's token count n; Padded the padded count (≥ n).
	Tokens int
	Padded int
	// Tensors holds one tensor per Config.Keys entry, in that order; a
	// zero Tensor{} for an optional key means the step did not emit it.
	Tensors []Tensor
	// Accepted, for speculative decoding, holds per scheduled request (in
	// batch order) how many of its scheduled tokens were accepted (nil:
	// all). The rows of the rejected ones are never delivered (Materialize
	// leaves them out: Result.Tokens counts the accepted rows) and never
	// become part of a hit: they are written nowhere and their slots read
	// as reassigned (immediate keys) or absent (deferred keys) until a
	// later write puts rows there. A decode step of one token a request
	// (the decode buffer's kind) rejects none. Each count must lie in
	// [0, Count], else ErrOutputs.
	Accepted []int32
}

// StepID names a saved step. Ids are never reused.
type StepID uint64

// Stats are cumulative counters and gauges.
type Stats struct {
	Steps          int64 // Save calls that succeeded
	WriteTasks     int64 // write tasks handed to the committer
	RowsWritten    int64 // rows scattered into the mirror (all keys)
	BytesWritten   int64 // bytes scattered into the mirror
	RowsSkipped    int64 // rows a task skipped because a newer write stole the slot
	BufferedSteps  int64 // steps parked in the decode buffer
	BufferFlushes  int64 // decode-buffer flushes
	DeferredWrites int64 // deferred write tasks
	BudgetFlushes  int64 // writes forced out by budget pressure
	HitRequests    int64 // arrivals with a hit
	HitTokens      int64 // tokens covered by hits
	HitRowsRead    int64 // prefix rows served by Materialize
	// HitReadsOnCaller counts prefetched steps consumed before the
	// committer started their read: Materialize read the hit rows itself
	// rather than wait for it (a step consumed right after Save, with no
	// forward in between).
	HitReadsOnCaller int64
	// CommitterNanos is CPU-side time the committer spent moving rows.
	CommitterNanos int64
	// StallNanos is time the engine goroutine waited on back-pressure: for
	// a free staging page, or for the committer under budget pressure.
	StallNanos int64
	// MirrorResidentBytes is host memory really backing the mirror.
	MirrorResidentBytes int64
	// BudgetCharged / BudgetLimit: device bytes held now / allowed.
	BudgetCharged int64
	BudgetLimit   int64
	// BudgetPeak is the highest charge ever held (never above BudgetLimit).
	BudgetPeak int64
	// ClonedBytes counts bytes copied defensively out of non-owned outputs.
	ClonedBytes int64
	// PagesInUse is the number of staging pages held now.
	PagesInUse int
	// PagesAllocating is 1 while a staging page's memory is being
	// allocated ahead in the background (pinned memory is slow to
	// allocate: each page after the first is allocated while the engine
	// runs the steps before it needs it), else 0.
	PagesAllocating int
	// ReadAheadBytes is the prefetch buffers held by steps not consumed yet
	// (bounded by Config.ReadAheadBytes).
	ReadAheadBytes int64
	// LiveRequests is the number of requests the cache tracks.
	LiveRequests int
	// Resets counts the Reset calls that dropped every row.
	Resets int64
	// PrefetchUsed counts steps whose hit prefixes the committer read ahead
	// and Materialize served; PrefetchDropped steps read ahead (or queued
	// to be) that were discarded or aborted instead, their read wasted or
	// skipped.
	PrefetchUsed, PrefetchDropped int64

	// With a tier (zero without): full blocks published to it, dropped
	// because the publish queue was full, skipped because their rows were
	// not all committed, and that failed to store; value bytes published;
	// blocks imported into the mirror and imports that failed; row bytes
	// imported.
	TierPublished, TierPublishDropped, TierPublishSkipped, TierPublishErrors int64
	// TierPublishRecent counts full blocks not gathered because the tier
	// stored them within its recent window (tier.Tier.StoredRecently):
	// another replica, or this cache, published them moments ago.
	TierPublishRecent int64
	// TierPublishUnadmitted counts full blocks not published because they
	// were seen fewer than TierConfig.AdmitAfter times.
	TierPublishUnadmitted int64
	TierBytesPublished    int64
	// TierPublishPending is the blocks in the publish queue or being
	// stored now (a gauge).
	TierPublishPending                                int64
	TierImported, TierImportFailed, TierBytesImported int64
	// TierCircuitOpens counts the times a tier call ran out of its time
	// and opened the tier's circuit (tier.ErrCircuitOpen); TierCircuitOpen
	// is 1 while it is open (every tier call fails at once; a background
	// probe closes it at the store's first answer), else 0.
	TierCircuitOpens, TierCircuitOpen int64
}
