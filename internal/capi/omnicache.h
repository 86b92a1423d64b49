/*
 * omnicache.h: the C ABI of omnicache, the per-token output prefix cache
 * (libomnicache.so, built from internal/capi/ with go build -buildmode=c-shared).
 *
 * Handles. omnicache_new returns an opaque integer handle naming one cache;
 * no Go pointer ever crosses the ABI. omnicache_close frees everything of
 * the cache (once the calls in flight on it returned); its handle answers
 * OMNICACHE_ERR_CLOSED until its table slot is reused, then
 * OMNICACHE_ERR_BAD_HANDLE.
 *
 * Memory. Plans, outputs and results are pointer-and-length arrays the
 * caller owns: the library reads plans and outputs only during the call
 * (outputs are copied before omnicache_save returns) and writes results
 * only into the buffers the caller hands to omnicache_materialize.
 *
 * Errors. Every call returns 0 or an OMNICACHE_ERR_* code (one per Go
 * sentinel error, plus the ABI's own); the message of the calling thread's
 * last failed call is copied by omnicache_last_error. A call that fails
 * changes nothing, except OMNICACHE_ERR_WRITE_FAILED (sticky). A panic in
 * the library is returned as OMNICACHE_ERR_PANIC.
 *
 * Threads. omnicache_begin, _save, _abort and _sync are called by one thread
 * at a time (the engine's); _materialize, _discard, _stats, _lookup,
 * _wait_published and _close may be called from any thread, concurrently. Calls block (a save
 * waiting for a staging page, a materialize joining a write): release any
 * interpreter lock around them.
 *
 * Fork. A process forked after the library was loaded cannot enter the Go
 * runtime (it would hang): every call in a forked child returns
 * OMNICACHE_ERR_FORKED at once, without entering Go. Load the library after
 * the fork, or spawn instead of forking.
 */
#ifndef OMNICACHE_H
#define OMNICACHE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OMNICACHE_ABI_VERSION 6 /* the struct layouts and calls below */
#define OMNICACHE_VERSION_STRING "0.1.0"

/* Error codes: stable numbers, never reused. */
enum {
	OMNICACHE_OK = 0,
	/* one per exported Go sentinel of the root package (errors.go, tier.go) */
	OMNICACHE_ERR_CONFIG = 1,          /* ErrConfig */
	OMNICACHE_ERR_CLOSED = 2,          /* ErrClosed */
	OMNICACHE_ERR_SEQUENCE = 3,        /* ErrSequence */
	OMNICACHE_ERR_PLAN = 4,            /* ErrPlan */
	OMNICACHE_ERR_UNALIGNED_HIT = 5,   /* ErrUnalignedHit */
	OMNICACHE_ERR_HIT_BLOCKS = 6,      /* ErrHitBlocks */
	OMNICACHE_ERR_TOKEN_COUNT = 7,     /* ErrTokenCount */
	OMNICACHE_ERR_OUTPUTS = 8,         /* ErrOutputs */
	OMNICACHE_ERR_STEP_TOO_LARGE = 9,  /* ErrStepTooLarge */
	OMNICACHE_ERR_STAGING_TIMEOUT = 10,/* ErrStagingTimeout */
	OMNICACHE_ERR_UNKNOWN_STEP = 11,   /* ErrUnknownStep */
	OMNICACHE_ERR_NOT_IN_STEP = 12,    /* ErrNotInStep */
	OMNICACHE_ERR_ABSENT_REQUIRED = 13,/* ErrAbsentRequired */
	OMNICACHE_ERR_REASSIGNED = 14,     /* ErrReassigned */
	OMNICACHE_ERR_BUDGET = 15,         /* ErrBudget */
	OMNICACHE_ERR_WRITE_FAILED = 16,   /* ErrWriteFailed (sticky) */
	OMNICACHE_ERR_DEVICE_TIMEOUT = 17, /* ErrDeviceTimeout */
	OMNICACHE_ERR_TIER_MISS = 18,      /* ErrTierMiss, tier.ErrMiss, tier.ErrCorrupt */
	/* the tier package's errors (tier.Err*), reachable through a tier */
	OMNICACHE_ERR_TIER_UNAVAILABLE = 19, /* tier.ErrUnavailable */
	OMNICACHE_ERR_TIER_AUTH = 20,        /* tier.ErrAuth */
	OMNICACHE_ERR_TIER_CONFIG = 21,      /* tier.ErrConfig */
	OMNICACHE_ERR_TIER_CLOSED = 22,      /* tier.ErrClosed */
	OMNICACHE_ERR_RESET = 23,            /* ErrReset: the step was saved before a reset */
	OMNICACHE_ERR_TIER_CIRCUIT_OPEN = 24,/* tier.ErrCircuitOpen (also a tier.ErrUnavailable) */
	OMNICACHE_ERR_NOT_PUBLISHED = 25,    /* ErrNotPublished: a block WaitPublished waited for was not stored */
	/* the ABI's own */
	OMNICACHE_ERR_ARGUMENT = 100,     /* a NULL pointer, negative length, bad flag */
	OMNICACHE_ERR_BAD_HANDLE = 101,   /* no such cache */
	OMNICACHE_ERR_SHORT_BUFFER = 102, /* result buffers too small; the result is kept */
	OMNICACHE_ERR_FORKED = 103,       /* called in a process forked after load */
	OMNICACHE_ERR_PANIC = 104,        /* a panic inside the library (a bug) */
	OMNICACHE_ERR_UNSUPPORTED = 105,  /* e.g. a CUDA tensor in a build without CUDA */
	OMNICACHE_ERR_INTERNAL = 106,     /* an error with no code of its own */
	OMNICACHE_ERR_NO_DEVICE = 107,    /* OMNICACHE_DEVICE_CUDA: no such CUDA device (no GPU, no driver, ordinal) */
	OMNICACHE_ERR_WAIT_TIMEOUT = 108  /* a call's own timeout ran out (omnicache_wait_published: blocks still being stored) */
};

