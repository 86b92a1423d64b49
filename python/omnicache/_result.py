"""Result: what Cache.materialize returns, the requests' rows per key."""

import numpy as np

from ._args import _torch_tensor
from .errors import error

class Result:
    """What materialize returns: per request (in the order asked) its id,
    hit prefix rows, total rows and ``from_``, the position of its first row
    (omnicache.Result.From: its rows are positions [from_, from_ + tokens)
    of its sequence; 0 with a hit prefix); per key one buffer (``keys``,
    by name: numpy uint8 [total_rows, row_bytes], or what materialize's
    alloc made) with the requests' rows one after another. rows(i, key)
    gives request i's ``[hit prefix | this step]`` rows, split(key) every
    request's."""

    def __init__(self, keys, ids, prefix, tokens, errs, from_, bufs):
        self.ids, self.prefix, self.tokens, self.errors, self.from_ = ids, prefix, tokens, errs, from_
        self.offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        tokens.cumsum(out=self.offsets[1:])
        self._keys = keys
        self.keys = {k.name: b for k, b in zip(keys, bufs)}

    def __len__(self):
        return len(self.ids)

    def _name(self, key):
        return key if isinstance(key, str) else self._keys[key].name

    def rows(self, i, key, dtype=None):
        """Request i's rows of key (name or index): a view of the key's
        buffer (with the default buffers, [tokens, row_bytes] uint8; viewed
        as dtype when given)."""
        lo, hi = self.offsets[i], self.offsets[i + 1]
        r = self.keys[self._name(key)][lo:hi]
        return r if dtype is None else r.view(dtype)

    def split(self, key):
        """Every request's rows of key (name or index), in order: views of
        the key's buffer along its first dimension (torch's split for a
        tensor)."""
        b = self.keys[self._name(key)]
        if len(self.ids) == 1:
            return (b,)  # the one request's rows are the whole buffer
        if _torch_tensor(b):
            return b.split(self.tokens.tolist())
        o = self.offsets.tolist()
        return [b[o[i]:o[i + 1]] for i in range(len(o) - 1)]

    def error(self, i):
        """None when request i was served, else its exception."""
        c = int(self.errors[i])
        return None if c == 0 else error(c, "omnicache: request %d not served" % int(self.ids[i]))
