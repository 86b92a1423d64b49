"""ctypes bindings of libomnicache.so (internal/capi/omnicache.h), loaded lazily.

The bottom of the package: it imports only errors. The structs, flags and
calls here mirror the header; tests/test_header.py checks them against it.

The library starts a Go runtime when it is loaded, and a Go runtime does not
survive a fork: importing this package loads nothing; the first Cache (or
version()) loads the library. ctypes.CDLL releases the GIL around every
call, so a call that waits (a save waiting for a staging page, a
materialize joining a write) lets other Python threads run.
"""

import ctypes
import os
import threading

from .errors import LoadError, StagingTimeoutError, StepTooLargeError, error

c_i64 = ctypes.c_int64
c_i32 = ctypes.c_int32
c_u32 = ctypes.c_uint32
c_u64 = ctypes.c_uint64
c_ptr = ctypes.c_void_p


class Key(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("row_bytes", c_i64), ("flags", c_u32), ("reserved", c_u32)]


class Config(ctypes.Structure):
    _fields_ = [
        ("num_blocks", c_i64),
        ("block_size", c_i64),
        ("keys", ctypes.POINTER(Key)),
        ("nkeys", c_i64),
        ("staging_depth", c_i64),
        ("staging_capacity_tokens", c_i64),
        ("staging_claim_timeout_s", ctypes.c_double),
        ("device_budget_bytes", c_i64),
        ("deferred_chunk_bytes", c_i64),
        ("wait_timeout_s", ctypes.c_double),
        ("read_ahead_bytes", c_i64),
        ("copy_workers", c_i64),
        ("flags", c_u32),
        ("cuda_device", c_i32),
        ("tier_spec", ctypes.c_char_p),
        ("tier_model", ctypes.c_char_p),
        ("tier_import_timeout_s", ctypes.c_double),
    ]


class Plan(ctypes.Structure):
    _fields_ = [
        ("ids", c_ptr), ("rows", c_ptr), ("start", c_ptr), ("count", c_ptr), ("n", c_i64),
        ("table", c_ptr), ("table_len", c_i64), ("stride", c_i64),
        ("arrivals", c_ptr), ("hit_tokens", c_ptr), ("n_arrivals", c_i64),
        ("hit_blocks", c_ptr), ("n_hit_blocks", c_i64),
        ("finished", c_ptr), ("n_finished", c_i64),
        ("preempted", c_ptr), ("n_preempted", c_i64),
        ("resumed", c_ptr), ("n_resumed", c_i64),
        ("full_blocks", c_ptr), ("full_hashes", c_ptr), ("n_full", c_i64),
        ("tier_blocks", c_ptr), ("n_tier_blocks", c_i64),
        ("tier_hashes", c_ptr), ("n_tier_hashes", c_i64),
        ("replaced", c_ptr), ("replaced_from", c_ptr), ("n_replaced", c_i64),
    ]


class Tensor(ctypes.Structure):
    _fields_ = [("data", c_ptr), ("nbytes", c_i64), ("rows", c_i64), ("flags", c_u32), ("reserved", c_u32),
                ("event", c_u64)]


class Outputs(ctypes.Structure):
    _fields_ = [("tokens", c_i64), ("padded", c_i64), ("tensors", ctypes.POINTER(Tensor)), ("ntensors", c_i64),
                ("accepted", c_ptr), ("n_accepted", c_i64)]


class Result(ctypes.Structure):
    _fields_ = [
        ("cap_reqs", c_i64),
        ("ids", c_ptr), ("prefix", c_ptr), ("tokens", c_ptr), ("errs", c_ptr), ("from_", c_ptr),
        ("key_data", ctypes.POINTER(c_ptr)), ("key_cap", ctypes.POINTER(c_i64)), ("nkeys", c_i64),
        ("n_reqs", c_i64), ("total_rows", c_i64),
    ]


class Cells(ctypes.Structure):
    """Two int64 out-cells in one object (omnicache_step_rows' n_reqs and rows)."""

    _fields_ = [("n", c_i64), ("rows", c_i64)]


KEY_OPTIONAL = 1
KEY_DEFERRED = 2
DISABLE_DECODE_BUFFER = 1
DISABLE_PREFETCH = 2
ALLOC_STAGING_AT_NEW = 4
ALLOC_STAGING_AHEAD = 8
DEVICE_CUDA = 16
TIER_PUBLISH_BARRIER = 32
TENSOR_CUDA = 1
MATERIALIZE_OWN = 1
ABI_VERSION = 6  # the layouts above and the calls of signatures() (OMNICACHE_ABI_VERSION)


