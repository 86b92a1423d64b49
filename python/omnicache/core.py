"""Cache, the prefix-cache core over the C ABI (see _ffi), and Key; the
step's Plan, Outputs and Result are in their own modules (re-exported
here and by the package)."""

import ctypes

import numpy as np

from . import _calls, _ffi
from ._args import _I32, _I64, _U64, _int, _ints, _rows, _step, _torch_tensor  # noqa: F401 (_torch_tensor: vllm_omni)
from ._outputs import Outputs
from ._plan import Plan
from ._result import Result
from .errors import (AbsentRequiredError, ArgumentError, ArgumentTypeError, ConfigError, OmnicacheError, OutputsError,
                     ReassignedError, ShortBufferError, TierMissError, error)

__all__ = ["Cache", "Key", "Outputs", "Plan", "Result", "stat_names", "version"]

_raise = _ffi.raise_error
# a materialize whose result is partial: these requests' errors are in it
_PER_REQUEST = (AbsentRequiredError.code, ReassignedError.code, TierMissError.code)


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
                 prefetch=True, alloc_staging=None, tier=None, tier_model="", cuda_device=None,
                 publish_barrier=False, tier_import_timeout_s=0.0):
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
        if publish_barrier:
            flags |= _ffi.TIER_PUBLISH_BARRIER
        cfg = _ffi.Config(
            num_blocks=num_blocks, block_size=block_size, keys=ck, nkeys=len(self.keys),
            staging_claim_timeout_s=staging_claim_timeout_s, wait_timeout_s=wait_timeout_s, flags=flags,
            tier_spec=None if tier is None else tier.encode(), tier_model=tier_model.encode(),
            tier_import_timeout_s=tier_import_timeout_s, cuda_device=cuda_device or 0, **sizes)
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
        hot = _calls.hot()
        self._discard, self._discard_begin = hot.discard, hot.discard_begin
        self._save = hot.saver()
        self._materialize, self._step_rows = L.omnicache_materialize, L.omnicache_step_rows
        self._kd, self._kc = _ffi.c_ptr * len(self.keys), _ffi.c_i64 * len(self.keys)
        self._plan = None
        self._outs = None
        self._dev_into = None  # the last begin_into with CUDA tensors: them, their pointers and sizes, its requests

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

    def begin_into(self, plan, into, discard=0):
        """begin(plan, discard) with into, per key (Cache.keys order), a
        host buffer (C-contiguous numpy array or torch tensor, pinned or
        not) of at least plan.result_rows() rows of the key's row bytes, for
        the step's rows as materialize of the whole step returns them
        (Plan.ResultInto): its prefetched hit rows are read into them while
        the forward runs, and a prefill's own rows (more than 4 MiB) are
        copied there by save while the library writes them to its mirror.
        materialize of the whole step into the same buffers (reqs None,
        alloc returning them) then copies only what is not there yet.
        Buffers too small are left unused. The cache borrows them until the
        step is consumed (its materialize, discard or abort returned, or its
        save failed) or the cache closed: keep them alive and do not write
        them meanwhile.

        CUDA tensors of the cache's device (a cache made with cuda_device)
        instead put the step's rows on the device (Plan.ResultDev): the
        prefetched hit rows are copied up into them while the forward runs,
        save copies the step's own rows there device to device, and
        materialize of the whole step into them waits for those copies
        rather than copy. The library's copies into them start after the
        work issued so far on the current CUDA stream."""
        if type(plan) is not Plan:
            raise ArgumentTypeError("omnicache: begin_into: plan is a %s; want a Plan" % type(plan).__name__)
        keys = self.keys
        if len(into) != len(keys):
            raise ArgumentError("omnicache: begin_into: %d buffers for %d keys" % (len(into), len(keys)))
        kd, kc = self._kd(), self._kc()
        devs = 0
        for i, (k, b) in enumerate(zip(keys, into)):
            ptr, nbytes, _, _, dev, _ = _rows(b, k.row_bytes, k.name, self.cuda_device)
            kd[i], kc[i] = ptr, nbytes
            devs += dev
        if devs not in (0, len(keys)):
            raise ArgumentError("omnicache: begin_into: %d of %d buffers are CUDA tensors: all or none" % (devs, len(keys)))
        discard = 0 if discard is None else _step(discard, "discard")
        if devs:
            rc = _ffi.lib().omnicache_discard_begin_dev(self._h, discard, plan._ref, kd, kc, len(keys), self._stream())
            if not rc:
                # materialize(step) finds the step's rows in them
                self._dev_into = (tuple(into), self._kd(*kd), self._kc(*kc), max(plan.n, 1))
        else:
            rc = _ffi.lib().omnicache_discard_begin_into(self._h, discard, plan._ref, kd, kc, len(keys))
        if rc:
            _raise(rc)
        self._plan = plan

    def _stream(self):
        """The current CUDA stream of the cache's device, as a CUstream
        handle: the library's copies into the caller's device buffers start
        after the work issued there so far."""
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return raw(self.cuda_device)
        return torch.cuda.current_stream(self.cuda_device).cuda_stream

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
        Result.split(key) gives each request's rows as views of it.

        With a cache on a CUDA device, alloc may return CUDA tensors of it
        (for the whole step only, reqs None): the rows are put there, the
        copies complete when it returns; into the step's own begin_into
        buffers it waits for the rows that moved while the engine worked.
        The library's writes start after the work issued so far on the
        current CUDA stream. materialize(step) of the step begun last with
        CUDA tensors (alloc None, reqs None) returns its rows in them."""
        step = _step(step)
        di = self._dev_into
        if alloc is None and reqs is None and di is not None:
            out = self._materialize_own(step, di)
            if out is not None:
                return out
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
            bufs, devs = [], 0
            for i, k in enumerate(keys):
                if alloc is None:
                    b = np.empty((rows, k.row_bytes), np.uint8)
                    kd[i], kc[i] = b.ctypes.data, b.nbytes
                else:
                    b = alloc(k, rows)
                    ptr, nbytes, got, b, dev, _ = _rows(b, k.row_bytes, k.name, self.cuda_device)
                    if got < rows:
                        raise ValueError("omnicache: alloc(%r, %d) returned %d rows" % (k.name, rows, got))
                    kd[i], kc[i] = ptr, nbytes
                    devs += dev
                bufs.append(b)
            if not devs:
                rc = self._materialize(h, step, rp, rn, ctypes.addressof(res))
            elif devs != len(keys) or reqs is not None:
                raise ArgumentError("omnicache: materialize: alloc returned %d CUDA tensors for %d keys%s: device buffers "
                                    "take every key of the whole step (reqs None)"
                                    % (devs, len(keys), "" if reqs is None else " and reqs were given"))
            else:
                rc = _ffi.lib().omnicache_materialize_dev(h, step, ctypes.addressof(res), self._stream(), 0)
            if rc != ShortBufferError.code:
                break
            n, rows = res.n_reqs, res.total_rows
        return self._result(rc, res, meta, n, bufs)

    def _result(self, rc, res, meta, n, bufs):
        """The Result of a materialize call into bufs that returned rc
        (per request n entries of meta); a per-request failure is raised
        with it, any other failure raised."""
        if rc and rc not in _PER_REQUEST:
            _raise(rc)
        m, rows = res.n_reqs, res.total_rows
        out = Result(self.keys, meta[:2 * m].view(np.int64), meta[2 * n:2 * n + m], meta[3 * n:3 * n + m],
                     meta[4 * n:4 * n + m], meta[5 * n:5 * n + m], [b if len(b) == rows else b[:rows] for b in bufs])
        if rc:
            e = error(rc, _ffi.last_error())
            e.result = out
            e.failed = [int(i) for i, c in zip(out.ids, out.errors) if c]
            raise e
        return out

    def _materialize_own(self, step, di):
        """materialize of step into the CUDA tensors of the last
        begin_into with them, when the step was begun with them (else None:
        the step is left unconsumed). One call into the library: the rows
        are there already, unless they could not move while the engine
        worked."""
        tensors, kd, kc, n = di
        res = _ffi.Result()
        res.key_data, res.key_cap, res.nkeys = kd, kc, len(tensors)
        f = _ffi.lib().omnicache_materialize_dev
        for _ in range(2):  # a second time only if the step has more requests than its plan said
            meta = np.empty(6 * n, np.int32)
            a = meta.ctypes.data
            res.cap_reqs, res.ids, res.prefix, res.tokens, res.errs, res.from_ = (
                n, a, a + 8 * n, a + 12 * n, a + 16 * n, a + 20 * n)
            rc = f(self._h, step, ctypes.addressof(res), self._stream(), _ffi.MATERIALIZE_OWN)
            if rc != ShortBufferError.code:
                break
            n = res.n_reqs
        if rc == OutputsError.code:
            return None  # not the step's own buffers: nothing consumed
        if not rc or rc in _PER_REQUEST:
            self._dev_into = None  # the step is consumed: the tensors are the caller's again
        return self._result(rc, res, meta, n, tensors)

    def lookup(self, hashes):
        """How many leading blocks of hashes (uint64 chained block hashes)
        the tier holds (ConfigError without a tier)."""
        p, n, keep = _ints(hashes, "u64", "hashes")
        held = _ffi.c_i64()
        rc = _ffi.lib().omnicache_lookup(self._h, p, n, ctypes.byref(held))
        if rc:
            _raise(rc)
        return held.value

    def wait_published(self, hashes, timeout_s):
        """Waits until every block of hashes (uint64 chained hashes given as
        a plan's full_hashes) is stored in the tier: a prefill instance
        calls it before it reports a request's KV transferred. Needs
        Cache(publish_barrier=True). NotPublishedError names a block that
        was not stored; WaitTimeoutError: blocks still being stored after
        timeout_s (0: do not wait)."""
        p, n, keep = _ints(hashes, "u64", "hashes")
        ns = _int(round(float(timeout_s) * 1e9), "timeout_s (in ns)", 0, _I64[1])
        rc = _ffi.lib().omnicache_wait_published(self._h, p, n, ns)
        if rc:
            _raise(rc)

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
