// The exported C entry points. Each checks, in C, that the process was not
// forked after the library was loaded (a forked child that enters the Go
// runtime hangs: only the forking thread survives a fork) and then calls
// the Go side (capi.go) with the calling thread's error-message buffer.

#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "omnicache.h"
#include "_cgo_export.h"

#include <stdlib.h>

static volatile int omnicache_forked;

// The calling thread's last error message. Only a pointer is thread-local:
// the library's TLS is static TLS (the Go runtime's model), which a
// dlopen'ed library must keep to a few bytes.
#define MSG_CAP 4096
static __thread char *omnicache_msgp;
static __thread int64_t omnicache_msglen;
static char omnicache_nomem[MSG_CAP]; // when malloc fails: shared, may mix threads

static pthread_key_t omnicache_msgkey; // frees a thread's buffer at its exit

// The step ids the calling thread's last failed call names (a staging
// timeout's unconsumed steps): an array grown as needed, with no cap (the
// message is cut at MSG_CAP; these are data). -1: the array could not grow.
static __thread uint64_t *omnicache_stepsp;
static __thread int64_t omnicache_nsteps, omnicache_stepscap;
static pthread_key_t omnicache_stepskey; // frees a thread's array at its exit

// ocgo_c_set_steps stores ids[0..n) as the calling thread's last error's
// step ids (Go calls it from the failing call, on the caller's thread).
// Not exported from the library (the version script keeps omnicache_*).
void ocgo_c_set_steps(const uint64_t *ids, int64_t n) {
	if (n > omnicache_stepscap) {
		uint64_t *p = realloc(omnicache_stepsp, (size_t)n * sizeof *p);
		if (p == NULL) {
			omnicache_nsteps = -1;
			return;
		}
		pthread_setspecific(omnicache_stepskey, p);
		omnicache_stepsp = p;
		omnicache_stepscap = n;
	}
	if (n > 0) memcpy(omnicache_stepsp, ids, (size_t)n * sizeof *ids);
	omnicache_nsteps = n;
}

static char *omnicache_msg(void) {
	if (omnicache_msgp == NULL) {
		omnicache_msgp = malloc(MSG_CAP);
		if (omnicache_msgp == NULL) return omnicache_nomem;
		omnicache_msgp[0] = 0;
		pthread_setspecific(omnicache_msgkey, omnicache_msgp);
	}
	return omnicache_msgp;
}

static void omnicache_in_child(void) { omnicache_forked = 1; }

__attribute__((constructor)) static void omnicache_at_load(void) {
	pthread_key_create(&omnicache_msgkey, free);
	pthread_key_create(&omnicache_stepskey, free);
	pthread_atfork(NULL, NULL, omnicache_in_child);
}

static const char forked_msg[] =
	"omnicache: called in a process forked after the library was loaded "
	"(the Go runtime does not survive a fork): load it in the child, or "
	"start children with spawn";

static int omnicache_refuse_fork(void) {
	size_t n = sizeof forked_msg - 1;
	memcpy(omnicache_msg(), forked_msg, n + 1);
	omnicache_msglen = (int64_t)n;
	return OMNICACHE_ERR_FORKED;
}

#define ENTER                                                                  \
	do {                                                                   \
		if (omnicache_forked) return omnicache_refuse_fork();          \
	} while (0)
#define MSG omnicache_msg(), (int64_t)MSG_CAP, &omnicache_msglen

#define STR_(x) #x
#define STR(x) STR_(x)

const char *omnicache_version(void) {
	return "omnicache " OMNICACHE_VERSION_STRING " (abi " STR(OMNICACHE_ABI_VERSION) ")";
}

int omnicache_abi_version(void) { return OMNICACHE_ABI_VERSION; }

int64_t omnicache_last_error(char *buf, int64_t cap) {
	int64_t n = omnicache_msglen;
	if (n > MSG_CAP - 1) n = MSG_CAP - 1; // the stored message is truncated
	if (buf != NULL && cap > 0) {
		int64_t c = n < cap - 1 ? n : cap - 1;
		memcpy(buf, omnicache_msg(), (size_t)c);
		buf[c] = 0;
	}
	return n;
}

int64_t omnicache_last_error_steps(uint64_t *buf, int64_t cap) {
	int64_t n = omnicache_nsteps;
	if (n > 0 && buf != NULL && cap > 0) memcpy(buf, omnicache_stepsp, (size_t)(n < cap ? n : cap) * sizeof *buf);
	return n;
}