/* omnicache_key.flags */
#define OMNICACHE_KEY_OPTIONAL 1u /* absent rows read as zeros */
#define OMNICACHE_KEY_DEFERRED 2u /* rows written when the request finishes */

typedef struct {
	const char *name; /* NUL-terminated, unique */
	int64_t row_bytes;
	uint32_t flags;
	uint32_t reserved; /* 0 */
} omnicache_key;

/* omnicache_config.flags */
#define OMNICACHE_DISABLE_DECODE_BUFFER 1u
#define OMNICACHE_DISABLE_PREFETCH 2u
#define OMNICACHE_ALLOC_STAGING_AT_NEW 4u
#define OMNICACHE_ALLOC_STAGING_AHEAD 8u
#define OMNICACHE_DEVICE_CUDA 16u /* stage through CUDA device cuda_device (cuda builds) */
#define OMNICACHE_TIER_PUBLISH_BARRIER 32u /* with a tier: track every published block's outcome (omnicache_wait_published) */

/* Config; zero fields take the Go defaults (omnicache.Config). Durations in
 * seconds: 0 default; staging_claim_timeout_s < 0 means fail at once
 * (NoWait), wait_timeout_s < 0 means no bound. */
typedef struct {
	int64_t num_blocks;
	int64_t block_size;
	const omnicache_key *keys;
	int64_t nkeys;
	int64_t staging_depth;
	int64_t staging_capacity_tokens;
	double staging_claim_timeout_s;
	int64_t device_budget_bytes;
	int64_t deferred_chunk_bytes;
	double wait_timeout_s;
	int64_t read_ahead_bytes;
	int64_t copy_workers;
	uint32_t flags;
	int32_t cuda_device; /* the CUDA device ordinal, with OMNICACHE_DEVICE_CUDA */
	/* a shared tier: NULL for none; "embedded" (this cache's own),
	 * "embedded://NAME" (an embedded store shared by every cache of this
	 * process that names it: prefill and decode instances in one process),
	 * or redis://HOST:PORT, redis-cluster://H1:P1,... */
	const char *tier_spec;
	const char *tier_model; /* the tier namespace's model name */
	/* with a tier: bound of one import's fetch, in seconds (0: 2 s) */
	double tier_import_timeout_s;
} omnicache_config;

