// Package tierlink is a cache's one link to a shared tier (package tier):
// the one place that decides what to publish and what to import, and the
// only code that talks to the store, through Store.
//
//   - Publish: the engine goroutine notes each begun step's full blocks
//     (Begin); they ride on the write that completes their rows (Rider,
//     called by the write path as it hands that write over), and the
//     committer reads them into tier values once the write landed (Gather)
//     unless the store holds them lately, they were seen fewer than
//     AdmitAfter times, or the publish queue is full (each counted). The
//     publisher goroutines store the values in pipelined batches.
//   - Import: the engine goroutine notes each arrival's tier blocks
//     (NoteImport) and starts the step's import (StartImport): an importer
//     goroutine fetches the values while the committer waits for them in
//     queue order, ahead of the step's hit read (writer.Fetch). The
//     consumer of the step takes the import (Take) and learns which
//     requests lost a block (Failures).
//
// Goroutines: Begin, NoteImport, StartImport, Saved, Unbegin and the
// Rider on the engine goroutine; the Gather and Fetch's Wait/Applied on
// the committer; Take, Failures, Lookup and Stats on any goroutine; the
// link owns its importer and publisher goroutines (Close stops them).
// Every call that can wait on the store takes a context or is bounded by
// Config.ImportTimeout.
package tierlink

import (
	"context"
	"fmt"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/omnicache/omnicache/internal/errs"
	"github.com/omnicache/omnicache/internal/hist"
	"github.com/omnicache/omnicache/tier"
)

// Store is what the link asks of a tier: *tier.Tier implements it.
type Store interface {
	// Lookup counts the leading blocks of hashes the store holds.
	Lookup(ctx context.Context, hashes []uint64) (int, error)
	// FetchInto reads blocks' rows: rows[j*nkeys+k], or errs[j] for a
	// block it could not deliver; the rows are views into used (buf
	// reused when large enough) where the store copies into a buffer of
	// the caller's, which it may pass again once done with them.
	FetchInto(ctx context.Context, hashes []uint64, buf []byte) (rows [][]byte, errs []error, used []byte)
	// NewValue returns a fresh value for key k of block hash and the part
	// of it the rows go in; PutValues stores values so made, Recycle
	// gives back values not stored.
	NewValue(hash uint64, k int) (val, rows []byte)
	PutValues(ctx context.Context, hashes []uint64, vals [][]byte) (int64, error)
	Recycle(vals [][]byte)
	// StoredRecently reports a block stored through this Store lately;
	// ForgetRecent forgets them all.
	StoredRecently(hash uint64) bool
	ForgetRecent()
	// Sightings counts how often blocks were seen (AdmitAfter).
	Sightings() *tier.Sightings
	// CircuitOpened is closed when a store call ran out of time.
	CircuitOpened() <-chan struct{}
	BlockBytes(k int) int
	Stats() tier.Stats
	Histograms() []tier.Histogram
	CanPurge() bool
	Purge(ctx context.Context) (int, error)
	String() string
}

// Config is the link's part of the cache's TierConfig, validated and
// defaulted by the root package.
type Config struct {
	NKeys                      int
	ImportTimeout              time.Duration
	PublishQueue, PublishBatch int
	AdmitAfter                 int
	Importers, Publishers      int
	// OnImport, when set, is called once per import that ran (committer).
	OnImport func(Event)
	// Barrier tracks every noted block's outcome for WaitPublished.
	Barrier bool
}

// Event describes one step's import (the root's ImportEvent).
type Event struct {
	Blocks, Failed int
	Bytes          int64
	Latency        time.Duration
}

// Stats are the link's counters.
type Stats struct {
	Published, Dropped, Skipped, PublishErrors, BytesPublished, Pending int64
	Recent, Unadmitted                                                  int64
	Imported, ImportFailed, BytesImported                               int64
	CircuitOpens                                                        int64
	CircuitOpen                                                         bool
}

// Link is a cache's side of the tier: see the package doc.
type Link struct {
	cfg    Config
	t      Store
	fetchQ chan *Import
	// fetchBufs keeps the buffers of imports applied for the next fetches
	// (at most one per importer): their pages stay touched.
	fetchBufs chan []byte
	// pubQ carries batches of gathered blocks to the publishers; queued
	// counts the blocks in it (the bound, PublishQueue). batchFree recycles
	// batches: a steady publish stream allocates nothing per block (the
	// values come from Store.NewValue).
	pubQ      chan *pubBatch
	batchFree chan *pubBatch
	wg        sync.WaitGroup
	eng       engine // engine goroutine only

	// Read by every Discard and Materialize (imports), written only with
	// an import: off the lines the committer and the publishers write on
	// every batch (a shared line cost each Discard a miss).
	_       [128]byte
	mu      sync.Mutex
	byStep  map[uint64]*Import // saved steps' imports, guarded by mu
	imports atomic.Int64       // entries in byStep
	_       [128]byte

	queued                                         atomic.Int64
	published, dropped, skipped, pubErrs, bytesPub atomic.Int64
	recent                                         atomic.Int64  // not gathered: the tier stored them lately
	unadmitted                                     atomic.Int64  // not gathered: seen fewer than AdmitAfter times
	pending                                        atomic.Int64  // queued or being stored
	stopping                                       atomic.Bool   // Close: queued blocks are dropped, not stored
	epoch                                          atomic.Uint64 // bumped by Reset: batches sent before are dropped
	imported, importFailed, bytesImp               atomic.Int64

	bar *barrier // Config.Barrier: outcomes of the blocks noted
	// publishLag: noted (the step's Begin) to stored, per block stored
	// (with Barrier); importTime: Begin to rows in the mirror, per import;
	// importWait: the consumer's wait for an import (Failures).
	publishLag, importTime, importWait *hist.H
}

