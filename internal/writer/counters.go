package writer

import "sync/atomic"

// Counters are the write path's cumulative statistics, shared by the
// engine goroutine, the committer and readers. They are grouped by the
// goroutine that writes them, each group on cache lines of its own, so
// the engine's per-step counts do not bounce a line the committer is
// writing (an atomic add on a shared line costs several times one on a
// line this core holds).
// linePad keeps what follows it off the cache lines of what precedes it:
// two lines, since the adjacent-line prefetcher moves lines in pairs.
type linePad [128]byte

type Counters struct {
	// written by the engine goroutine (Begin, Save and their flushes)
	Steps, Tasks, Buffered, Flushes, DeferredWrites, BudgetFlushes, Cloned, StallNanos atomic.Int64
	HitRequests, HitTokens                                                             atomic.Int64
	_                                                                                  [64]byte
	// written by the committer
	Rows, Bytes, Skipped, CommitNanos atomic.Int64
	_                                 [64]byte
	// written by readers (Materialize, any goroutine)
	HitRows, ReadsAhead, HandedBack atomic.Int64
	PrefetchUsed, PrefetchDropped   atomic.Int64
	_                               [24]byte
}
