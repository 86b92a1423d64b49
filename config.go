package omnicache

import (
	"fmt"
	"time"

	"github.com/omnicache/omnicache/gpu"
	"github.com/omnicache/omnicache/internal/writer"
)

// Limits New enforces (ErrConfig names the field and the limit). They keep
// every size the cache computes from a Config inside what a 64-bit process
// can address, so no call can fail later on an overflow; every product is
// checked without overflowing itself.
const (
	MaxRowBytes     = 1 << 30 // Key.RowBytes
	MaxBlockSize    = 1 << 20 // Config.BlockSize, in tokens
	MaxSlots        = 1<<31 - 1
	MaxMirrorBytes  = 1 << 46 // NumBlocks*BlockSize*RowBytes, per key (64 TiB of address space)
	MaxStagingDepth = 1 << 16
	MaxPageBytes    = 1 << 36 // StagingCapacityTokens × Σ immediate RowBytes (64 GiB)
	MaxCopyWorkers  = 1024
	// MaxBudgetBytes bounds DeviceBudgetBytes, DeferredChunkBytes and
	// ReadAheadBytes (1 PiB): sums of charges against them never wrap.
	MaxBudgetBytes = 1 << 50
	// MaxTimeout bounds StagingClaimTimeout and WaitTimeout: deadlines
	// computed from them never wrap.
	MaxTimeout = 24 * time.Hour
	// MinWaitTimeout bounds a positive WaitTimeout from below.
	MinWaitTimeout = time.Millisecond
)

// mulLE reports whether a×b ≤ limit for non-negative a and b, without
// computing a product that could wrap.
func mulLE(a, b, limit int64) bool {
	return a == 0 || b <= limit/a
}

// splitBytes overrides the smallest copy split across the copy workers
// (tests force the split on small steps; 0: the default).
var splitBytes int

// lazyBytes overrides the largest step write handed over lazily, the
// least a step weighs for its rows to go into Plan.ResultInto at Save
// (tests put small steps there; 0: the default, 4 MiB).
var lazyBytes int

