"""Outputs: one step's outputs, one tensor per key, as the library reads
them (omnicache_outputs)."""

import ctypes

from . import _ffi
from ._args import _I64, _int, _ints, _rows
from .errors import ArgumentError, ArgumentTypeError, KeyLayoutError, UnknownKeyError

class Outputs:
    """One step's outputs, one tensor per key (Cache.keys order), reusable:
    set a key once when the engine writes the same buffer every step. A key
    set to None is omitted (optional keys only). Host rows are copied
    before Cache.save returns. tokens is the step's token count; each tensor
    has at least that many rows, and rows past them are padding (padded,
    at least tokens, says how many rows the forward produced; the padding
    is neither stored nor delivered). A key keeps the dtype and row shape
    of the first tensor set for it on any Outputs of its cache (another one
    raises KeyLayoutError: its rows would read back as the first's).
    accepted (speculative decoding): per scheduled request, in batch order,
    how many of its scheduled tokens were accepted (int32; None: all)."""

    def __init__(self, cache, tensors=None, tokens=0, padded=None, accepted=None):
        self._cache = cache
        self._keys = cache.keys
        nk = len(self._keys)
        self._arr = (_ffi.Tensor * nk)()
        self._c = _ffi.Outputs(0, 0, self._arr, nk)
        self._ref = ctypes.addressof(self._c)  # what save hands the library
        self._tokens = 0
        self._keep = [None] * nk
        self._index = {k.name: i for i, k in enumerate(self._keys)}
        self._cuda_dev = cache.cuda_device
        self._on_cuda = set()  # keys set to CUDA tensors
        self._event = None
        self._accepted = None
        if tensors is not None:
            self.update(tensors)
        self.tokens = tokens
        self.padded = padded
        if accepted is not None:
            self.accepted = accepted

    def update(self, tensors):
        """Sets keys from a {name: tensor} mapping or a sequence in key order."""
        if isinstance(tensors, dict):
            for name in tensors:
                if name not in self._index:
                    raise UnknownKeyError("omnicache: no key %r (keys: %s)" % (name, list(self._index)))
            for i, k in enumerate(self._keys):
                self.set(i, tensors.get(k.name))
        else:
            try:
                tensors = list(tensors)
            except TypeError:
                raise ArgumentTypeError("omnicache: outputs: a %s; want an Outputs, a {key: tensor} dict or a "
                                        "sequence in key order" % type(tensors).__name__) from None
            if len(tensors) != len(self._keys):
                raise ArgumentError("omnicache: %d tensors for %d keys" % (len(tensors), len(self._keys)))
            for i, t in enumerate(tensors):
                self.set(i, t)
        return self

    def set(self, key, tensor):
        if isinstance(key, str):
            if key not in self._index:
                raise UnknownKeyError("omnicache: no key %r (keys: %s)" % (key, list(self._index)))
            i = self._index[key]
        else:
            i = _int(key, "key index", 0, len(self._keys) - 1)
        k = self._keys[i]
        t = self._arr[i]
        self._on_cuda.discard(i)
        if tensor is None:
            t.data, t.nbytes, t.rows, t.flags, t.event = None, 0, 0, 0, 0
            self._keep[i] = None
            return self
        ptr, nbytes, rows, keep, dev, layout = _rows(tensor, k.row_bytes, k.name, self._cuda_dev)
        first = self._cache._layouts.setdefault(i, layout)
        if layout != first:
            raise KeyLayoutError("omnicache: key %r: a tensor of dtype %s and rows %s after %s and %s: a key's rows "
                                 "are stored as bytes and read back as the first tensor's; keep one dtype and row "
                                 "shape per key (or a key of its own)" % (k.name, layout[0], layout[1], first[0], first[1]))
        t.data, t.nbytes, t.rows = ptr, nbytes, rows
        t.flags, t.event = (_ffi.TENSOR_CUDA if dev else 0), 0
        if dev:
            self._on_cuda.add(i)
        self._keep[i] = keep
        return self

    def _record(self):
        """Records an event on the current CUDA stream after the engine's
        work so far (the producer of the CUDA tensors): the cache's clones
        of them start once it completed."""
        import torch

        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self._cuda_dev))
        for i in self._on_cuda:
            self._arr[i].event = ev.cuda_event
        self._event = ev  # alive until the next save

    @property
    def accepted(self):
        """Per scheduled request the accepted token counts (None: all). The
        rows of rejected tokens are never delivered and never become part of
        a hit (omnicache.Outputs.Accepted); a count outside [0, count] is
        OutputsError at save."""
        return self._accepted

    @accepted.setter
    def accepted(self, counts):
        p, n, keep = _ints(counts, "i32", "accepted")
        self._c.accepted, self._c.n_accepted = p, n
        self._accepted = keep

    @property
    def tokens(self):
        return self._tokens

    @tokens.setter
    def tokens(self, n):
        self._c.tokens = self._tokens = _int(n, "tokens", 0, _I64[1])

    @property
    def padded(self):
        return self._c.padded

    @padded.setter
    def padded(self, n):
        if n is None:
            self._c.padded = self._c.tokens
            return
        n = _int(n, "padded", 0, _I64[1])
        if n < self._c.tokens:
            raise ArgumentError("omnicache: padded %d: fewer than the %d tokens (padded counts the tokens and "
                                "the padding rows after them)" % (n, self._c.tokens))
        self._c.padded = n
