"""The step's KV slots from a vLLM-style block table, computed by the
library's slot kernels (Go package slots, SIMD where the CPU has it).

A full-attention KV cache group's view of the engine's input batch
(upstream's ``FullAttentionGroupView``): the block table (int32
``[rows, max_blocks]``: row r lists the KV block ids of the request on row
r), each row's computed tokens (int32 ``[rows]``: the first position
scheduled this step) and the request ids by row. The view reads them where
they are, every call: the engine updates them in place. Token position
``pos`` of the request on row ``r`` lives in slot
``table[r, pos // block_size] * block_size + pos % block_size``.

    view = FullAttentionGroupView(block_table_np, 16, num_computed_np, req_ids)
    slots = view.step_slots_cpu(view.batch_req_ids(), num_scheduled_tokens)
    layout = view.build_write_layout(num_scheduled_tokens)   # .slots_cpu
"""

import ctypes

import numpy as np

from . import _calls, _ffi
from ._args import _torch_tensor
from .vllm_omni import PrefixCacheSchedulerAdapter

_I64 = np.dtype(np.int64)


def _host_int32(x, ndim, what):
    """x as a C-contiguous int32 numpy array of ndim dimensions sharing its
    memory (a CPU torch tensor through .numpy())."""
    if _torch_tensor(x):
        if x.device.type != "cpu":
            raise TypeError("omnicache: %s: a %s tensor; want a CPU one" % (what, x.device.type))
        x = x.numpy()
    if not isinstance(x, np.ndarray):
        raise TypeError("omnicache: %s: a %s; want a numpy array or a torch tensor" % (what, type(x).__name__))
    if x.dtype != np.int32 or x.ndim != ndim or not x.flags.c_contiguous:
        raise TypeError("omnicache: %s: %s %s%s; want C-contiguous int32 of %d dimensions"
                        % (what, x.dtype, x.shape, "" if x.flags.c_contiguous else ", not contiguous", ndim))
    return x


class FullAttentionGroupView:
    """One full-attention KV cache group of the input batch.

    block_table: int32 ``[rows, max_blocks]`` (numpy, or a CPU torch
    tensor: slots are then torch tensors too); num_computed_tokens: int32
    ``[rows]``; req_ids: the batch's request ids by row (the engine's list,
    read at every call); block_size: the group's. req_id_to_index, when
    given, maps a request id to its row (the engine's dict); without it a
    request's row is its index in req_ids. All four are read in place at
    every call, never copied: the engine updates them between steps (a
    table that is reallocated needs a new view).
    """

    def __init__(self, block_table, block_size, num_computed_tokens, req_ids, req_id_to_index=None):
        self._torch = _torch_tensor(block_table)
        self._table = _host_int32(block_table, 2, "block_table")
        self._computed = _host_int32(num_computed_tokens, 1, "num_computed_tokens")
        if len(self._computed) < len(self._table):
            raise ValueError("omnicache: num_computed_tokens has %d rows, the block table %d"
                             % (len(self._computed), len(self._table)))
        self.block_size = int(block_size)
        if self.block_size <= 0:
            raise ValueError("omnicache: block_size %d" % self.block_size)
        self._req_ids = req_ids
        self._index = req_id_to_index
        # the _fast extension's slots (bound to the library by hot()), else ctypes
        self._cslots = _ffi.fast().slots if _calls.hot().backend == "fast" else None

    def batch_req_ids(self):
        """The batch's request ids in row order (a new list)."""
        return [r for r in self._req_ids if r is not None]

    def _rows_index(self):
        if self._index is not None:
            return self._index
        return {r: i for i, r in enumerate(self._req_ids) if r is not None}

    def step_slots_cpu(self, req_ids, num_scheduled):
        """The KV slot of every token scheduled this step, requests in the
        order of req_ids (a list or tuple): request r's positions
        ``[computed, computed + n)``, n its scheduled tokens
        (num_scheduled[r] for a dict, 0 when it has no entry; else
        num_scheduled[i], aligned with req_ids). One int64 numpy array (a
        torch tensor for a torch block table). A request outside the batch
        is KeyError; a row or position beyond the block table ValueError
        (omnicache.ArgumentError), and nothing is returned."""
        if self._cslots is not None:
            out = self._cslots(req_ids, num_scheduled, self._req_ids, self._index, self._table, self._computed,
                               self.block_size, np.empty, _I64)
        else:
            out = self._slots_ctypes(req_ids, num_scheduled)
        if self._torch:
            import torch

            return torch.from_numpy(out)
        return out

    def _slots_ctypes(self, req_ids, num_scheduled):
        index = self._rows_index()
        n = len(req_ids)
        rows = np.empty(n, np.int32)
        count = np.empty(n, np.int32)
        by_id = isinstance(num_scheduled, dict)
        if not by_id and len(num_scheduled) != n:
            raise ValueError("omnicache: %d requests, %d scheduled counts" % (n, len(num_scheduled)))
        for i, r in enumerate(req_ids):
            if r not in index:
                raise KeyError("omnicache: request %r is not in the batch" % (r,))
            c = int(num_scheduled.get(r, 0) if by_id else num_scheduled[i])
            if c < 0 or c > 0x7FFFFFFF:
                raise ValueError("omnicache: request %r: %d scheduled tokens" % (r, c))
            rows[i], count[i] = index[r], c
        if n and (rows.min() < 0 or rows.max() >= len(self._computed)):
            raise ValueError("omnicache: a row outside the batch's %d rows" % len(self._computed))
        start = np.ascontiguousarray(self._computed[rows])
        total = int(count.sum(dtype=np.int64))
        out = np.empty(total, np.int64)
        t = self._table
        written = _ffi.c_i64()
        rc = _ffi.lib().omnicache_slots(t.ctypes.data, t.size, t.shape[1], rows.ctypes.data, start.ctypes.data,
                                        count.ctypes.data, n, self.block_size, out.ctypes.data, total,
                                        ctypes.byref(written))
        if rc:
            _ffi.raise_error(rc)
        return out

    def build_write_layout(self, num_scheduled_tokens):
        """The step's write layout in the batch's row order, its
        ``slots_cpu`` from step_slots_cpu: PrefixCacheSchedulerAdapter's
        build_write_layout over this view."""
        return PrefixCacheSchedulerAdapter().build_write_layout(self, num_scheduled_tokens=num_scheduled_tokens)


__all__ = ["FullAttentionGroupView"]