// validate applies the defaults and checks every bound; it returns the
// write path's configuration.
func validate(cfg *Config) (writer.Config, error) {
	bad := func(format string, a ...any) (writer.Config, error) {
		return writer.Config{}, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...)
	}
	if cfg.NumBlocks <= 0 || cfg.BlockSize <= 0 {
		return bad("%d blocks of %d tokens", cfg.NumBlocks, cfg.BlockSize)
	}
	if cfg.BlockSize > MaxBlockSize {
		return bad("BlockSize %d exceeds %d", cfg.BlockSize, MaxBlockSize)
	}
	if !mulLE(int64(cfg.NumBlocks), int64(cfg.BlockSize), MaxSlots) {
		return bad("NumBlocks×BlockSize = %d×%d slots exceeds %d", cfg.NumBlocks, cfg.BlockSize, MaxSlots)
	}
	if len(cfg.Keys) == 0 {
		return bad("no keys")
	}
	if cfg.AllocStagingAtNew && cfg.AllocStagingAhead {
		return bad("AllocStagingAtNew and AllocStagingAhead: pick one")
	}
	if cfg.StagingDepth == 0 {
		cfg.StagingDepth = DefaultStagingDepth
	}
	if cfg.StagingCapacityTokens == 0 {
		cfg.StagingCapacityTokens = DefaultStagingCapacityTokens
	}
	if cfg.StagingClaimTimeout == 0 {
		cfg.StagingClaimTimeout = DefaultStagingClaimTimeout
	}
	if cfg.DeviceBudgetBytes == 0 {
		cfg.DeviceBudgetBytes = DefaultDeviceBudgetBytes
	}
	if cfg.DeferredChunkBytes == 0 {
		cfg.DeferredChunkBytes = DefaultDeferredChunkBytes
	}
	if cfg.WaitTimeout == 0 {
		cfg.WaitTimeout = DefaultWaitTimeout
	}
	if cfg.ReadAheadBytes == 0 {
		cfg.ReadAheadBytes = DefaultReadAheadBytes
	}
	if cfg.CopyWorkers == 0 {
		cfg.CopyWorkers = DefaultCopyWorkers()
	}
	if cfg.CopyWorkers < 0 || cfg.CopyWorkers > MaxCopyWorkers {
		return bad("CopyWorkers %d not in [0, %d]", cfg.CopyWorkers, MaxCopyWorkers)
	}
	if cfg.StagingDepth < 0 || cfg.StagingCapacityTokens < 0 || cfg.DeviceBudgetBytes < 0 || cfg.DeferredChunkBytes < 0 || cfg.ReadAheadBytes < 0 {
		return bad("negative staging depth, capacity, budget, chunk or read-ahead")
	}
	if cfg.SyncSpin < 0 || cfg.SyncSpin > MaxSyncSpin {
		return bad("SyncSpin %v not in [0, %v]", cfg.SyncSpin, MaxSyncSpin)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"DeviceBudgetBytes", cfg.DeviceBudgetBytes}, {"DeferredChunkBytes", cfg.DeferredChunkBytes}, {"ReadAheadBytes", cfg.ReadAheadBytes}} {
		if f.v > MaxBudgetBytes {
			return bad("%s %d exceeds %d", f.name, f.v, int64(MaxBudgetBytes))
		}
	}
	if cfg.StagingClaimTimeout > MaxTimeout {
		return bad("StagingClaimTimeout %v exceeds %v", cfg.StagingClaimTimeout, MaxTimeout)
	}
	if cfg.WaitTimeout > MaxTimeout {
		return bad("WaitTimeout %v exceeds %v", cfg.WaitTimeout, MaxTimeout)
	}
	if cfg.WaitTimeout > 0 && cfg.WaitTimeout < MinWaitTimeout {
		return bad("WaitTimeout %v under %v: an ordinary scheduling delay would fail the cache", cfg.WaitTimeout, MinWaitTimeout)
	}
	if cfg.StagingDepth > MaxStagingDepth {
		return bad("StagingDepth %d exceeds %d", cfg.StagingDepth, MaxStagingDepth)
	}
	if cfg.StagingCapacityTokens > MaxSlots {
		return bad("StagingCapacityTokens %d exceeds %d", cfg.StagingCapacityTokens, MaxSlots)
	}
	nslots := int64(cfg.NumBlocks) * int64(cfg.BlockSize)
	keys := make([]writer.KeySpec, len(cfg.Keys))
	seen := make(map[string]bool, len(cfg.Keys))
	var immRow int64
	for i, k := range cfg.Keys {
		switch {
		case k.RowBytes <= 0:
			return bad("key %q has %d row bytes", k.Name, k.RowBytes)
		case k.RowBytes > MaxRowBytes:
			return bad("key %q: RowBytes %d exceeds %d", k.Name, k.RowBytes, MaxRowBytes)
		case !mulLE(nslots, int64(k.RowBytes), MaxMirrorBytes):
			return bad("key %q: mirror of %d slots × %d bytes exceeds %d bytes", k.Name, nslots, k.RowBytes, int64(MaxMirrorBytes))
		case seen[k.Name]:
			return bad("duplicate key name %q", k.Name)
		}
		seen[k.Name] = true
		keys[i] = writer.KeySpec{Name: k.Name, RowBytes: k.RowBytes, Deferred: k.Deferred, Optional: k.Optional}
		if !k.Deferred {
			immRow += int64(k.RowBytes)
		}
	}
	if !mulLE(int64(cfg.StagingCapacityTokens), immRow, MaxPageBytes) {
		return bad("StagingCapacityTokens×Σ RowBytes = %d×%d bytes a page exceeds %d", cfg.StagingCapacityTokens, immRow, int64(MaxPageBytes))
	}
	if cfg.MirrorDirectMinBytes < 0 || cfg.MirrorDirectMinBytes > MaxPageBytes {
		return bad("MirrorDirectMinBytes %d not in [0, %d]", cfg.MirrorDirectMinBytes, int64(MaxPageBytes))
	}
	if pageB := int64(cfg.StagingCapacityTokens) * immRow; cfg.MirrorDirect && !mulLE(int64(cfg.StagingDepth)+1, pageB, cfg.DeviceBudgetBytes) {
		// Every step not consumed yet may hold its device rows (a direct
		// write's): StagingDepth pages' worth, and one more for the writes
		// the budget must still force out.
		return bad("MirrorDirect needs DeviceBudgetBytes %d ≥ (StagingDepth+1)×%d bytes a page", cfg.DeviceBudgetBytes, pageB)
	}
	if cfg.Device == nil {
		cfg.Device = gpu.NewHost()
	}
	alloc := writer.AllocLazy
	switch {
	case cfg.AllocStagingAtNew:
		alloc = writer.AllocAll
	case cfg.AllocStagingAhead:
		alloc = writer.AllocAhead
	}
	return writer.Config{
		Dev: cfg.Device, NumBlocks: cfg.NumBlocks, BlockSize: cfg.BlockSize, Keys: keys,
		StagingDepth: cfg.StagingDepth, Capacity: cfg.StagingCapacityTokens,
		ClaimTimeout: cfg.StagingClaimTimeout, Budget: cfg.DeviceBudgetBytes,
		ChunkBytes: cfg.DeferredChunkBytes, WaitTimeout: cfg.WaitTimeout, SyncSpin: cfg.SyncSpin, ReleaseHost: cfg.ReleaseHost,
		CopyWorkers: cfg.CopyWorkers, SplitBytes: splitBytes, LazyBytes: lazyBytes, Hists: newWriterHists(cfg.Histograms),
		Direct: cfg.MirrorDirect, DirectMinBytes: cfg.MirrorDirectMinBytes, Alloc: alloc,
	}, nil
}