/* One real step's plan, struct-of-arrays (omnicache.Plan). An array with
 * length 0 may be NULL. */
typedef struct {
	const int64_t *ids;   /* n: the batch in token order */
	const int32_t *rows;  /* n: row in the block table */
	const int32_t *start; /* n: first scheduled position */
	const int32_t *count; /* n: scheduled tokens */
	int64_t n;
	const int32_t *table; /* row-major [table_len/stride][stride] */
	int64_t table_len;
	int64_t stride;
	const int64_t *arrivals;   /* n_arrivals */
	const int32_t *hit_tokens; /* n_arrivals */
	int64_t n_arrivals;
	const int32_t *hit_blocks; /* n_hit_blocks: hit_tokens[i]/block_size per arrival */
	int64_t n_hit_blocks;
	const int64_t *finished;
	int64_t n_finished;
	const int64_t *preempted;
	int64_t n_preempted;
	const int64_t *resumed;
	int64_t n_resumed;
	/* with a tier */
	const int32_t *full_blocks;  /* n_full */
	const uint64_t *full_hashes; /* n_full */
	int64_t n_full;
	const int32_t *tier_blocks; /* n_tier_blocks: 0 or n_arrivals */
	int64_t n_tier_blocks;
	const uint64_t *tier_hashes;
	int64_t n_tier_hashes;
	/* streaming input: live requests whose tokens from replaced_from[i] on
	 * were replaced (Plan.Replaced, Plan.ReplacedFrom) */
	const int64_t *replaced;      /* n_replaced */
	const int32_t *replaced_from; /* n_replaced */
	int64_t n_replaced;
} omnicache_plan;

/* omnicache_tensor.flags */
#define OMNICACHE_TENSOR_CUDA 1u /* data is a CUDA device pointer (a cache with OMNICACHE_DEVICE_CUDA) */

/* One key's rows; data NULL and nbytes 0 omit an optional key. Host rows
 * are copied before omnicache_save returns; CUDA rows are cloned on the
 * cache's stream before it returns (the caller may overwrite them at once
 * on any stream ordered after the clone, e.g. after a device sync), and
 * the clone starts once `event` completed: a CUevent the caller recorded
 * on the producing stream after the rows were written (0: none, the rows
 * are complete already). */
typedef struct {
	const void *data;
	int64_t nbytes;
	int64_t rows;
	uint32_t flags;
	uint32_t reserved; /* 0 */
	uint64_t event;    /* CUevent, with OMNICACHE_TENSOR_CUDA */
} omnicache_tensor;

typedef struct {
	int64_t tokens;
	int64_t padded;
	const omnicache_tensor *tensors; /* one per key, in config order */
	int64_t ntensors;
	/* speculative decoding (Outputs.Accepted): per scheduled request, in
	 * batch order, how many of its scheduled tokens were accepted; NULL
	 * and 0: all of them */
	const int32_t *accepted; /* n_accepted */
	int64_t n_accepted;
} omnicache_outputs;

/* What omnicache_materialize fills. In: cap_reqs (entries of ids, prefix,
 * tokens, errs and from; ids, errs and from may be NULL), per key the
 * destination and its capacity in bytes. Out: n_reqs and total_rows. Key
 * k's rows are written contiguously, request after request,
 * total_rows*row_bytes[k] bytes; request i's rows start at row
 * sum(tokens[:i]), its first prefix[i] rows are its hit prefix, and they
 * are positions [from[i], from[i]+tokens[i]) of its sequence. */
typedef struct {
	int64_t cap_reqs;
	int64_t *ids;
	int32_t *prefix;
	int32_t *tokens;
	int32_t *errs; /* per request: 0 served, else the code of why not */
	int32_t *from; /* per request: the position of its first row (Result.From) */
	void *const *key_data;
	const int64_t *key_cap;
	int64_t nkeys;
	int64_t n_reqs;
	int64_t total_rows;
} omnicache_result;

const char *omnicache_version(void);
int omnicache_abi_version(void);
/* Copies the calling thread's last error message (NUL-terminated,
 * truncated to cap; messages are kept up to 4095 bytes); returns its
 * length. */
