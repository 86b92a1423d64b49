"""An adapter with the shape of vLLM-Omni's output prefix cache manager
(``vllm_omni/core/prefix_cache``: interface, adapter, manager), over the
omnicache core. Names, fields, defaults, call shapes and failure messages
follow the upstream manager, so the adapter can sit where it sits;
docs/python.md lists what maps and what does not.

The engine side, once per real step::

    step = adapter.translate_step(scheduler_output)
    m.new_step_starts(step)                      # before the engine drops finished requests
    layout = adapter.build_write_layout(group_view, num_scheduled_tokens=...)
    m.prepare_read_plans(layout)                 # optional: hit reads start now
    ... forward ...                              # failed: m.abort_prepared_step()
    sid = m.save_outputs(hidden_states, mm_outputs, num_tokens_unpadded=n,
                         num_tokens_padded=p, write_layout=layout)
    out = m.materialize(sid, req_ids)            # or m.discard_step(sid)

String request ids map to the core's integer ids (a request keeps its id
while it lives). The core is created at the first save_outputs, from the
keys, row sizes and device that step's tensors have (or at once with
``keys=``).
"""

import collections
import threading
import warnings

import numpy as np

from . import core
from ._vo_interface import (HIDDEN_KEY, ModelCachePolicy, OmniPrefixCacheStagingTimeoutError,
                            OmniPrefixCacheTierMissError, OmniPrefixCacheUnmatchError, PrefixCacheConfig,
                            PrefixCacheEventKind,
                            PrefixCacheRequestEvent, PrefixCacheSchedulerAdapter, PrefixCacheStep, PrefixCacheWrite,
                            PrefixCacheWriteLayout, StageCacheOutputs)
from ._vo_state import (KeyMeta, Pending, Req, alloc_rows, build_batch, into_alloc, is_rows, make_plan,
                        plan_events, select_device, stage_outputs, step_events, zero_rows)
from .errors import (AbsentRequiredError, NoDeviceError, OmnicacheError, ReassignedError, StagingTimeoutError,
                     TierMissError, UnsupportedError, WriteFailedError)

Unmatch = OmniPrefixCacheUnmatchError
_UNREADABLE = (AbsentRequiredError, ReassignedError, TierMissError)
# finished requests whose noted blocks wait_published(req_id) still knows
_KEEP_NOTED = 4096