// New starts the link's importer and publisher goroutines over store t.
func New(t Store, cfg Config) *Link {
	l := &Link{cfg: cfg, t: t, byStep: map[uint64]*Import{},
		fetchQ: make(chan *Import, 4*cfg.Importers), fetchBufs: make(chan []byte, cfg.Importers), pubQ: make(chan *pubBatch, cfg.PublishQueue),
		batchFree:  make(chan *pubBatch, cfg.PublishQueue),
		publishLag: hist.NewDur(), importTime: hist.NewDur(), importWait: hist.NewDur()}
	if cfg.Barrier {
		l.bar = newBarrier()
	}
	// Goroutines labelled for CPU profiles, as the committer.
	run := func(label string, f func()) {
		l.wg.Add(1)
		go pprof.Do(context.Background(), pprof.Labels("omnicache", label), func(context.Context) {
			defer l.wg.Done()
			f()
		})
	}
	for i := 0; i < cfg.Importers; i++ {
		run("tier-importer", func() {
			for j := range l.fetchQ {
				l.fetch(j)
			}
		})
	}
	for i := 0; i < cfg.Publishers; i++ {
		run("tier-publisher", l.publish)
	}
	return l
}

// Store is the tier the link talks to.
func (l *Link) Store() Store { return l.t }

// Close stops the goroutines once nothing can queue to them any more (no
// call in flight, the committer stopped). A fetch in flight ends within
// ImportTimeout, a store in flight within the tier's timeout; blocks still
// queued for publishing are dropped (counted), so that a dead tier cannot
// make Close wait for every queued batch.
func (l *Link) Close() {
	l.stopping.Store(true)
	close(l.fetchQ)
	close(l.pubQ)
	l.wg.Wait()
	if l.bar != nil {
		l.bar.abandon()
	}
}

// observeLag records a stored block's publish lag.
func (l *Link) observeLag(d time.Duration) { l.publishLag.Observe(int64(d)) }

// Histograms are the link's own: publish lag (with Barrier), import time
// and the consumers' import waits, in nanoseconds.
func (l *Link) Histograms() (publishLag, importTime, importWait *hist.H) {
	return l.publishLag, l.importTime, l.importWait
}

// Lookup returns how many leading blocks of hashes the tier holds, bounded
// by ctx and the tier's timeout. Any goroutine.
func (l *Link) Lookup(ctx context.Context, hashes []uint64) (int, error) {
	return l.t.Lookup(ctx, hashes)
}

// Reset drops the blocks queued for publishing (gathered before the
// Reset), waits for the stores in flight (bounded by wait; negative: no
// bound) and forgets the blocks stored lately, so that blocks computed
// after the Reset are published again. Engine goroutine, after the write
// path dropped its rows.
func (l *Link) Reset(wait time.Duration) error {
	l.epoch.Add(1)
	deadline := time.Now().Add(wait)
	for l.pending.Load() > 0 {
		if wait >= 0 && time.Now().After(deadline) {
			return fmt.Errorf("%w: Reset: %d blocks still being stored after %v", errs.DeviceTimeout, l.pending.Load(), wait)
		}
		time.Sleep(100 * time.Microsecond)
	}
	l.t.ForgetRecent()
	return nil
}

// Stats reads the link's counters and the tier's circuit.
func (l *Link) Stats() Stats {
	ts := l.t.Stats()
	return Stats{
		Published: l.published.Load(), Dropped: l.dropped.Load(), Skipped: l.skipped.Load(),
		PublishErrors: l.pubErrs.Load(), BytesPublished: l.bytesPub.Load(), Pending: l.pending.Load(),
		Recent: l.recent.Load(), Unadmitted: l.unadmitted.Load(),
		Imported: l.imported.Load(), ImportFailed: l.importFailed.Load(), BytesImported: l.bytesImp.Load(),
		CircuitOpens: ts.CircuitOpens, CircuitOpen: ts.CircuitOpen,
	}
}
