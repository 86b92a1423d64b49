// Package writer is the cache core's write path, behind one type: Path.
// It owns everything between a step's outputs and the host mirror:
//
//	Save(step) ─┬─ immediate keys ─ stage into a staging page ──┐ (one write per step)
//	            ├─ pure decode ───── park in the decode buffer ─┤ (≤ block_size steps, one write)
//	            └─ deferred keys ─── device clone, runs per request, written at finish
//	                                                            ▼
//	      Queue[Task] ─▶ Committer goroutine ─▶ Mirrors (scatter) + Tenancy/Occupancy (publish)
//
// A step's (and a decode-buffer flush's) device rows stay on the device in
// the write until the committer copies them into the write's page (one
// batch, issued for the next queued writes before and while it scatters
// the one before): Save makes no device call for them. What nobody waits
// for yet (decode-buffer flushes, small step writes, deferred runs, hit
// prefetch reads, tier imports) is handed over without waking
// a polling committer (Queue.PushLazy): a wake is a system call on the
// engine goroutine. Every wait for the committer's progress wakes it. A
// hit read joins only the queued tasks that land rows in its blocks
// (Snapshot.JoinSeq, over the engine goroutine's log of what it handed over:
// pendlog.go), not everything queued.
//
// It owns the resources those stages hold too: the device byte budget (every device
// copy is charged once and released once), the staging pages (one per
// unconsumed step), the sticky write failure, and the state lock that
// guards the reference counts of writes (Owners: pending writes of its rows;
// Pins: step records and readers).
//
// Path's calls are few: the engine goroutine's (Save, Flush,
// BufferContinues, Sync, Reset, Close, PushImport), the read path's
// (reads.go: Pin, PushRead, WaitSeq, ReadRows, Unpin and Err, which are
// the read path's interface, reader.Writes), and what the path holds
// (Usage). The cache and the read path read the mirrors, the slot tables,
// the counters and the committer's progress directly (Parts).
//
// Goroutines. Save, Flush, Sync, Reset, Close, PushImport, Pin and
// PushRead are called by the engine goroutine only (the root package's
// Begin, Save, Sync, Reset and Close). WaitSeq, ReadRows, Unpin, Err,
// Usage and the Parts may be used from any goroutine. The Committer runs
// on its own goroutine (pprof label omnicache=committer). No lock is held
// across a copy, a wait or a budget flush: the state lock covers reference
// counts and the clone table only; Budget and Pages wait on condition variables whose
// mutexes cover only their counters, and the committer on Queue's wake
// channel (or its poll timer).
package writer
