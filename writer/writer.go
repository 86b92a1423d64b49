// Package writer is the cache core's write path behind one entry type: a
// Writer takes a step's per-token rows (host memory or device buffers),
// stages them through pinned pages and a byte budget, and lands them in
// per-key host mirrors keyed by slot on its own committer goroutine, so the
// caller's goroutine never copies into the mirror.
//
// The omnicache root package drives the same write path with the engine
// contract around it (plans, hits, the decode buffer, deferred keys, the
// tier); a Writer is that path on its own, for an engine or a tool that
// keeps its own bookkeeping of which slot holds which token and wants the
// rows kept off its goroutine: Write on one goroutine (the engine's), Sync
// to wait until every write landed, Read to gather landed rows.
//
// Goroutines: Write, Sync and Close on the owner's goroutine (one at a
// time); Read on any goroutine once the rows it reads landed (Sync). The
// Writer owns its committer goroutine, its staging pages and the mirrors
// (allocated lazily, on a key's first write).
//
// Errors match the root package's sentinels with errors.Is:
// omnicache.ErrConfig, ErrBudget, ErrStagingTimeout, ErrStepTooLarge,
// ErrWriteFailed (sticky: every later Write fails), ErrDeviceTimeout,
// ErrClosed.
package writer

import (
	"fmt"
	"math"
	"time"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/errs"
	"github.com/omnicache/omnicache/internal/writer"
)

// Defaults of the write path, applied to zero fields: one table for a
// Writer and for the cache (omnicache.Config's DefaultStagingDepth and the
// rest are these), so that the two default alike.
const (
	DefaultStagingDepth = 4                // staging pages
	DefaultStagingRows  = 1024             // rows of one staging page
	DefaultClaimTimeout = 30 * time.Second // a wait for a free page
	DefaultWaitTimeout  = 60 * time.Second // every wait on the committer
	DefaultBudgetBytes  = 512 << 20        // device bytes held by writes not landed
)

// Config configures a Writer. Zero fields take the defaults above.
type Config struct {
	// Device the rows come from (nil: host memory, gpu.NewHost).
	Device gpu.Device
	// NumBlocks × BlockSize slots, the same for every key.
	NumBlocks, BlockSize int
	// RowBytes is, per key, the bytes of one token's row.
	RowBytes []int
	// StagingDepth staging pages (DefaultStagingDepth) of StagingRows
	// rows each (DefaultStagingRows): a Write larger than a page fails with
	// ErrStepTooLarge.
	StagingDepth, StagingRows int
	// ClaimTimeout bounds a Write's wait for a free page
	// (DefaultClaimTimeout; ErrStagingTimeout); WaitTimeout bounds every
	// wait on the committer (DefaultWaitTimeout; ErrDeviceTimeout), Close's
	// included.
	ClaimTimeout, WaitTimeout time.Duration
	// BudgetBytes bounds the device bytes held by writes not landed yet
	// (DefaultBudgetBytes): a Write that would pass it first waits for the
	// oldest writes to land; one that cannot fit at all fails with
	// ErrBudget.
	BudgetBytes int64
}

// Limits of a Config (New fails with ErrConfig past them).
const (
	maxSlots     = math.MaxInt32 // slots are int32
	maxRowBytes  = 1 << 24
	maxPageBytes = 1 << 34
	maxDepth     = 1 << 10
)

// Writer is the write path: see the package doc.
type Writer struct {
	p      *writer.Path
	wait   time.Duration // Config.WaitTimeout, defaulted
	rows   []int
	nslots int
	step   writer.Step
	refs   writer.Refs
	closed bool
}

// New validates cfg and starts the Writer's committer. It allocates no
// mirror and no staging memory (both are made on first use).
func New(cfg Config) (*Writer, error) {
	bad := func(format string, a ...any) (*Writer, error) {
		return nil, fmt.Errorf("%w: writer: "+format, append([]any{errs.Config}, a...)...)
	}
	if cfg.NumBlocks <= 0 || cfg.BlockSize <= 0 || int64(cfg.NumBlocks)*int64(cfg.BlockSize) > maxSlots {
		return bad("%d blocks of %d slots (1 .. %d slots)", cfg.NumBlocks, cfg.BlockSize, maxSlots)
	}
	if len(cfg.RowBytes) == 0 {
		return bad("no keys")
	}
	if cfg.StagingDepth < 0 || cfg.StagingDepth > maxDepth || cfg.StagingRows < 0 || cfg.StagingRows > maxSlots {
		return bad("staging %d pages of %d rows", cfg.StagingDepth, cfg.StagingRows)
	}
	if cfg.ClaimTimeout < 0 || cfg.WaitTimeout < 0 || cfg.BudgetBytes < 0 {
		return bad("negative timeout or budget")
	}
	def := func(v, d int) int {
		if v == 0 {
			return d
		}
		return v
	}
	depth, pageRows := def(cfg.StagingDepth, DefaultStagingDepth), def(cfg.StagingRows, DefaultStagingRows)
	keys := make([]writer.KeySpec, len(cfg.RowBytes))
	var rowSum int64
	for k, rb := range cfg.RowBytes {
		if rb <= 0 || rb > maxRowBytes {
			return bad("key %d: %d row bytes (1 .. %d)", k, rb, maxRowBytes)
		}
		keys[k] = writer.KeySpec{Name: fmt.Sprint(k), RowBytes: rb}
		rowSum += int64(rb)
	}
	if rowSum*int64(pageRows) > maxPageBytes {
		return bad("a page of %d rows of %d bytes exceeds %d bytes", pageRows, rowSum, int64(maxPageBytes))
	}
	dev := cfg.Device
	if dev == nil {
		dev = gpu.NewHost()
	}
	claim, wait, budget := cfg.ClaimTimeout, cfg.WaitTimeout, cfg.BudgetBytes
	if claim == 0 {
		claim = DefaultClaimTimeout
	}
	if wait == 0 {
		wait = DefaultWaitTimeout
	}
	if budget == 0 {
		budget = DefaultBudgetBytes
	}
	p, err := writer.NewPath(writer.Config{
		Dev: dev, NumBlocks: cfg.NumBlocks, BlockSize: cfg.BlockSize, Keys: keys,
		StagingDepth: depth, Capacity: pageRows, ClaimTimeout: claim,
		Budget: budget, WaitTimeout: wait,
	})
	if err != nil {
		return nil, fmt.Errorf("writer: %w", err) // errs.Config: the slot tables do not fit
	}
	w := &Writer{p: p, wait: wait, rows: append([]int(nil), cfg.RowBytes...), nslots: cfg.NumBlocks * cfg.BlockSize}
	w.step.Out = make([]writer.Src, len(keys))
	w.step.Count = make([]int32, 1)
	w.step.IDs = make([]int64, 1)
	return w, nil
}