int64_t omnicache_last_error(char *buf, int64_t cap);
/* Copies the step ids the calling thread's last failed call names (the
 * unconsumed steps of an OMNICACHE_ERR_STAGING_TIMEOUT, in save order;
 * none for other errors) into buf, up to cap of them, and returns how many
 * it names, all of them whatever cap (-1 if they could not be kept: out of
 * memory). Unlike the message, they are never cut: consume these steps to
 * free the staging pages. */
int64_t omnicache_last_error_steps(uint64_t *buf, int64_t cap);

int omnicache_new(const omnicache_config *cfg, uint64_t *handle);
int omnicache_close(uint64_t h);
int omnicache_begin(uint64_t h, const omnicache_plan *plan);
/* Discards step discard (0: none) and begins plan, in one call (one
 * crossing into the library a step fewer): a failed discard begins
 * nothing; a failed begin leaves the step discarded. */
int omnicache_discard_begin(uint64_t h, uint64_t discard, const omnicache_plan *plan);
/* omnicache_discard_begin with, per key (nkeys, config order), a buffer
 * for the step's rows of every request as omnicache_materialize of the
 * whole step (reqs NULL) lays them out, key_cap[k] bytes at key_data[k]
 * (Plan.ResultInto): the step's prefetched hit rows are read into them
 * while the forward runs, and omnicache_materialize of the whole step into
 * the same buffers copies only the step's own rows. Buffers smaller than
 * the step's rows are left unused. They are borrowed until the step is
 * consumed (its materialize, discard or abort returned, its save failed)
 * or the cache closed: neither write nor free them meanwhile. nkeys other
 * than the config's is OMNICACHE_ERR_PLAN. */
int omnicache_discard_begin_into(uint64_t h, uint64_t discard, const omnicache_plan *plan, void *const *key_data,
				 const int64_t *key_cap, int64_t nkeys);
/* omnicache_discard_begin with, per key, a buffer of device memory of the
 * cache's CUDA device (OMNICACHE_DEVICE_CUDA) for the step's rows, laid out
 * as omnicache_discard_begin_into's, key_cap[k] bytes at key_data[k]
 * (Plan.ResultDev): the step's prefetched hit rows are copied up into them
 * while the forward runs, omnicache_save copies the step's own rows there
 * device to device, and omnicache_materialize_dev of the step into the same
 * buffers waits for those copies. stream is the caller's CUstream (0: the
 * NULL stream) on which it last used the buffers: the library's copies into
 * them start after the work issued there so far. Buffers smaller than
 * the step's rows are left unused. Borrowed as omnicache_discard_begin_into's
 * are. A cache on the host device is OMNICACHE_ERR_UNSUPPORTED. */
int omnicache_discard_begin_dev(uint64_t h, uint64_t discard, const omnicache_plan *plan, void *const *key_data,
				const int64_t *key_cap, int64_t nkeys, uint64_t stream);
int omnicache_save(uint64_t h, const omnicache_outputs *out, uint64_t *step);
int omnicache_abort(uint64_t h);
int omnicache_sync(uint64_t h);
/* Drops every cached row (after a weight update; every request gone):
 * steps saved before fail with OMNICACHE_ERR_RESET. purge_tier != 0 also
 * removes the tier namespace's values from the shared store. */
int omnicache_reset(uint64_t h, int purge_tier);
int omnicache_discard(uint64_t h, uint64_t step);
/* reqs NULL: every request of the step, in batch order. The rows are
 * written straight into the caller's key buffers (the one copy out of the
 * cache's memory). Buffers too small for the step (fewer than n_reqs
 * request entries, or a key with fewer than total_rows rows) are
 * OMNICACHE_ERR_SHORT_BUFFER with n_reqs and total_rows set to the sizes
 * needed, and consume nothing: call again with the same step (or size the
 * buffers first with omnicache_step_rows). On return n_reqs and total_rows
 * are what was written. With a per-request failure (ABSENT_REQUIRED,
 * REASSIGNED, TIER_MISS) every row is written (failed requests' as zeros),
 * errs names each, and the code of the first failed request is returned. */
int omnicache_materialize(uint64_t h, uint64_t step, const int64_t *reqs, int64_t nreqs,
			  omnicache_result *res);
