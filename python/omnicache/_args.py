"""Argument checks of the package: every plan array, output tensor, size and
step id is checked here before it crosses the ABI, with the package's typed
errors (errors.py)."""

import operator
import sys

import numpy as np

from .errors import ArgumentError, ArgumentTypeError, OutputsError

_NP = {"i64": np.dtype(np.int64), "i32": np.dtype(np.int32), "u64": np.dtype(np.uint64)}
_TORCH_NAMES = {"i64": "int64", "i32": "int32", "u64": "uint64"}
_I64, _I32, _U64 = (-(1 << 63), (1 << 63) - 1), (-(1 << 31), (1 << 31) - 1), (0, (1 << 64) - 1)


def _int(v, name, lo, hi, err=ArgumentError):
    """v as an int in [lo, hi], else err (ArgumentTypeError when it is no
    integer: a float, a bool, a string) naming it: every size and count is
    checked before it crosses the ABI, whose integer fields ctypes would
    wrap silently (2**64 + 16 blocks would make 16)."""
    if type(v) is not int:
        if isinstance(v, bool):
            raise ArgumentTypeError("omnicache: %s: %r is a bool, want an integer" % (name, v))
        try:
            v = operator.index(v)  # numpy and torch integers too
        except TypeError:
            raise ArgumentTypeError("omnicache: %s: %r is a %s, want an integer" % (name, v, type(v).__name__)) from None
    if not lo <= v <= hi:
        raise err("omnicache: %s %d: want %d..%d" % (name, v, lo, hi))
    return v


def _step(v, name="step"):
    """A step id as save returned it (a uint64 at the ABI)."""
    return v if type(v) is int and 0 <= v <= _U64[1] else _int(v, name, *_U64)


def _torch_tensor(x):
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def _ints(x, kind, name, ndim=1):
    """(pointer, length, keep-alive) of an integer array for the plan:
    a C-contiguous numpy array or CPU torch tensor of exactly the dtype
    (no silent conversion), or a list/tuple/range (converted)."""
    if x is None:
        return None, 0, None
    if isinstance(x, np.ndarray):
        if x.dtype != _NP[kind]:
            raise ArgumentTypeError("omnicache: %s: dtype %s, want %s" % (name, x.dtype, _NP[kind]))
        if x.ndim > ndim:
            raise ArgumentError("omnicache: %s: %d dimensions, want at most %d" % (name, x.ndim, ndim))
        if not x.flags.c_contiguous:
            raise ArgumentError("omnicache: %s: not C-contiguous (pass np.ascontiguousarray(...))" % name)
        return (x.ctypes.data if x.size else None), x.size, x
    if _torch_tensor(x):
        if x.device.type != "cpu":
            raise ArgumentTypeError("omnicache: %s: a %s tensor; plans are host memory" % (name, x.device.type))
        if str(x.dtype) != "torch." + _TORCH_NAMES[kind]:
            raise ArgumentTypeError("omnicache: %s: dtype %s, want torch.%s" % (name, x.dtype, _TORCH_NAMES[kind]))
        if x.dim() > ndim:
            raise ArgumentError("omnicache: %s: %d dimensions, want at most %d" % (name, x.dim(), ndim))
        if not x.is_contiguous():
            raise ArgumentError("omnicache: %s: not contiguous (pass .contiguous())" % name)
        n = x.numel()
        return (x.data_ptr() if n else None), n, x
    if isinstance(x, (list, tuple, range)):
        try:
            a = np.array(x, dtype=_NP[kind])
        except (TypeError, ValueError, OverflowError) as e:
            raise ArgumentTypeError("omnicache: %s: %s" % (name, e)) from None
        return (a.ctypes.data if a.size else None), a.size, a
    raise ArgumentTypeError("omnicache: %s: a %s; want a numpy array, a torch tensor or a list" % (name, type(x).__name__))


def _rows(x, row_bytes, name, cuda=None):
    """(pointer, nbytes, rows, keep-alive, on CUDA, layout) of one key's
    output rows: a C-contiguous numpy array or torch tensor of any dtype
    whose rows (first dimension) are row_bytes each; CUDA tensors (of device
    cuda) only for a cache on that CUDA device. layout is (dtype, row
    shape): a key keeps the first one saved (Outputs.set)."""
    dev = False
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise ArgumentError("omnicache: key %r: not C-contiguous (pass np.ascontiguousarray(...))" % name)
        nbytes, shape, ptr, dtype = x.nbytes, x.shape, x.ctypes.data, str(x.dtype)
    elif _torch_tensor(x):
        if x.device.type == "cuda" and cuda is not None:
            if x.device.index != cuda:
                raise ArgumentTypeError("omnicache: key %r: a tensor on %s for a cache on cuda:%d" % (name, x.device, cuda))
            dev = True
        elif x.device.type != "cpu":
            raise ArgumentTypeError("omnicache: key %r: a %s tensor for a cache on the host device (Cache(cuda_device=...) "
                                    "needs a cuda build of the library)" % (name, x.device.type))
        if not x.is_contiguous():
            raise ArgumentError("omnicache: key %r: not contiguous (pass .contiguous())" % name)
        nbytes, shape, ptr = x.numel() * x.element_size(), tuple(x.shape), x.data_ptr()
        dtype = str(x.dtype).replace("torch.", "")
    else:
        raise ArgumentTypeError("omnicache: key %r: a %s; want a numpy array or a torch tensor" % (name, type(x).__name__))
    if len(shape) == 0:
        raise OutputsError("omnicache: key %r: a scalar; want rows" % name)
    rows = shape[0]
    if rows and nbytes != rows * row_bytes:
        raise OutputsError("omnicache: key %r: rows of %d bytes (shape %s, %d bytes), the key's rows are %d bytes"
                           % (name, nbytes // rows, shape, nbytes, row_bytes))
    return ptr, nbytes, rows, x, dev, (dtype, tuple(shape[1:]))