// Write hands one step's rows to the Writer: slots[i] receives row i of
// every key, rows[k] holding len(slots) rows of key k (host memory, or a
// device buffer of Config.Device in dev when rows is nil). It returns once
// the rows are staged (the caller may reuse its memory); they land in the
// mirror in the background, in Write order. A slot written twice holds the
// later row. A failed Write changes nothing, but for ErrWriteFailed, which
// is sticky.
func (w *Writer) Write(slots []int32, rows [][]byte, dev []gpu.Buffer) error {
	if w.closed {
		return errs.Closed
	}
	if err := w.p.Err(); err != nil {
		return err
	}
	n := len(slots)
	switch {
	case rows != nil && dev != nil:
		return fmt.Errorf("%w: writer: host rows and device buffers both given", errs.Outputs)
	case rows != nil && len(rows) != len(w.rows), dev != nil && len(dev) != len(w.rows), rows == nil && dev == nil:
		return fmt.Errorf("%w: writer: rows for %d keys", errs.Outputs, len(w.rows))
	}
	for _, s := range slots {
		if s < 0 || int(s) >= w.nslots {
			return fmt.Errorf("%w: writer: slot %d outside 0..%d", errs.Plan, s, w.nslots-1)
		}
	}
	for k, rb := range w.rows {
		var got int
		if rows != nil {
			got = len(rows[k])
			w.step.Out[k] = writer.Src{Host: rows[k]}
		} else {
			got = dev[k].Size
			w.step.Out[k] = writer.Src{Dev: dev[k]}
		}
		if got < n*rb {
			return fmt.Errorf("%w: writer: key %d has %d bytes for %d rows of %d", errs.Outputs, k, got, n, rb)
		}
	}
	if n == 0 {
		return nil
	}
	w.step.Slots, w.step.Count[0] = slots, int32(n)
	w.refs.Reset(len(w.rows))
	err := w.p.Save(&w.step, &w.refs)
	// The Writer reads no step back through refs: its pins go at once,
	// and the write is released when it landed.
	w.p.Unpin(&w.refs)
	w.step.Slots = nil
	clear(w.step.Out)
	return err
}

// Sync waits until every write handed over has landed in the mirrors.
func (w *Writer) Sync() error {
	if w.closed {
		return errs.Closed
	}
	return w.p.Sync()
}

// Read gathers key k's rows at slots into dst (len(slots) rows); a slot
// never written reads as zeros. Only landed rows are read (call Sync
// after the Writes whose rows Read needs), and no Write in flight may
// target those slots. Any goroutine.
func (w *Writer) Read(k int, slots []int32, dst []byte) error {
	if k < 0 || k >= len(w.rows) {
		return fmt.Errorf("%w: writer: key %d of %d", errs.Plan, k, len(w.rows))
	}
	if len(dst) < len(slots)*w.rows[k] {
		return fmt.Errorf("%w: writer: %d bytes for %d rows of %d", errs.Outputs, len(dst), len(slots), w.rows[k])
	}
	for _, s := range slots {
		if s < 0 || int(s) >= w.nslots {
			return fmt.Errorf("%w: writer: slot %d outside 0..%d", errs.Plan, s, w.nslots-1)
		}
	}
	m := w.p.Parts().Mirrors.Get(k)
	if m == nil {
		clear(dst[:len(slots)*w.rows[k]])
		return nil
	}
	m.Read(dst, slots)
	return nil
}

// Close lands what was written, stops the committer and frees the pages,
// the mirrors and every device buffer the Writer holds. A second Close
// returns ErrClosed.
func (w *Writer) Close() error {
	if w.closed {
		return errs.Closed
	}
	w.closed = true
	err := w.p.Sync()
	if cerr := w.p.Close(time.Now().Add(w.wait), nil); err == nil {
		err = cerr
	}
	return err
}
