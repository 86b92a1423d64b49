"""Cache, plans, outputs and results over the C ABI (see _ffi)."""

import ctypes

import numpy as np

from . import _ffi
from ._args import _I32, _I64, _U64, _int, _ints, _rows, _step, _torch_tensor  # noqa: F401 (_torch_tensor: vllm_omni)
from .errors import (ArgumentError, ArgumentTypeError, ConfigError, KeyLayoutError, OmnicacheError, PlanError,
                     StagingTimeoutError, UnknownKeyError, error)

_ERR_SHORT_BUFFER = 102
_ERR_STEP_TOO_LARGE = 9
_PER_REQUEST = (13, 14, 18)  # AbsentRequired, Reassigned, TierMiss: a partial result


def _raise(rc):
    msg = _ffi.last_error()
    if rc == _ERR_STEP_TOO_LARGE:
        msg += ("; a step holds at most staging_capacity_tokens tokens (default 1,024): pass "
                "Cache(staging_capacity_tokens=N) with N the engine's largest step (max_num_batched_tokens), "
                "or build the adapter's config with PrefixCacheConfig.from_vllm_config")
    steps = _ffi.last_error_steps() if rc == StagingTimeoutError.code else ()
    raise error(rc, msg, steps)


class Key:
    """One per-token output: name, row size in bytes, optional (absent rows
    read as zeros; else required: a hit over absent rows is an error),
    deferred (written when its request finishes)."""

    __slots__ = ("name", "row_bytes", "optional", "deferred")

    def __init__(self, name, row_bytes, optional=False, deferred=False):
        self.name, self.row_bytes = str(name), _int(row_bytes, "key %r: row_bytes" % (name,), 1, _I64[1], ConfigError)
        self.optional, self.deferred = bool(optional), bool(deferred)

    def __repr__(self):
        return "Key(%r, %d, optional=%s, deferred=%s)" % (self.name, self.row_bytes, self.optional, self.deferred)


_PLAN_FIELDS = ("ids", "rows", "start", "count", "table", "arrivals", "hit_tokens", "hit_blocks",
                "finished", "preempted", "resumed", "full_blocks", "full_hashes", "tier_blocks", "tier_hashes",
                "replaced", "replaced_from")


