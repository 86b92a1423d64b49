// Package soa holds the cache's struct-of-arrays tables: per-slot
// occupancy, the live request table and the per-block tenancy.
// Every table is a set of flat integer columns: no per-row pointers, so the
// GC never scans them and they pass straight to assembly kernels. Tables are
// allocation-free after warm-up (columns keep their capacity across Remove
// and Reset).
//
// # Occupancy
//
// One packed word and one row index per (key) slot; NewOccupancy(n) is two
// mappings (fresh OS memory stays untouched: an all-zero word is Absent),
// and an error when the OS refuses them.
//
//	slot s        0        1        2               n-1
//	word   [ owner<<2|st | ...    | ...    | ... | ...    ]  uint64, atomic
//	row    [ row in the owner's staged rows | ... | ...   ]  uint32, cache lock
//
//	word = owner<<2 | state    state (low 2 bits): 0 Absent, 1 InTransit,
//	                                               2 Committed
//	                           owner (high 62 bits): write-task id, never
//	                                               reused, 1 .. 1<<62-1
//
// Absent is both "never written" and "the newest write omitted the key"
// (MarkAbsent: a sparse step left out an optional key); either reads as
// zeros.
//
// # Tenancy
//
// The immediate keys' table (see Tenancy): an owner per block, written and
// stale bits per slot, and an absent bit per slot for each optional key.
//
// # Requests
//
// Dense columns indexed by position 0..Len()-1; Remove moves the last
// request into the hole (swap-remove). Handles stay stable through an
// indirection, and hit block ids live in one shared arena:
//
//	position      0      1      2
//	ID        [  17  |  42  |   9  ]  int64
//	HitTokens [  32  |   0  |  16  ]  int32
//	HitOff    [   0  |   4  |   2  ]  int32 ─┐
//	HitN      [   2  |   0  |   1  ]  int32  │
//	Flags     [ ...  | ...  | ...  ]  uint32 │
//	Aux       [ ...  | ...  | ...  ]  int64  │
//	                                         ▼
//	Blocks    [ 5 7 | 3 | x x | ... ]  int32 arena (x: garbage of removed
//	            req0  req2                requests; compacted when more
//	                                      than half of it is garbage)
//	handle    [   1  |   0  |   2  ]  position → handle
//	pos       [   1  |   0  |   2  |  -1  ]  handle → position (-1: free)
//	free      [   3  ]                stack of free handles (reused LIFO)
//	index     map[id]handle
//
// # Goroutines
//
// Each table owns its columns (Occupancy's and Tenancy's large ones come
// straight from the OS: Free returns them). Requests is a single-goroutine
// table (the caller's lock). Occupancy's word column is read and written
// with sync/atomic: Load, Word and Owns are safe from any goroutine,
// concurrently with Claim, Commit and Reset. Claim and Commit may run on
// different goroutines (engine and committer); Row and the row column
// written by Claim are plain memory that the caller guards with its lock.
// Tenancy has one writer (the cache's committer: Publish, SetAbsent,
// ClearAbsent, Reset) and any number of readers (Owner, Written, Stale,
// Absent: atomic loads).
package soa