class OmniPrefixCacheManager:
    """The upstream manager's surface over the omnicache core.

    ``eager`` is accepted for the upstream signature and changes nothing.
    ``prefetch_reads`` (default on): a step's hit reads start when the core
    begins the step, at prepare_read_plans, and run while the forward runs;
    off, they run at materialize. ``keys`` ({name: row_bytes}, the hidden
    key as HIDDEN_KEY) creates the core at once, on
    ``config.cuda_device``, instead of at the first save_outputs.
    ``result_buffers`` (default on, not upstream's): steps of 64 tokens or
    more, or with arrivals, are begun with their rows' buffers (_begin_core);
    off, save returns without waiting for the mirror's copy of a prefill.

    A call that raises changes nothing, except that a step whose save
    failed stays registered (save it again, or let the next
    new_step_starts drop it). Engine thread: new_step_starts,
    prepare_read_plans, abort_prepared_step, save_outputs; materialize,
    discard_step, memory_stats and stats from any thread.
    """

    def __init__(self, config: PrefixCacheConfig, *, eager=None, prefetch_reads=True, keys=None, result_buffers=True):
        self.config = config
        self.eager = True if eager is None else bool(eager)
        self.prefetch_reads, self.result_buffers = bool(prefetch_reads), bool(result_buffers)
        self.policy = ModelCachePolicy()
        self._core = None
        self._names, self._index = [], {}
        self._meta = {}  # key name -> KeyMeta (how to rebuild its rows)
        self._ignored = set()
        self._live = {}  # req_id -> Req
        self._next = 0  # core ids: 1, 2, ... (0 is never a request's)
        self._pend = None  # the step registered and not saved (Pending)
        self._steps = {}  # step id -> {req_id: core id}
        self._into = {}  # step id -> its begin_into buffers (a prefill's or a hit's)
        self._lock = threading.Lock()  # _steps: materialize may run on another thread
        self._fatal = None  # a failed write's message: every later call raises it
        self._table = np.zeros((8, 8), np.int32)  # block-table scratch (only a step's entries are read)
        self._noted = collections.OrderedDict()  # req_id -> blocks noted for publishing, of finished requests
        self._publish = config.tier is not None
        self._zeros = np.zeros(0, np.uint8)
        if keys:
            self._create(dict(keys), config.cuda_device)

    def register_policy(self, policy: ModelCachePolicy):
        self.policy = policy

    # -- the core --

    def _create(self, row_bytes, device):
        c = self.config
        names = sorted(row_bytes, key=lambda k: (k != HIDDEN_KEY, k))
        keys = [core.Key(k, row_bytes[k], optional=k != HIDDEN_KEY, deferred=k in self.policy.deferred_keys)
                for k in names]
        try:
            self._core = core.Cache(
                keys, c.num_blocks, c.block_size, staging_depth=c.staging_depth,
                staging_capacity_tokens=c.staging_capacity_tokens,
                staging_claim_timeout_s=c.staging_claim_timeout_s if c.staging_claim_timeout_s > 0 else -1,
                device_budget_bytes=c.gpu_staging_bytes, deferred_chunk_bytes=c.copy_chunk_bytes,
                prefetch=self.prefetch_reads, cuda_device=device, tier=c.tier, tier_model=c.tier_model,
                publish_barrier=c.publish_barrier, tier_import_timeout_s=c.tier_import_timeout_s)
        except (UnsupportedError, NoDeviceError) as e:
            raise Unmatch("the cache cannot stage through cuda:%d: %s (the outputs are CUDA tensors or "
                          "PrefixCacheConfig.cuda_device is set: load a CUDA build of the library, make python-cuda "
                          "and OMNICACHE_LIB)" % (device, e)) from e
        except OmnicacheError as e:
            raise Unmatch(str(e)) from e
        self._names = names
        self._index = {k: i for i, k in enumerate(names)}

    def _wrap(self, e):
        """The upstream exception for a core error (the core's is its
        __cause__); a failed write is remembered: every later call raises
        it."""
        if isinstance(e, StagingTimeoutError):
            with self._lock:
                ids = sorted(self._steps)
            w = OmniPrefixCacheStagingTimeoutError("%s; unconsumed step contexts (ids=%s) or a stuck write" % (e, ids))
            w.unconsumed = tuple(ids)
            return w
        if isinstance(e, WriteFailedError):
            if self._fatal is None:
                self._fatal = "prefix cache write failed; cached rows lost behind published hashes (%s)" % e
            return Unmatch(self._fatal)
        return Unmatch(str(e))

    def _check(self):
        if self._fatal is not None:
            raise Unmatch(self._fatal)

    def _abort_core(self, p):
        """Undoes the core's Begin of the pending step (its hit reads are
        dropped)."""
        try:
            self._core.abort()
        except OmnicacheError as e:
            raise self._wrap(e) from e
        finally:
            p.begun, p.into = False, None

    def _begin_core(self, p, plan):
        """The core's Begin of p; a step of 64 tokens or more, or with
        arrivals, gets its rows' buffers made now (Cache.begin_into): a hit
        is read into them during the forward, a prefill's rows are copied
        there by save, and materialize of the whole step returns them."""
        p.into = None
        rows = plan.result_rows() if self.result_buffers and (p.batch.ntok >= 64 or p.arrivals) else 0
        if rows > 1 and self._meta:
            p.into = [self._alloc(k, rows) for k in self._core.keys]
            self._core.begin_into(plan, p.into)
        else:
            self._core.begin(plan)
        p.begun = True

    # -- the engine loop --

    def new_step_starts(self, events_or_step, *, num_scheduled_tokens=None):
        """Once per real step, before the engine drops finished requests:
        registers arrivals and their hits, resumes (the preemption and the
        resume, positions from the event, its hit as a hit), continuations,
        and the finished/aborted requests whose pending writes must land.
        Events are checked before anything is registered. A step registered
        before and never saved is not overwritten: with no scheduled tokens
        its events carry over to this step; with some, it is dropped (see
        docs/python.md)."""
        self._check()
        events, sched = step_events(events_or_step, num_scheduled_tokens)
        p = self._pend
        gone = p.counts() if p is not None else {}
        ending, ops = plan_events(events, self._live, lambda r: r.pos + gone.get(r.rid, 0), self.config.block_size,
                                  self.config.num_blocks)
        if gone:
            self._drop(p)
        elif p is not None and p.begun:
            self._abort_core(p)  # begun empty by prepare: begun again with this step's events too
        p = self._pend
        if p is None:
            p = self._pend = Pending()
        p.sched, p.layout, p.batch, p.prepared = sched, None, None, False
        for rid in ending:
            r = self._live.pop(rid, None)
            if r is not None:
                if r.noted:
                    self._noted[rid] = list(r.noted)
                    while len(self._noted) > _KEEP_NOTED:
                        self._noted.popitem(last=False)
                p.finished.append(r.iid)
                p.arrivals.pop(rid, None)
                p.preempted.pop(rid, None)
                p.resumed.pop(rid, None)
        for op, ev, r, blocks in ops:
            rid, hit = ev.req_id, int(ev.hit_end)
            if op == "arrive":
                self._next += 1
                r = self._live[rid] = Req(rid, self._next, hit)
                p.arrivals[rid] = (r, hit, blocks, tuple(getattr(ev, "tier_hashes", ()) or ()))
            elif op == "resume":
                r.pos = hit
                p.preempted[rid] = p.resumed[rid] = r
                if hit:
                    p.arrivals[rid] = (r, hit, blocks, ())  # the core serves a resumed request's hit as an arrival's
                else:
                    p.arrivals.pop(rid, None)
            else:
                r.pos = hit  # a continuation arrives at its computed tokens
            hs = getattr(ev, "block_hashes", ()) or ()
            if len(hs) > len(r.hashes):
                r.hashes = tuple(int(x) for x in hs)

    def _drop(self, p):
        """The pending step computed rows that were never saved (its forward
        or its save failed, and the engine went on). With a core, the step
        is begun with its events and saved with every row rejected and
        discarded: its KV slots hold nothing an older tenant wrote (a later
        hit over them is refused, never served stale rows), its finished
        requests leave, its arrivals and resumes are registered. Without a
        core nothing was ever written: only its unscheduled events carry
        over. Either way its requests' positions move past its rows, as the
        engine's did. Raises, changing nothing, when the step's slots are
        unknown or the core refuses."""
        counts = p.counts()
        if self._core is None:
            keep = Pending()
            keep.finished = list(p.finished)
            for name in ("arrivals", "preempted", "resumed"):
                getattr(keep, name).update((k, v) for k, v in getattr(p, name).items() if k not in counts)
            self._advance(counts)
            self._pend = keep
            return
        if p.layout is None:
            raise Unmatch("new_step_starts: the step registered before scheduled %d tokens and was never saved, and "
                          "its write layout is unknown: save_outputs it, or give its layout to prepare_read_plans "
                          "or abort_prepared_step so that the cache can drop its slots" % sum(counts.values()))
        batch = build_batch(p.layout, self._live, self.config.block_size, self.config.num_blocks, self._table)
        self._table = batch.table
        if p.begun:
            self._abort_core(p)
        n = batch.ntok
        outs = self._zero_outputs(n)
        try:
            self._core.begin(make_plan(batch, p, sentinel_finish=True))
            p.begun = True
            sid = self._core.save(outs, tokens=n, padded=n, accepted=np.zeros(len(batch.reqs), np.int32))
        except OmnicacheError as e:
            p.begun = False
            raise self._wrap(e) from e
        except BaseException:
            if p.begun:
                self._abort_core(p)
            raise
        p.begun = False
        self._advance(counts)
        self._pend = None
        try:
            self._core.discard(sid)
        except OmnicacheError as e:
            raise self._wrap(e) from e

    def _advance(self, counts):
        for rid, n in counts.items():
            r = self._live.get(rid)
            if r is not None:
                r.pos += n

    def _zero_outputs(self, n):
        """Outputs of n rows for a step whose rows are all rejected or that
        has none: zeros for the required (hidden) key, optional keys
        omitted."""
        outs = []
        for i, k in enumerate(self._core.keys):
            if k.optional:
                outs.append(None)
                continue
            self._zeros, z = zero_rows(self._zeros, n, k.row_bytes, self._core._layouts.get(i))
            outs.append(z)
        return outs

    def _layout_batch(self, p, layout):
        """The checked batch of layout for the pending step p (also against
        its scheduled counts), recorded as the step's layout."""
        batch = build_batch(layout, self._live, self.config.block_size, self.config.num_blocks, self._table)
        self._table = batch.table
        if p.sched:
            total = 0
            for r, n in zip(batch.reqs, batch.counts.tolist()):
                want = p.sched.get(r.rid, 0)
                if want != n:
                    raise Unmatch("write layout gives req %s %d rows, num_scheduled_tokens %d" % (r.rid, n, want))
                total += n
            if total != sum(p.sched.values()):
                raise Unmatch("write layout covers %d of the %d scheduled tokens" % (total, sum(p.sched.values())))
        p.layout, p.batch = layout, batch
        return batch

    def prepare_read_plans(self, write_layout: PrefixCacheWriteLayout):
        """After new_step_starts, before the forward: checks the step's
        write layout and, once the core exists, begins the step in the core,
        whose hit reads then run while the forward runs (prefetch_reads).
        save_outputs must then get this layout."""
        self._check()
        p = self._pend
        if p is None:
            raise Unmatch("prepare_read_plans without new_step_starts")
        if p.prepared:
            raise Unmatch("prefix-cache write layout prepared more than once for one step")
        old = p.layout, p.batch
        batch = self._layout_batch(p, write_layout)
        if self._core is not None:
            try:
                self._begin_core(p, make_plan(batch, p, publish=self._publish, block_size=self.config.block_size))
            except OmnicacheError as e:
                p.layout, p.batch = old
                raise self._wrap(e) from e
        p.prepared = True

    def abort_prepared_step(self, write_layout=None):
        """The forward failed before save_outputs: drops the step's hit
        reads (the core's Begin is undone). The step stays registered: save
        it, or the next new_step_starts drops it. write_layout, when the
        step was not prepared, tells the cache the step's slots for that
        drop."""
        self._check()
        p = self._pend
        if p is None:
            return
        if write_layout is not None and not p.prepared:
            self._layout_batch(p, write_layout)
        p.prepared = False
        if p.begun:
            self._abort_core(p)

    def _step_tensors(self, hidden, mm, n, padded):
        """The step's rows per key (made contiguous; checked against each
        key's dtype and shape) and the devices they are on, before anything
        is begun."""
        out = {}
        if n > 0:
            if self.policy.needs_full_hidden_states:
                if hidden is None:
                    raise Unmatch("hidden_states is None, and the policy needs full hidden states "
                                  "(ModelCachePolicy(needs_full_hidden_states=False) saves none)")
                if not (core._torch_tensor(hidden) or isinstance(hidden, np.ndarray)):
                    raise TypeError("hidden_states: a %s; want a torch tensor or a numpy array" % type(hidden).__name__)
                rows = int(hidden.shape[0]) if hidden.ndim >= 2 else 0
                if rows < n:
                    raise Unmatch("hidden_states has %d rows, need %d" % (rows, n))
                out[HIDDEN_KEY] = hidden
            for k, v in (mm or {}).items():
                if k != HIDDEN_KEY and is_rows(v, n, padded):
                    out[k] = v
        devices = set()
        for k, v in list(out.items()):
            if core._torch_tensor(v):
                devices.add((v.device.type, v.device.index))
                if not v.is_contiguous():
                    v = out[k] = v.contiguous()  # on the device, in stream order
            else:
                devices.add(("cpu", None))
                if not v.flags.c_contiguous:
                    v = out[k] = np.ascontiguousarray(v)
            m = self._meta.get(k)
            if m is not None:
                m.check(v)
        return out, devices

    def _ensure_core(self, tensors, devices):
        """Creates the core from the first step's keys and device, or
        checks the step's devices and new keys against it."""
        if self._core is None:
            if not tensors:
                raise Unmatch("the first save_outputs carries no rows: the cache's keys come from its tensors "
                              "(or pass keys= to the manager)")
            dev = select_device(self.config.cuda_device, devices)
            metas = {k: KeyMeta(k, v) for k, v in tensors.items()}
            self._create({k: m.row_bytes for k, m in metas.items()}, dev)
            self._meta.update(metas)
            return
        have = self._core.cuda_device
        if have is None:
            cuda = sorted("cuda:%d" % (i or 0) for t, i in devices if t == "cuda")
            if cuda:
                raise Unmatch("outputs on %s, but the cache stages through the host (its first save's outputs were "
                              "host tensors): set PrefixCacheConfig.cuda_device to stage CUDA outputs" % cuda[0])
        select_device(have, devices)
        for k, v in tensors.items():
            if k in self._meta:
                continue
            i = self._index.get(k)
            if i is None:
                if k not in self._ignored:
                    self._ignored.add(k)
                    warnings.warn("omnicache.vllm_omni: key %r first appeared after the cache was created: not "
                                  "cached" % k)
                continue
            m = KeyMeta(k, v)
            if m.row_bytes != self._core.keys[i].row_bytes:
                raise Unmatch("key %s: rows of %d bytes, the cache's key has %d" % (k, m.row_bytes,
                                                                                  self._core.keys[i].row_bytes))
            self._meta[k] = m

    def _save(self, p, hidden_states, mm_outputs, num_tokens_unpadded, num_tokens_padded, write_layout):
        """save_outputs' checks, then the core's Begin (unless
        prepare_read_plans began the step) and Save: (step id, batch)."""
        if write_layout is None:
            raise ValueError("save_outputs requires an adapter-produced write_layout")
        n, padded = int(num_tokens_unpadded), int(num_tokens_padded)
        if n < 0 or padded < n:
            raise ValueError("num_tokens_unpadded %d, num_tokens_padded %d: want 0 <= unpadded <= padded"
                             % (n, padded))
        cap = self.config.staging_capacity_tokens
        if n > cap:
            raise Unmatch("step has %d tokens; staging capacity is %d" % (n, cap))
        if p.prepared:
            if write_layout is not p.layout and write_layout != p.layout:
                raise Unmatch("save write layout differs from the pre-forward layout")
            batch = p.batch
        else:
            batch = self._layout_batch(p, write_layout)
        if batch.ntok != n:
            raise Unmatch("slot mapping covers %d of %d scheduled tokens; CPU-side slot derivation out of sync with "
                          "the batch" % (batch.ntok, n))
        tensors, devices = self._step_tensors(hidden_states, mm_outputs, n, padded)
        self._ensure_core(tensors, devices)
        outs = self._zero_outputs(0) if n == 0 else [tensors.get(k) for k in self._names]
        if not p.begun:
            self._begin_core(p, make_plan(batch, p, publish=self._publish, block_size=self.config.block_size))
        return self._core.save(outs, tokens=n, padded=padded), batch

    def save_outputs(self, hidden_states, mm_outputs, *, num_tokens_unpadded, num_tokens_padded,
                     write_layout=None) -> int:
        """After the forward: saves the step's rows (hidden_states and the
        per-token tensors of mm_outputs, first dimension the step's tokens,
        padded or not; host or CUDA tensors, handed to the core as they are)
        at the write layout's slots and returns the step id, to be consumed
        exactly once (materialize or discard_step). Everything is checked
        before the core begins the step; a failure after that undoes the
        core's Begin, and the step stays registered for a retry."""
        self._check()
        p = self._pend
        if p is None:
            if write_layout is None:
                raise ValueError("save_outputs requires an adapter-produced write_layout")
            raise Unmatch("save_outputs without new_step_starts: call it once per real step, before the forward")
        try:
            sid, batch = self._save(p, hidden_states, mm_outputs, num_tokens_unpadded, num_tokens_padded,
                                    write_layout)
        except OmnicacheError as e:
            # the core's Begin or Save failed: nothing is begun (a failed Save undid its Begin)
            p.begun, p.into = False, None
            raise self._wrap(e) from e
        except BaseException:
            if p.begun:
                self._abort_core(p)  # begun by prepare_read_plans or above: undone
            raise
        p.begun = False
        for r, c in zip(batch.reqs, batch.counts.tolist()):
            r.pos += c
        self._pend = None
        with self._lock:
            self._steps[sid] = batch.ids_map()
            if p.into is not None:
                self._into[sid] = p.into
        return sid

    def _take(self, step_id):
        """The step's {req_id: core id} and its begin_into buffers (None),
        kept referenced by the caller until the core consumed the step."""
        with self._lock:
            ids = self._steps.pop(step_id, None)
            if ids is None:
                raise Unmatch("step context %s missing (have %s); already consumed or never saved"
                              % (step_id, sorted(self._steps)))
            return ids, self._into.pop(step_id, None)

    def materialize(self, step_id, req_ids) -> StageCacheOutputs:
        """Per save-time request of req_ids its rows ``[cached prefix | this
        step]``, per key (a resumed request: only the rows it was not
        delivered before); consumes the step."""
        self._check()
        ids, into = self._take(step_id)
        req_ids = list(req_ids)
        outside = [r for r in req_ids if r not in ids]
        if outside:
            try:
                self._core.discard(step_id)
            except OmnicacheError:
                pass  # the step is consumed either way; the caller's error is the one to raise
            raise Unmatch("materialize(step %s) got req ids outside the save snapshot: %s"
                          % (step_id, sorted(outside)[:8]))
        try:
            if into is not None and req_ids == list(ids):  # the whole step, in batch order: into its buffers
                res = self._core.materialize(step_id, alloc=into_alloc(self._core.keys, into, self._alloc))
            else:
                res = self._core.materialize(step_id, np.fromiter((ids[r] for r in req_ids), np.int64, len(req_ids)),
                                             alloc=self._alloc)
        except _UNREADABLE as e:
            back = {v: k for k, v in ids.items()}
            failed = [back.get(i, i) for i in getattr(e, "failed", ())]
            res = getattr(e, "result", None)
            if res is not None and any(isinstance(res.error(i), TierMissError) for i in range(len(res))):
                w = OmniPrefixCacheTierMissError("rows of tier blocks not imported for req %s (%s): recompute them"
                                                 % (", ".join(map(str, failed)), e))
                w.failed = tuple(failed)
                w.outputs = stage_outputs(res, req_ids, self._names, set(failed))
                raise w from e
            key = HIDDEN_KEY if HIDDEN_KEY in self._index else self._names[0]
            raise Unmatch("hit span for req %s key=%s is not readable (%s)" % (failed[0] if failed else "?", key, e)) from e
        except OmnicacheError as e:
            raise self._wrap(e) from e
        return stage_outputs(res, req_ids, self._names)

    def wait_published(self, req_or_hashes, timeout_s):
        """Not upstream's (a P/D prefill side, PrefixCacheConfig.tier and
        publish_barrier): waits until the full blocks a request computed
        (req_or_hashes a req id, live or among the latest 4,096 finished;
        the blocks its events' block_hashes named) or the blocks of the
        given hashes are stored in the tier, before the engine reports the
        request's KV transferred. Raises the core's NotPublishedError (a
        block was not stored: the decode side must recompute) or
        WaitTimeoutError (blocks still being stored after timeout_s); an
        unknown request, or no cache yet, is OmniPrefixCacheUnmatchError."""
        self._check()
        if isinstance(req_or_hashes, str):
            r = self._live.get(req_or_hashes)
            hashes = list(r.noted) if r is not None else self._noted.get(req_or_hashes)
            if hashes is None:
                raise Unmatch("wait_published: req %s noted no block for publishing (no block_hashes in its events, "
                              "or it finished long ago)" % req_or_hashes)
        else:
            hashes = req_or_hashes
        if self._core is None:
            raise Unmatch("wait_published before the cache exists (its first save_outputs)")
        self._core.wait_published(np.asarray(hashes, np.uint64), timeout_s)

    def _alloc(self, key, rows):
        """A materialized key's buffer (alloc_rows)."""
        return alloc_rows(self._meta.get(key.name), key, rows)

    def discard_step(self, step_id):
        """Consumes a step id without reading it."""
        self._check()
        ids, into = self._take(step_id)  # into: kept until the core consumed the step
        try:
            self._core.discard(step_id)
        except OmnicacheError as e:
            raise self._wrap(e) from e

    def memory_stats(self):
        """Bytes the cache holds now: ``host_mirror_bytes`` (host memory
        backing the rows kept), ``host_staging_bytes`` (staging pages held by
        steps not consumed yet), ``host_read_ahead_bytes`` (hit rows read
        ahead for steps not consumed yet), ``device_bytes`` (device copies:
        step and deferred clones, parked decode rows; on the host device
        they are host memory) and ``device_budget_bytes`` (their bound).
        Zeros before the core exists."""
        out = dict.fromkeys(("host_mirror_bytes", "host_staging_bytes", "host_read_ahead_bytes", "device_bytes",
                             "device_budget_bytes"), 0)
        if self._core is None:
            return out
        try:
            st = self._core.stats()
        except OmnicacheError as e:
            raise self._wrap(e) from e
        page = self.config.staging_capacity_tokens * sum(k.row_bytes for k in self._core.keys if not k.deferred)
        out.update(host_mirror_bytes=st["MirrorResidentBytes"], host_staging_bytes=st["PagesInUse"] * page,
                   host_read_ahead_bytes=st["ReadAheadBytes"], device_bytes=st["BudgetCharged"],
                   device_budget_bytes=st["BudgetLimit"])
        return out

    def stats(self):
        """The core's counters (empty before the core exists)."""
        return self._core.stats() if self._core is not None else {}

    def shutdown(self):
        if self._core is not None:
            try:
                self._core.close()
            except OmnicacheError as e:
                raise self._wrap(e) from e
            self._into.clear()  # closed: the core holds no buffer of a step


__all__ = ["HIDDEN_KEY", "OmniPrefixCacheUnmatchError", "OmniPrefixCacheStagingTimeoutError",
           "OmniPrefixCacheTierMissError", "PrefixCacheConfig",
           "ModelCachePolicy", "StageCacheOutputs", "PrefixCacheEventKind", "PrefixCacheRequestEvent",
           "PrefixCacheStep", "PrefixCacheWrite", "PrefixCacheWriteLayout", "PrefixCacheSchedulerAdapter",
           "OmniPrefixCacheManager"]