int omnicache_new(const omnicache_config *cfg, uint64_t *handle) {
	ENTER;
	return ocgo_new((omnicache_config *)cfg, handle, MSG);
}

int omnicache_close(uint64_t h) {
	ENTER;
	return ocgo_close(h, MSG);
}

int omnicache_begin(uint64_t h, const omnicache_plan *plan) {
	ENTER;
	return ocgo_begin(h, (omnicache_plan *)plan, MSG);
}

int omnicache_discard_begin(uint64_t h, uint64_t discard, const omnicache_plan *plan) {
	ENTER;
	return ocgo_discard_begin(h, discard, (omnicache_plan *)plan, MSG);
}

int omnicache_discard_begin_into(uint64_t h, uint64_t discard, const omnicache_plan *plan, void *const *key_data,
				 const int64_t *key_cap, int64_t nkeys) {
	ENTER;
	return ocgo_discard_begin_into(h, discard, (omnicache_plan *)plan, (void **)key_data, (int64_t *)key_cap, nkeys,
				       MSG);
}

int omnicache_discard_begin_dev(uint64_t h, uint64_t discard, const omnicache_plan *plan, void *const *key_data,
				const int64_t *key_cap, int64_t nkeys, uint64_t stream) {
	ENTER;
	return ocgo_discard_begin_dev(h, discard, (omnicache_plan *)plan, (void **)key_data, (int64_t *)key_cap, nkeys,
				      stream, MSG);
}

int omnicache_save(uint64_t h, const omnicache_outputs *out, uint64_t *step) {
	ENTER;
	return ocgo_save(h, (omnicache_outputs *)out, step, MSG);
}

int omnicache_abort(uint64_t h) {
	ENTER;
	return ocgo_abort(h, MSG);
}

int omnicache_sync(uint64_t h) {
	ENTER;
	return ocgo_sync(h, MSG);
}

int omnicache_reset(uint64_t h, int purge_tier) {
	ENTER;
	return ocgo_reset(h, purge_tier, MSG);
}

int omnicache_discard(uint64_t h, uint64_t step) {
	ENTER;
	return ocgo_discard(h, step, MSG);
}

int omnicache_materialize(uint64_t h, uint64_t step, const int64_t *reqs, int64_t nreqs,
			  omnicache_result *res) {
	ENTER;
	return ocgo_materialize(h, step, (int64_t *)reqs, nreqs, res, MSG);
}

int omnicache_materialize_dev(uint64_t h, uint64_t step, omnicache_result *res, uint64_t stream, uint32_t flags) {
	ENTER;
	return ocgo_materialize_dev(h, step, res, stream, flags, MSG);
}

int omnicache_step_rows(uint64_t h, uint64_t step, const int64_t *reqs, int64_t nreqs, int64_t *n_reqs,
			int64_t *rows) {
	ENTER;
	return ocgo_step_rows(h, step, (int64_t *)reqs, nreqs, n_reqs, rows, MSG);
}

int omnicache_slots(const int32_t *table, int64_t table_len, int64_t stride, const int32_t *rows,
		    const int32_t *start, const int32_t *count, int64_t n, int64_t block_size, int64_t *dst,
		    int64_t cap, int64_t *written) {
	ENTER;
	return ocgo_slots((int32_t *)table, table_len, stride, (int32_t *)rows, (int32_t *)start, (int32_t *)count, n,
			  block_size, dst, cap, written, MSG);
}

int omnicache_lookup(uint64_t h, const uint64_t *hashes, int64_t n, int64_t *held) {
	ENTER;
	return ocgo_lookup(h, (uint64_t *)hashes, n, held, MSG);
}

int omnicache_wait_published(uint64_t h, const uint64_t *hashes, int64_t n, int64_t timeout_ns) {
	ENTER;
	return ocgo_wait_published(h, (uint64_t *)hashes, n, timeout_ns, MSG);
}

int omnicache_stats(uint64_t h, int64_t *out, int64_t cap, int64_t *n_out) {
	ENTER;
	return ocgo_stats(h, out, cap, n_out, MSG);
}

int64_t omnicache_stat_names(char *buf, int64_t cap) {
	if (omnicache_forked) {
		omnicache_refuse_fork();
		return -OMNICACHE_ERR_FORKED;
	}
	return ocgo_stat_names(buf, cap);
}
