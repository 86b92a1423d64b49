"""ctypes bindings of libomnicache.so (capi/omnicache.h), loaded lazily.

The library starts a Go runtime when it is loaded, and a Go runtime does not
survive a fork: importing this package loads nothing; the first Cache (or
version()) loads the library. ctypes.CDLL releases the GIL around every
call, so a call that waits (a save waiting for a staging page, a
materialize joining a write) lets other Python threads run.
"""

import ctypes
import os
import threading

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
    ]


class Tensor(ctypes.Structure):
    _fields_ = [("data", c_ptr), ("nbytes", c_i64), ("rows", c_i64), ("flags", c_u32), ("reserved", c_u32),
                ("event", c_u64)]


class Outputs(ctypes.Structure):
    _fields_ = [("tokens", c_i64), ("padded", c_i64), ("tensors", ctypes.POINTER(Tensor)), ("ntensors", c_i64)]


class Result(ctypes.Structure):
    _fields_ = [
        ("cap_reqs", c_i64),
        ("ids", c_ptr), ("prefix", c_ptr), ("tokens", c_ptr), ("errs", c_ptr),
        ("key_data", ctypes.POINTER(c_ptr)), ("key_cap", ctypes.POINTER(c_i64)), ("nkeys", c_i64),
        ("n_reqs", c_i64), ("total_rows", c_i64),
    ]


KEY_OPTIONAL = 1
KEY_DEFERRED = 2
DISABLE_DECODE_BUFFER = 1
DISABLE_PREFETCH = 2
ALLOC_STAGING_AT_NEW = 4
ALLOC_STAGING_AHEAD = 8
DEVICE_CUDA = 16
TENSOR_CUDA = 1

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
                raise ImportError(
                    "omnicache: %s not found: build it with `make python` (or set OMNICACHE_LIB)" % path)
            L = ctypes.CDLL(path)
            P = ctypes.POINTER
            sig = {
                "omnicache_version": (ctypes.c_char_p, []),
                "omnicache_abi_version": (ctypes.c_int, []),
                "omnicache_last_error": (c_i64, [ctypes.c_char_p, c_i64]),
                "omnicache_new": (ctypes.c_int, [P(Config), P(c_u64)]),
                "omnicache_close": (ctypes.c_int, [c_u64]),
                "omnicache_begin": (ctypes.c_int, [c_u64, c_ptr]),
                "omnicache_discard_begin": (ctypes.c_int, [c_u64, c_u64, c_ptr]),
                "omnicache_save": (ctypes.c_int, [c_u64, c_ptr, c_ptr]),
                "omnicache_abort": (ctypes.c_int, [c_u64]),
                "omnicache_sync": (ctypes.c_int, [c_u64]),
                "omnicache_reset": (ctypes.c_int, [c_u64, ctypes.c_int]),
                "omnicache_discard": (ctypes.c_int, [c_u64, c_u64]),
                "omnicache_materialize": (ctypes.c_int, [c_u64, c_u64, c_ptr, c_i64, c_ptr]),
                "omnicache_lookup": (ctypes.c_int, [c_u64, c_ptr, c_i64, P(c_i64)]),
                "omnicache_stats": (ctypes.c_int, [c_u64, c_ptr, c_i64, P(c_i64)]),
                "omnicache_stat_names": (c_i64, [ctypes.c_char_p, c_i64]),
            }
            for name, (res, args) in sig.items():
                f = getattr(L, name)
                f.restype, f.argtypes = res, args
            if L.omnicache_abi_version() != 1:
                raise ImportError("omnicache: %s has ABI %d, this package needs 1" % (path, L.omnicache_abi_version()))
            _lib = L
    return _lib


_msg = threading.local()


def last_error():
    """The calling thread's last error message from the library."""
    L = lib()
    buf = getattr(_msg, "buf", None)
    if buf is None:
        buf = _msg.buf = ctypes.create_string_buffer(4096)
    L.omnicache_last_error(buf, len(buf))
    return buf.value.decode("utf-8", "replace")


class _Hot:
    """The per-step entry points (begin, save, discard) through cffi when it
    is importable (about 100 ns less per call than ctypes), else ctypes.
    Both release the GIL during the call. ptr(address) makes the pointer
    argument each backend takes."""

    def __init__(self):
        L = lib()
        try:
            import cffi
        except ImportError:
            cffi = None
        if cffi is None or os.environ.get("OMNICACHE_CTYPES"):
            self.backend = "ctypes"
            self.begin, self.save, self.discard = L.omnicache_begin, L.omnicache_save, L.omnicache_discard
            self.discard_begin = L.omnicache_discard_begin
            self.ptr = int
            return
        self._ffi = ffi = cffi.FFI()
        ffi.cdef("int omnicache_begin(uint64_t, void *);"
                 "int omnicache_discard_begin(uint64_t, uint64_t, void *);"
                 "int omnicache_save(uint64_t, void *, void *);"
                 "int omnicache_discard(uint64_t, uint64_t);")
        C = ffi.dlopen(lib_path())
        self.backend = "cffi"
        self.begin, self.save, self.discard = C.omnicache_begin, C.omnicache_save, C.omnicache_discard
        self.discard_begin = C.omnicache_discard_begin
        self._keep = (ffi, C)
        cast = ffi.cast
        self.ptr = lambda addr: cast("void *", addr)

    def u64(self):
        """A uint64 out-parameter: (cell, argument); cell[0] reads it."""
        if self.backend == "ctypes":
            cell = (c_u64 * 1)()
            return cell, ctypes.addressof(cell)
        cell = self._ffi.new("uint64_t *")
        return cell, cell


_hot = None


def hot():
    global _hot
    if _hot is None:
        with _lock:
            if _hot is None:
                h = _Hot()
                _hot = h
    return _hot