class Plan:
    """One real step's plan, struct-of-arrays (omnicache.Plan), passed to
    Cache.begin. Arrays are int64 (ids), int32 (rows, positions, counts,
    blocks) or uint64 (hashes): numpy arrays or CPU torch tensors of exactly
    that dtype, C-contiguous; lists are converted. The plan keeps references
    to the arrays it was given: an engine that updates them in place (e.g.
    ``plan_start += 1`` each decode step) calls begin(plan) again with no
    setter, and the step costs one call into the library."""

    def __init__(self, ids=None, rows=None, start=None, count=None, table=None, stride=None,
                 arrivals=None, hit_tokens=None, hit_blocks=None, finished=None,
                 preempted=None, resumed=None, full_blocks=None, full_hashes=None,
                 tier_blocks=None, tier_hashes=None, replaced=None, replaced_from=None):
        self._c = _ffi.Plan()
        self._ref = _ffi.hot().ptr(ctypes.addressof(self._c))
        self._keep = {}
        self._n = 0
        if ids is not None or rows is not None or start is not None or count is not None:
            self.set_batch(ids, rows, start, count)
        if table is not None:
            self.set_table(table, stride)
        if arrivals is not None or hit_tokens is not None or hit_blocks is not None:
            self.set_arrivals(arrivals, hit_tokens, hit_blocks)
        if finished is not None:
            self.set_finished(finished)
        if preempted is not None:
            self.set_preempted(preempted)
        if resumed is not None:
            self.set_resumed(resumed)
        if full_blocks is not None or full_hashes is not None:
            self.set_full(full_blocks, full_hashes)
        if tier_blocks is not None or tier_hashes is not None:
            self.set_tier(tier_blocks, tier_hashes)
        if replaced is not None or replaced_from is not None:
            self.set_replaced(replaced, replaced_from)

    def set_batch(self, ids, rows, start, count):
        """The batch in token order: request ids, block-table rows, first
        scheduled positions, scheduled token counts."""
        a = [_ints(ids, "i64", "ids"), _ints(rows, "i32", "rows"),
             _ints(start, "i32", "start"), _ints(count, "i32", "count")]
        n = a[0][1]
        for (_, m, _), name in zip(a, ("ids", "rows", "start", "count")):
            if m != n:
                raise PlanError("omnicache: batch arrays disagree: %d ids, %d %s" % (n, m, name))
        c = self._c
        c.ids, c.rows, c.start, c.count, c.n = a[0][0], a[1][0], a[2][0], a[3][0], n
        self._n = n
        k = self._keep
        k["ids"], k["rows"], k["start"], k["count"] = a[0][2], a[1][2], a[2][2], a[3][2]
        return self

    def set_table(self, table, stride=None):
        """The engine's block table, int32 [rows][stride] (a 2-D array gives
        its stride)."""
        p, n, keep = _ints(table, "i32", "table", ndim=2)
        if stride is None:
            shape = getattr(keep, "shape", None)
            if shape is None or len(shape) != 2:
                raise PlanError("omnicache: table: a 1-D table needs its stride")
            stride = shape[1]
        c = self._c
        c.table, c.table_len, c.stride = p, n, _int(stride, "stride", 0, _I64[1], PlanError)
        self._keep["table"] = keep
        return self

    def set_arrivals(self, ids=None, hit_tokens=None, hit_blocks=None):
        """Requests seen for the first time, their hit lengths (block
        aligned) and the hits' block ids, concatenated in arrival order."""
        a = _ints(ids, "i64", "arrivals")
        h = _ints(hit_tokens if hit_tokens is not None else [0] * a[1], "i32", "hit_tokens")
        b = _ints(hit_blocks, "i32", "hit_blocks")
        if a[1] != h[1]:
            raise PlanError("omnicache: %d arrivals, %d hit_tokens" % (a[1], h[1]))
        c = self._c
        c.arrivals, c.hit_tokens, c.n_arrivals = a[0], h[0], a[1]
        c.hit_blocks, c.n_hit_blocks = b[0], b[1]
        k = self._keep
        k["arrivals"], k["hit_tokens"], k["hit_blocks"] = a[2], h[2], b[2]
        return self

    def set_finished(self, ids):
        """Finished and aborted request ids (their open writes still land)."""
        p, n, keep = _ints(ids, "i64", "finished")
        self._c.finished, self._c.n_finished = p, n
        self._keep["finished"] = keep
        return self

    def set_preempted(self, ids):
        p, n, keep = _ints(ids, "i64", "preempted")
        self._c.preempted, self._c.n_preempted = p, n
        self._keep["preempted"] = keep
        return self

    def set_resumed(self, ids):
        p, n, keep = _ints(ids, "i64", "resumed")
        self._c.resumed, self._c.n_resumed = p, n
        self._keep["resumed"] = keep
        return self

    def set_full(self, blocks, hashes):
        """With a tier: the full blocks this step completes and their
        chained hashes."""
        return self._pair("full_blocks", "i32", blocks, "full_hashes", "u64", hashes, "n_full")

    def set_tier(self, blocks, hashes):
        """With a tier: per arrival how many trailing hit blocks are imported
        from the tier, and their chained hashes."""
        b, h = _ints(blocks, "i32", "tier_blocks"), _ints(hashes, "u64", "tier_hashes")
        c = self._c
        c.tier_blocks, c.n_tier_blocks, c.tier_hashes, c.n_tier_hashes = b[0], b[1], h[0], h[1]
        self._keep["tier_blocks"], self._keep["tier_hashes"] = b[2], h[2]
        return self

    def set_replaced(self, ids, positions):
        """Streaming input: live requests whose tokens from positions[i] on
        were replaced (omnicache.Plan.Replaced, ReplacedFrom). Their rows
        from that position on are neither hit nor delivered any more (steps
        saved before and not consumed yet leave them out) and delivery
        restarts there: the engine recomputes from that position. A position
        past the tokens the request's saved steps cover, or a request not
        live, is PlanError at begin."""
        return self._pair("replaced", "i64", ids, "replaced_from", "i32", positions, "n_replaced")

    def _pair(self, fa, ka, a, fb, kb, b, fn):
        """Sets two arrays of one length: fields fa and fb (of kinds ka, kb)
        and their length fn."""
        pa, pb = _ints(a, ka, fa), _ints(b, kb, fb)
        if pa[1] != pb[1]:
            raise PlanError("omnicache: %d %s, %d %s: want one length" % (pa[1], fa, pb[1], fb))
        c = self._c
        setattr(c, fa, pa[0])
        setattr(c, fb, pb[0])
        setattr(c, fn, pa[1])
        self._keep[fa], self._keep[fb] = pa[2], pb[2]
        return self

    def clear_events(self):
        """Drops arrivals, finished, preempted, resumed, full and tier
        blocks and replaced requests (a plain step again)."""
        c = self._c
        c.n_arrivals = c.n_hit_blocks = c.n_finished = c.n_preempted = c.n_resumed = 0
        c.n_full = c.n_tier_blocks = c.n_tier_hashes = c.n_replaced = 0
        for f in _PLAN_FIELDS[5:]:
            self._keep.pop(f, None)
        return self

    @property
    def n(self):
        """The number of scheduled requests."""
        return self._n


