package writer

import "sync/atomic"

// Counters are the write path's cumulative statistics, shared by the
// engine goroutine and the committer.
type Counters struct {
	Steps, Tasks, Rows, Bytes, Skipped, Buffered, Flushes, DeferredWrites, BudgetFlushes atomic.Int64
	HitRequests, HitTokens, HitRows, CommitNanos, Cloned, StallNanos                     atomic.Int64
}
