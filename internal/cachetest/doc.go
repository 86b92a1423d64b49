// Package cachetest is the shared test harness of the cache: a small
// engine in front of one omnicache.Cache and a row oracle that knows what
// every call must return. The root package's tests and the cache-level fuzz
// targets (fuzz/) drive the cache through it.
//
// Rows. Every row the harness hands to the cache is derived from (key,
// request, position, version), a Tag: its first 8 bytes are the packed tag,
// the rest a splitmix64 stream seeded by it (FillRow). A misplaced, stale or
// foreign row is therefore detected and named in the failure message
// ("k0/req2/pos5/v0"; Describe).
//
// The oracle. A Harness keeps a model of the mirror (per key and slot, the
// tag of the latest write in step order) and, for every saved step, the
// rows Materialize must return: the step's own rows, plus, for a request
// that arrived with a hit, the model's rows of the hit slots as they stood
// once the step's own writes were applied (a hit on blocks written in the
// same step reads them). It also models delivery: what a request received
// before (a resumed request's recompute, a replaced prompt, rejected
// drafts) is left out as the cache leaves it out. A test writes steps
// (Step: scheduled requests S, arrivals A, finished, preempted, resumed,
// replaced, accepted), and Mat checks every row of a Materialize; CheckMirror
// compares the synced mirror with the model slot by slot. Every call runs
// under Guard, a deadlock detector.
//
// Plans. Engine is a model inference engine (a scheduler with a KV block
// manager: ref-counted blocks, an LRU free list whose full blocks stay
// hittable until reused) that generates whole schedules of Actions, driven
// by a seeded PRNG (Engine.Next, the property test) or by a fuzzer's bytes
// (Engine.NextFrom, FuzzCache). A Runner applies the actions to a Harness
// step by step: Begin, Save, consumption now, late, asynchronous or by
// Discard, misuse and failing calls around the step (each must return its
// documented error and change nothing), device faults and Close racing
// reads, checking every row against the oracle.
//
// Devices. GateDevice holds chosen writes in transit, AsyncDevice runs
// copies later in stream order, CountDevice counts bytes moved, BatchDevice
// has a batch copy, PinLog records staging allocations; gputest.Faulty
// (internal/gputest) injects failures.
//
// In this package the engine is that model engine (Engine), and the
// engine goroutine the test's goroutine that drives a Harness for it.
//
// Goroutines: a Harness is used by the test's goroutine (the engine
// goroutine), except where a method says otherwise (Verify may run on
// several goroutines at once).
package cachetest