/* omnicache_materialize of the whole step into device memory of the
 * cache's CUDA device: res->key_data are device pointers (the rows laid
 * out as omnicache_materialize lays them out). Into the step's own
 * omnicache_discard_begin_dev buffers it waits for the rows moved while
 * the engine worked and copies only what did not move; into others it
 * copies every row up. The rows are in place when it returns. stream as
 * omnicache_discard_begin_dev's: a call that writes into the buffers does
 * so after the work issued there so far (one that finds every row in place
 * does not touch it). A failed wait on it is OMNICACHE_ERR_OUTPUTS with the
 * step consumed. flags: OMNICACHE_MATERIALIZE_OWN makes buffers other than
 * those the step was begun with (and keeps: they held its rows)
 * OMNICACHE_ERR_OUTPUTS, the step unconsumed: a caller that keeps the
 * buffers of its last begin_dev materializes into them only when they are
 * the step's. */
#define OMNICACHE_MATERIALIZE_OWN 1u /* omnicache_materialize_dev: only into the step's own begin_dev buffers */
int omnicache_materialize_dev(uint64_t h, uint64_t step, omnicache_result *res, uint64_t stream, uint32_t flags);
/* How many requests, and rows per key at most, omnicache_materialize(h,
 * step, reqs, nreqs, ...) returns (each asked request's hit prefix and
 * scheduled tokens; rejected drafts and rows left out make fewer), without
 * consuming the step: the sizes of its buffers. UNKNOWN_STEP and
 * NOT_IN_STEP as omnicache_materialize. */
int omnicache_step_rows(uint64_t h, uint64_t step, const int64_t *reqs, int64_t nreqs, int64_t *n_reqs,
			int64_t *rows);
/* The KV slot of every token a step schedules, requests in batch order
 * (Go package slots, Map: SIMD where the CPU has it): request i's
 * positions [start[i], start[i]+count[i]) on block-table row rows[i] are in
 * slots table[rows[i]*stride + pos/block_size]*block_size + pos%block_size
 * (int32 arithmetic, widened to int64). table is row-major, table_len
 * entries. The whole batch is checked before anything is written: a row
 * outside the table, a negative start or count, a position beyond its row
 * or a block size out of range is OMNICACHE_ERR_ARGUMENT (the message names
 * the request). dst holds cap entries; *written is the number of slots
 * (with OMNICACHE_ERR_SHORT_BUFFER: the number needed); dst's entries
 * after them are scratch. No cache: any thread, any time. */
int omnicache_slots(const int32_t *table, int64_t table_len, int64_t stride, const int32_t *rows,
		    const int32_t *start, const int32_t *count, int64_t n, int64_t block_size, int64_t *dst,
		    int64_t cap, int64_t *written);
/* How many leading blocks of hashes the tier holds. */
int omnicache_lookup(uint64_t h, const uint64_t *hashes, int64_t n, int64_t *held);
/* Waits until every block of hashes (chained hashes the engine gave as a
 * plan's full_hashes: a request's full prompt blocks it computed) is stored
 * in the tier (Cache.WaitPublished; a cache with
 * OMNICACHE_TIER_PUBLISH_BARRIER, else OMNICACHE_ERR_CONFIG): 0 once they
 * are; OMNICACHE_ERR_NOT_PUBLISHED at once for a block that was not stored
 * (the message names it and why); OMNICACHE_ERR_WAIT_TIMEOUT when blocks are
 * still being stored after timeout_ns (0: do not wait; negative:
 * OMNICACHE_ERR_ARGUMENT). A prefill instance calls it before it reports
 * the request's KV transferred. */
int omnicache_wait_published(uint64_t h, const uint64_t *hashes, int64_t n, int64_t timeout_ns);
/* Stats as int64 counters in the order of omnicache_stat_names; *n_out is
 * the number of counters (written up to cap). */
int omnicache_stats(uint64_t h, int64_t *out, int64_t cap, int64_t *n_out);
/* Comma-separated counter names (the Go Stats field names); returns the
 * full length, copies up to cap bytes with a NUL. */
int64_t omnicache_stat_names(char *buf, int64_t cap);

#ifdef __cplusplus
}
#endif
#endif
