"""The per-step entry points into the library, by one of its two paths:

- "fast": the omnicache._fast extension (python/omnicache/_fast.c), when
  _ffi.fast() has it; its Engine (Cache's base class) runs a plain step's
  begin and save in C, and its functions make the calls without ctypes;
- "ctypes" (about 0.8 µs a call) otherwise: OMNICACHE_NO_FAST=1 or
  OMNICACHE_CTYPES=1, or the extension not built.

Both release the GIL during every call. Whatever the path:
discard_begin(h, step, ref) and discard(h, step) return the rc; saver()
makes a cache's save(h, ref), which returns the step id (> 0) or -rc. A
ref is the address (an int) of a plan's or outputs' struct."""

import ctypes
import threading

from . import _ffi
from ._outputs import Outputs
from ._plan import Plan


class Calls:
    """The entry points of one path (see the module)."""

    def __init__(self):
        L = _ffi.lib()
        fast = _ffi.fast()
        if fast is not None:
            addr = lambda f: ctypes.cast(f, _ffi.c_ptr).value  # noqa: E731
            fast.bind(addr(L.omnicache_discard_begin), addr(L.omnicache_save), addr(L.omnicache_discard),
                      addr(L.omnicache_slots), Plan, Outputs, _ffi.raise_error)
            self.backend = "fast"
            self.discard_begin, self.discard = fast.discard_begin, fast.discard
            self.saver = lambda: fast.save
            return
        self.backend = "ctypes"
        self.discard_begin, self.discard = L.omnicache_discard_begin, L.omnicache_discard
        self.saver = lambda: _ctypes_save(L.omnicache_save)


def _ctypes_save(f):
    """save(h, ref) -> step id or -rc over ctypes' omnicache_save, with its
    own uint64 out-cell (one per cache: one thread saves at a time)."""
    cell = (_ffi.c_u64 * 1)()
    out = ctypes.addressof(cell)

    def save(h, ref):
        rc = f(h, ref, out)
        return -rc if rc else cell[0]

    return save


_calls = None
_lock = threading.Lock()


def hot():
    """The per-step entry points (loading the library first)."""
    global _calls
    if _calls is None:
        _ffi.lib()
        with _lock:
            if _calls is None:
                _calls = Calls()
    return _calls
