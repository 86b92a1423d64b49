// Package slots maps a step's scheduled tokens to their KV slots.
//
// The engine keeps a block table: row r lists the KV block ids of one
// request, Stride ids per row. Token position pos of a request on row r
// lives in slot
//
//	slot = Table[r*Stride + pos/blockSize]*blockSize + pos%blockSize
//
// Map computes the slot of every token scheduled in one step, requests in
// batch order; Expand computes the slots of a prefix-cache hit span from its
// block ids. Both validate their input in one pass over the requests (never
// over the tokens), return documented sentinel errors, and never write past
// len(dst).
//
//	Batch (one step)      Table, Stride = 4      dst, blockSize = 4
//	  Rows  [1 0]           row 0: [7 2 9 .]       [17 18 | 28 29 30]
//	  Start [5 0]    ──►    row 1: [3 4 . .]  ──►   row 1: pos 5, 6 in block 4 (column 1)
//	  Count [2 3]                                   row 0: pos 0, 1, 2 in block 7 (column 0)
//
// Slot arithmetic is int32 and wraps like Go's int32 arithmetic: block ids are
// taken as they are, not checked.
//
// # Goroutines
//
// Map, Expand and Total own nothing: they read the batch and write dst,
// both the caller's for the call only, and keep no state, so any goroutine
// may call them at once (the cache calls Map on the engine goroutine, in
// Begin). Select alone changes shared state: tests and benchmarks only.
//
// # Implementations
//
// Every implementation gives the same result bit for bit:
//
//	generic  the reference: one division per token (slots_generic.go)
//	go       portable Go: a shift or a reciprocal per request, runs per block
//	avx2     avo-generated AVX2 kernels (8 lanes)
//	avx512   avo-generated AVX-512 kernels (16 lanes)
//
// The best one the CPU supports is chosen once at start-up from
// github.com/klauspost/cpuid/v2; the purego and noasm build tags compile the
// assembly out. Implementations and Select (and slotstest.Run) let tests and
// benchmarks run each implementation the CPU has. The assembly is generated
// by the avo program in _asm (make generate).
package slots