def _plan_field(name):
    return property(lambda self: self._keep.get(name), doc="The plan's %s array as given (None: unset)." % name)


# plan.ids, plan.count, ...: the arrays as given. Properties rather than
# __getattr__, which would slow every attribute access of a Plan (begin
# reads plan._ref each step).
for _f in _PLAN_FIELDS:
    setattr(Plan, _f, _plan_field(_f))
del _f


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
        self._ref = _ffi.hot().ptr(ctypes.addressof(self._c))
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


_stat_names = None


def stat_names():
    global _stat_names
    if _stat_names is None:
        L = _ffi.lib()
        n = L.omnicache_stat_names(None, 0)
        if n < 0:
            _raise(-n)
        buf = ctypes.create_string_buffer(n + 1)
        L.omnicache_stat_names(buf, n + 1)
        _stat_names = buf.value.decode().split(",")
    return _stat_names


def version():
    """The library's version string (loads the library)."""
    return _ffi.lib().omnicache_version().decode()


# Cache's base: the _fast extension's Engine runs a plain step's begin and
# save in C (no Python frame) and hands anything else to _begin_py and
# _save_py; without the extension those are begin and save.
_FAST = _ffi.fast()
_Engine = object if _FAST is None else _FAST.Engine


class Cache(_Engine):
    """The prefix-cache core (omnicache.Cache) in this process.

    The engine contract, once per real step::

        cache.begin(plan)               # before the engine drops finished requests
        ... forward ...
        step = cache.save(outputs)      # after the forward
        cache.materialize(step, reqs)   # or cache.discard(step): exactly once

    begin, save, abort and sync are called by one thread (the engine's);
    materialize, discard, stats, lookup and close by any thread, at any
    moment. Every call releases the GIL while it runs in the library.
    """

    def __init__(self, keys, num_blocks, block_size, *, staging_depth=0, staging_capacity_tokens=0,
                 staging_claim_timeout_s=0.0, device_budget_bytes=0, deferred_chunk_bytes=0,
                 wait_timeout_s=0.0, read_ahead_bytes=0, copy_workers=0, decode_buffer=True,
                 prefetch=True, alloc_staging=None, tier=None, tier_model="", cuda_device=None):
        try:
            self.keys = [k if isinstance(k, Key) else Key(*k) for k in keys]
        except TypeError as e:
            raise ArgumentTypeError("omnicache: keys: %s; want Key(name, row_bytes) or (name, row_bytes) each" % e) from None
        num_blocks = _int(num_blocks, "num_blocks", 0, _I64[1], ConfigError)
        block_size = _int(block_size, "block_size", 0, _I64[1], ConfigError)
        sizes = {name: _int(v, name, 0, _I64[1], ConfigError) for name, v in (
            ("staging_depth", staging_depth), ("staging_capacity_tokens", staging_capacity_tokens),
            ("device_budget_bytes", device_budget_bytes), ("deferred_chunk_bytes", deferred_chunk_bytes),
            ("read_ahead_bytes", read_ahead_bytes), ("copy_workers", copy_workers))}
        cuda_device = None if cuda_device is None else _int(cuda_device, "cuda_device", 0, _I32[1], ConfigError)
        L = _ffi.lib()
        ck = (_ffi.Key * len(self.keys))()
        names = []
        for i, k in enumerate(self.keys):
            names.append(k.name.encode())
            ck[i].name, ck[i].row_bytes = names[-1], k.row_bytes
            ck[i].flags = (_ffi.KEY_OPTIONAL if k.optional else 0) | (_ffi.KEY_DEFERRED if k.deferred else 0)
        flags = 0
        if not decode_buffer:
            flags |= _ffi.DISABLE_DECODE_BUFFER
        if not prefetch:
            flags |= _ffi.DISABLE_PREFETCH
        if alloc_staging == "new":
            flags |= _ffi.ALLOC_STAGING_AT_NEW
        elif alloc_staging == "ahead":
            flags |= _ffi.ALLOC_STAGING_AHEAD
        elif alloc_staging is not None:
            raise ConfigError("omnicache: alloc_staging %r: want None, 'new' or 'ahead'" % (alloc_staging,))
        if cuda_device is not None:
            flags |= _ffi.DEVICE_CUDA
        cfg = _ffi.Config(
            num_blocks=num_blocks, block_size=block_size, keys=ck, nkeys=len(self.keys),
            staging_claim_timeout_s=staging_claim_timeout_s, wait_timeout_s=wait_timeout_s, flags=flags,
            tier_spec=None if tier is None else tier.encode(), tier_model=tier_model.encode(),
            cuda_device=cuda_device or 0, **sizes)
        h = _ffi.c_u64()
        rc = L.omnicache_new(ctypes.byref(cfg), ctypes.byref(h))
        if rc:
            _raise(rc)
        self._h = h.value
        self.num_blocks, self.block_size = num_blocks, block_size
        self.cuda_device = cuda_device
        self._closed = False
        self._layouts = {}  # key index -> (dtype, row shape) of its first tensor (Outputs.set)
        # cached entry points and argument objects: a step's calls convert
        # nothing but the handle and the step id
        hot = _ffi.hot()
        self._discard, self._discard_begin = hot.discard, hot.discard_begin
        self._save = hot.saver()
        self._materialize, self._step_rows = L.omnicache_materialize, L.omnicache_step_rows
        self._kd, self._kc = _ffi.c_ptr * len(self.keys), _ffi.c_i64 * len(self.keys)
        self._plan = None
        self._outs = None

    # -- the engine thread --

    def _begin_py(self, plan=None, discard=0, **fields):
        """begin(plan=None, discard=0, **fields): begin a real step with
        plan (a Plan), or with Plan's fields as keywords. discard, a step
        id, is discarded first in the same call into the library (an engine
        that discards the step before saves one crossing a step); if the
        discard fails nothing is begun."""
        if fields or plan is None:
            if plan is not None:
                raise ArgumentTypeError("omnicache: begin takes a Plan or keywords, not both")
            try:
                plan = Plan(**fields)
            except TypeError as e:
                raise ArgumentTypeError("omnicache: begin: %s" % e) from None
        elif type(plan) is not Plan:
            raise ArgumentTypeError("omnicache: begin: plan is a %s; want a Plan (or its fields as keywords)"
                                    % type(plan).__name__)
        discard = 0 if discard is None else _step(discard, "discard")
        rc = self._discard_begin(self._h, discard, plan._ref)  # discard 0: none
        if rc:
            _raise(rc)
        self._plan = plan

    def _save_py(self, outputs, tokens=None, padded=None, accepted=None):
        """save(outputs, tokens=None, padded=None, accepted=None): save the
        begun step's outputs (an Outputs, a {key: tensor} dict or a sequence
        in key order; tokens defaults to the plan's scheduled tokens) and
        return its step id. tokens, padded and accepted, when given, are set
        on an Outputs (and stay); with a dict or sequence accepted applies
        to this save only."""
        if type(outputs) is not Outputs or outputs._on_cuda or tokens is not None or padded is not None \
                or accepted is not None:
            try:
                outputs = self._outputs(outputs, tokens, padded, accepted)
            except OmnicacheError:
                self._undo_begin()
                raise
        sid = self._save(self._h, outputs._ref)
        if sid < 0:
            _raise(-sid)
        return sid

    if _FAST is None:
        begin, save = _begin_py, _save_py

    def _undo_begin(self):
        """A save refused before it reached the library undoes the begun
        step, as a save the library refuses does (Go: a failed Save undoes
        its Begin): either way the engine begins the step again. Nothing
        begun (SequenceError) or a closed cache: nothing to undo."""
        _ffi.lib().omnicache_abort(self._h)

    def _outputs(self, outputs, tokens, padded, accepted):
        """save's outputs other than a host Outputs saved as it is: converts
        a dict or sequence, sets tokens, padded and accepted, and records
        the CUDA event."""
        if type(outputs) is not Outputs:
            if self._outs is None:
                self._outs = Outputs(self)
            outputs = self._outs.update(outputs)
            outputs.accepted = accepted
            if tokens is None:
                plan = self._plan
                tokens = int(np.asarray(plan.count).sum()) if plan is not None and plan.n else 0
        elif accepted is not None:
            outputs.accepted = accepted
        if tokens is not None:
            outputs.tokens = tokens
            outputs.padded = padded
        elif padded is not None:
            outputs.padded = padded
        if outputs._on_cuda:
            outputs._record()
        return outputs

    def abort(self):
        """The forward failed after begin: forget the begun step."""
        rc = _ffi.lib().omnicache_abort(self._h)
        if rc:
            _raise(rc)

    def sync(self):
        """Write the decode buffer out and wait until every write landed."""
        rc = _ffi.lib().omnicache_sync(self._h)
        if rc:
            _raise(rc)

    def reset(self, purge_tier=False):
        """Drop every cached row (after a weight update; every request
        gone): steps saved before raise ResetError at materialize. With
        purge_tier the tier namespace's values are removed too."""
        rc = _ffi.lib().omnicache_reset(self._h, 1 if purge_tier else 0)
        if rc:
            _raise(rc)

    # -- any thread --

    def discard(self, step):
        """Consume step without reading it."""
        if type(step) is not int or not 0 <= step <= _U64[1]:
            step = _step(step)
        rc = self._discard(self._h, step)
        if rc:
            _raise(rc)

    def materialize(self, step, reqs=None, alloc=None):
        """Consume step and return its rows (a Result) for reqs (request
        ids; None: every request of the step, in batch order). When some
        requests could not be served (AbsentRequiredError, ReassignedError,
        TierMissError) the exception carries ``result`` (their rows zero,
        Result.error(i) naming each) and ``failed`` (their ids).

        The rows are written straight into the Result's buffers, one per
        key, the requests' rows after each other (the one copy out of the
        cache's memory). alloc(key, rows), when given, makes them: a
        C-contiguous host numpy array or torch tensor whose first
        dimension is rows, at least ``rows``, of key.row_bytes bytes each
        (e.g. ``torch.empty((rows, 2048))`` for rows of 2048 float32, or
        pinned memory); by default numpy uint8 ``[rows, key.row_bytes]``.
        Result.split(key) gives each request's rows as views of it."""
        step = _step(step)
        rp, rn, keep = None, -1, None
        if reqs is not None:
            rp, rn, keep = _ints(reqs, "i64", "reqs")
            if rp is None:
                rp = ctypes.addressof(_EMPTY)  # an empty list, not every request
        h = self._h
        cells = _ffi.Cells()  # n_reqs and rows out of step_rows
        a = ctypes.addressof(cells)
        rc = self._step_rows(h, step, rp, rn, a, a + 8)
        if rc:
            _raise(rc)
        n, rows = cells.n, cells.rows
        keys = self.keys
        res = _ffi.Result()
        kd, kc = self._kd(), self._kc()
        res.key_data, res.key_cap, res.nkeys = kd, kc, len(keys)
        for _ in range(2):  # a second time only if the step changed between the calls (it cannot grow)
            # per request: id (int64) | prefix, tokens, errs, from (int32), in one allocation
            meta = np.empty(6 * n, np.int32)
            a = meta.ctypes.data
            res.cap_reqs, res.ids, res.prefix, res.tokens, res.errs, res.from_ = (
                n, a, a + 8 * n, a + 12 * n, a + 16 * n, a + 20 * n)
            bufs = []
            for i, k in enumerate(keys):
                if alloc is None:
                    b = np.empty((rows, k.row_bytes), np.uint8)
                    kd[i], kc[i] = b.ctypes.data, b.nbytes
                else:
                    b = alloc(k, rows)
                    ptr, nbytes, got, b, _, _ = _rows(b, k.row_bytes, k.name)
                    if got < rows:
                        raise ValueError("omnicache: alloc(%r, %d) returned %d rows" % (k.name, rows, got))
                    kd[i], kc[i] = ptr, nbytes
                bufs.append(b)
            rc = self._materialize(h, step, rp, rn, ctypes.addressof(res))
            if rc != _ERR_SHORT_BUFFER:
                break
            n, rows = res.n_reqs, res.total_rows
        if rc and rc not in _PER_REQUEST:
            _raise(rc)
        m, rows = res.n_reqs, res.total_rows
        out = Result(keys, meta[:2 * m].view(np.int64), meta[2 * n:2 * n + m], meta[3 * n:3 * n + m],
                     meta[4 * n:4 * n + m], meta[5 * n:5 * n + m], [b if len(b) == rows else b[:rows] for b in bufs])
        if rc:
            e = error(rc, _ffi.last_error())
            e.result = out
            e.failed = [int(i) for i, c in zip(out.ids, out.errors) if c]
            raise e
        return out

    def lookup(self, hashes):
        """How many leading blocks of hashes (uint64 chained block hashes)
        the tier holds (ConfigError without a tier)."""
        p, n, keep = _ints(hashes, "u64", "hashes")
        held = _ffi.c_i64()
        rc = _ffi.lib().omnicache_lookup(self._h, p, n, ctypes.byref(held))
        if rc:
            _raise(rc)
        return held.value

    def stats(self):
        """The cache's counters (omnicache.Stats) as a dict."""
        names = stat_names()
        out = (_ffi.c_i64 * len(names))()
        n = _ffi.c_i64()
        rc = _ffi.lib().omnicache_stats(self._h, out, len(names), ctypes.byref(n))
        if rc:
            _raise(rc)
        return dict(zip(names, out[:n.value]))

    def close(self):
        """Close the cache: calls in flight complete or fail with
        ClosedError; later calls fail with ClosedError. Idempotent."""
        if self._closed:
            return
        self._closed = True
        rc = _ffi.lib().omnicache_close(self._h)
        if rc:
            _raise(rc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_closed", True):
            return
        try:
            self.close()
        except OmnicacheError:
            pass  # e.g. in a forked child


_EMPTY = _ffi.c_i64(0)