def signatures():
    """The library's calls this package binds: name -> (restype, argtypes)
    (the header declares exactly these)."""
    P = ctypes.POINTER
    return {
        "omnicache_version": (ctypes.c_char_p, []),
        "omnicache_abi_version": (ctypes.c_int, []),
        "omnicache_last_error": (c_i64, [ctypes.c_char_p, c_i64]),
        "omnicache_last_error_steps": (c_i64, [c_ptr, c_i64]),
        "omnicache_new": (ctypes.c_int, [P(Config), P(c_u64)]),
        "omnicache_close": (ctypes.c_int, [c_u64]),
        "omnicache_begin": (ctypes.c_int, [c_u64, c_ptr]),
        "omnicache_discard_begin": (ctypes.c_int, [c_u64, c_u64, c_ptr]),
        "omnicache_discard_begin_into": (ctypes.c_int, [c_u64, c_u64, c_ptr, c_ptr, c_ptr, c_i64]),
        "omnicache_discard_begin_dev": (ctypes.c_int, [c_u64, c_u64, c_ptr, c_ptr, c_ptr, c_i64, c_u64]),
        "omnicache_save": (ctypes.c_int, [c_u64, c_ptr, c_ptr]),
        "omnicache_abort": (ctypes.c_int, [c_u64]),
        "omnicache_sync": (ctypes.c_int, [c_u64]),
        "omnicache_reset": (ctypes.c_int, [c_u64, ctypes.c_int]),
        "omnicache_discard": (ctypes.c_int, [c_u64, c_u64]),
        "omnicache_materialize": (ctypes.c_int, [c_u64, c_u64, c_ptr, c_i64, c_ptr]),
        "omnicache_materialize_dev": (ctypes.c_int, [c_u64, c_u64, c_ptr, c_u64, ctypes.c_uint32]),
        "omnicache_step_rows": (ctypes.c_int, [c_u64, c_u64, c_ptr, c_i64, c_ptr, c_ptr]),
        "omnicache_slots": (ctypes.c_int, [c_ptr, c_i64, c_i64, c_ptr, c_ptr, c_ptr, c_i64, c_i64, c_ptr,
                                           c_i64, P(c_i64)]),
        "omnicache_lookup": (ctypes.c_int, [c_u64, c_ptr, c_i64, P(c_i64)]),
        "omnicache_wait_published": (ctypes.c_int, [c_u64, c_ptr, c_i64, c_i64]),
        "omnicache_stats": (ctypes.c_int, [c_u64, c_ptr, c_i64, P(c_i64)]),
        "omnicache_stat_names": (c_i64, [ctypes.c_char_p, c_i64]),
    }


_lib = None
_lock = threading.Lock()


def lib_path():
    """Where the library is loaded from: $OMNICACHE_LIB, else the copy
    inside the package (omnicache/_lib/libomnicache.so)."""
    p = os.environ.get("OMNICACHE_LIB")
    if p:
        return p
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lib", "libomnicache.so")


def lib():
    """The loaded library (loaded on first use)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = lib_path()
            if not os.path.exists(path):
                raise LoadError(
                    "omnicache: %s not found: build it with `make python` (or set OMNICACHE_LIB)" % path)
            try:
                L = ctypes.CDLL(path)
            except OSError as e:
                raise load_error(path, e) from e
            L.omnicache_abi_version.restype, L.omnicache_abi_version.argtypes = ctypes.c_int, []
            if L.omnicache_abi_version() != ABI_VERSION:  # before binding calls an older library lacks
                raise LoadError("omnicache: %s has ABI %d, this package needs %d"
                                % (path, L.omnicache_abi_version(), ABI_VERSION))
            sig = signatures()
            for name, (res, args) in sig.items():
                f = getattr(L, name)
                f.restype, f.argtypes = res, args
            _lib = L
    return _lib


def load_error(path, e):
    """The LoadError for an OSError loading path: a cuda build on a
    machine without the NVIDIA driver (libcuda.so.1 missing) says so."""
    if "libcuda.so" in str(e):
        return LoadError(
            "omnicache: cannot load %s: it is a cuda build and needs the NVIDIA driver's libcuda.so.1, which "
            "this machine does not have (%s): install the driver, or load the host build (unset OMNICACHE_LIB; "
            "make python)" % (path, e))
    return LoadError("omnicache: cannot load %s: %s" % (path, e))


_msg = threading.local()


def last_error():
    """The calling thread's last error message from the library."""
    L = lib()
    buf = getattr(_msg, "buf", None)
    if buf is None:
        buf = _msg.buf = ctypes.create_string_buffer(4096)
    L.omnicache_last_error(buf, len(buf))
    return buf.value.decode("utf-8", "replace")


def last_error_steps():
    """The step ids the calling thread's last failed call names (a staging
    timeout's unconsumed steps, in save order; [] for other errors), as
    data: every one of them, however many (the message is cut at 4095
    bytes)."""
    L = lib()
    n = L.omnicache_last_error_steps(None, 0)
    if n < 0:
        raise MemoryError("omnicache: the library could not keep the step ids of the last error")
    if n == 0:
        return []
    buf = (c_u64 * n)()
    n = min(n, L.omnicache_last_error_steps(buf, n))
    return list(buf[:n])


def fast():
    """The omnicache._fast extension when it was built (make python, the
    wheel) and neither OMNICACHE_NO_FAST nor OMNICACHE_CTYPES is set, else
    None. Importing it loads nothing."""
    if os.environ.get("OMNICACHE_NO_FAST") or os.environ.get("OMNICACHE_CTYPES"):
        return None
    try:
        from . import _fast
    except ImportError:
        return None
    return _fast


def raise_error(rc):
    """Raises the exception of library error code rc, with the calling
    thread's last message (and, for a staging timeout, the step ids it
    names)."""
    msg = last_error()
    if rc == StepTooLargeError.code:
        msg += ("; a step holds at most staging_capacity_tokens tokens (default 1,024): pass "
                "Cache(staging_capacity_tokens=N) with N the engine's largest step (max_num_batched_tokens), "
                "or build the adapter's config with PrefixCacheConfig.from_vllm_config")
    steps = last_error_steps() if rc == StagingTimeoutError.code else ()
    raise error(rc, msg, steps)
