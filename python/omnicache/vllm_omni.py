"""An adapter with the shape of vLLM-Omni's output prefix cache manager
(``vllm_omni/core/prefix_cache``: interface, adapter, manager), over the
omnicache core. Names, fields, defaults and call shapes follow the upstream
manager, so the adapter can sit where it sits; docs/python.md lists what
maps and what does not.

The engine side, once per real step::

    m.new_step_starts(step_or_events, num_scheduled_tokens=...)
    ... forward ...
    sid = m.save_outputs(hidden_states, mm_outputs, num_tokens_unpadded=n,
                         num_tokens_padded=p, write_layout=layout)
    out = m.materialize(sid, req_ids)   # or m.discard_step(sid)

String request ids map to the core's integer ids (a request keeps its id
while it lives). The core is created at the first save_outputs, from the
keys and row sizes that step carries (or at once with ``keys=``).
"""

import dataclasses
import enum
import threading
import warnings
from typing import Any, Dict, FrozenSet, NamedTuple, Optional, Tuple

import numpy as np

from . import core
from .errors import OmnicacheError, StagingTimeoutError

HIDDEN_KEY = "__hidden_states__"


class OmniPrefixCacheUnmatchError(RuntimeError):
    """A contract, config or occupancy error: a hit over absent rows, a step
    id consumed twice or never saved, a step larger than a staging page, a
    failed write (sticky: every later call raises it). The core's exception
    is the __cause__."""


class OmniPrefixCacheStagingTimeoutError(OmniPrefixCacheUnmatchError):
    """A save found no free staging page in time (``unconsumed``: the step
    ids holding the pages)."""

    unconsumed = ()


# ---- interface ----


@dataclasses.dataclass(frozen=True)
class PrefixCacheConfig:
    num_blocks: int
    block_size: int
    gpu_staging_bytes: int = 512 << 20
    staging_depth: int = 4
    staging_capacity_tokens: int = 1024
    staging_claim_timeout_s: float = 30.0
    copy_chunk_bytes: int = 16 << 20

    @classmethod
    def from_vllm_config(cls, *, num_blocks, block_size, scheduler_config=None, model_config=None):
        """capacity = the scheduler's max_num_batched_tokens, else
        max_model_len (from either config), else 1024; at least 1."""
        cap = getattr(scheduler_config, "max_num_batched_tokens", None)
        if not cap:
            cap = getattr(scheduler_config, "max_model_len", None) or getattr(model_config, "max_model_len", None)
        return cls(num_blocks=num_blocks, block_size=block_size, staging_capacity_tokens=max(1, int(cap or 1024)))


@dataclasses.dataclass(frozen=True)
class ModelCachePolicy:
    needs_full_hidden_states: bool = True
    deferred_keys: FrozenSet[str] = frozenset()
    mm_outputs_written_in_sample: bool = False

    def __post_init__(self):
        if self.needs_full_hidden_states and self.mm_outputs_written_in_sample:
            raise ValueError("ModelCachePolicy: mm_outputs_written_in_sample with needs_full_hidden_states")

    @property
    def hidden_key(self):
        return HIDDEN_KEY if self.needs_full_hidden_states else None

    @classmethod
    def from_model(cls, model):
        """Reads the legacy model attributes (have_multimodal_outputs-style
        flags are not needed by this adapter)."""
        return cls(
            needs_full_hidden_states=bool(getattr(model, "needs_full_hidden_states", True)),
            deferred_keys=frozenset(getattr(model, "prefix_cache_deferred_keys", ()) or ()),
            mm_outputs_written_in_sample=bool(getattr(model, "mm_outputs_written_in_sample", False)),
        )


class StageCacheOutputs(NamedTuple):
    hidden_states: Optional[Dict[str, Any]]
    mm_outputs: Dict[str, Dict[str, Any]]


# ---- adapter ----


class PrefixCacheEventKind(str, enum.Enum):
    STARTED = "started"
    EXTENDED = "extended"
    RESUMED = "resumed"
    FINISHED = "finished"
    ABORTED = "aborted"
    REPLACED = "replaced"


@dataclasses.dataclass(frozen=True)
class PrefixCacheRequestEvent:
    req_id: str
    kind: PrefixCacheEventKind
    hit_start: int = 0
    hit_end: int = 0
    block_ids: Tuple[Tuple[int, ...], ...] = ()
    scheduled_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class PrefixCacheStep:
    events: Tuple[PrefixCacheRequestEvent, ...]
    scheduled_tokens: Tuple[Tuple[str, int], ...] = ()

    def __iter__(self):
        return iter(self.events)


@dataclasses.dataclass(frozen=True)
class PrefixCacheWrite:
    req_id: str
    row_start: int
    row_end: int
    slots: Tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class PrefixCacheWriteLayout:
    writes: Tuple[PrefixCacheWrite, ...]
    total_rows: int


# ---- manager ----


class _Req:
    __slots__ = ("iid", "pos", "blocks")

    def __init__(self, iid, pos, blocks):
        self.iid, self.pos, self.blocks = iid, pos, blocks


def _kind(k):
    return PrefixCacheEventKind(getattr(k, "value", k))


class _KeyMeta:
    """How a key's rows were shaped at its first save (to rebuild them)."""

    __slots__ = ("name", "row_bytes", "dtype", "trailing", "torch")

    def __init__(self, name, t):
        self.name = name
        self.torch = core._torch_tensor(t)
        self.dtype = t.dtype
        self.trailing = tuple(t.shape[1:])
        n = int(np.prod(self.trailing)) if self.trailing else 1
        self.row_bytes = n * (t.element_size() if self.torch else t.dtype.itemsize)

    def build(self, rows):
        """rows: a uint8 [tokens, row_bytes] numpy view."""
        if self.torch:
            import torch

            return torch.from_numpy(rows).view(self.dtype).reshape((-1,) + self.trailing)
        return rows.view(self.dtype).reshape((-1,) + self.trailing)


class OmniPrefixCacheManager:
    """The upstream manager's surface over the omnicache core.

    ``eager`` is accepted for the upstream signature: this build copies
    host tensors synchronously (CUDA tensors are moved to the host before
    the save). ``keys`` ({name: row_bytes}, the hidden key as HIDDEN_KEY)
    creates the core at once instead of at the first save_outputs.
    """

    def __init__(self, config: PrefixCacheConfig, *, eager=None, keys=None):
        self.config = config
        self.eager = True if eager is None else bool(eager)
        self.policy = ModelCachePolicy()
        self._core = None
        self._meta = {}  # key name -> _KeyMeta (how to rebuild its rows)
        self._ignored = set()
        self._live: Dict[str, _Req] = {}
        self._next = 0
        self._pending = None
        self._steps: Dict[int, Dict[str, int]] = {}
        self._lock = threading.Lock()  # _steps: materialize may run on another thread
        if keys:
            self._create({k: v for k, v in keys.items()})

    def register_policy(self, policy: ModelCachePolicy):
        self.policy = policy

    # -- the core --

    def _create(self, row_bytes):
        c = self.config
        names = sorted(row_bytes, key=lambda k: (k != HIDDEN_KEY, k))
        keys = [core.Key(k, row_bytes[k], optional=k != HIDDEN_KEY, deferred=k in self.policy.deferred_keys)
                for k in names]
        try:
            self._core = core.Cache(
                keys, c.num_blocks, c.block_size, staging_depth=c.staging_depth,
                staging_capacity_tokens=c.staging_capacity_tokens,
                staging_claim_timeout_s=c.staging_claim_timeout_s if c.staging_claim_timeout_s > 0 else -1,
                device_budget_bytes=c.gpu_staging_bytes, deferred_chunk_bytes=c.copy_chunk_bytes)
        except OmnicacheError as e:
            raise OmniPrefixCacheUnmatchError(str(e)) from e
        self._names = names
        self._index = {k: i for i, k in enumerate(names)}

    @staticmethod
    def _wrap(e):
        if isinstance(e, StagingTimeoutError):
            w = OmniPrefixCacheStagingTimeoutError(str(e))
            w.unconsumed = tuple(e.unconsumed)
            return w
        return OmniPrefixCacheUnmatchError(str(e))

    # -- the engine loop --

    def new_step_starts(self, events_or_step, *, num_scheduled_tokens=None):
        """Once per real step, before the engine drops finished requests:
        registers arrivals and their hits, and the finished/aborted requests
        whose pending writes must land. The core's Begin runs at
        save_outputs, with the batch order the write layout gives."""
        if num_scheduled_tokens is None:
            num_scheduled_tokens = dict(getattr(events_or_step, "scheduled_tokens", ()) or ())
        bs = self.config.block_size
        arrivals, hits, hit_blocks, finished, resumed = [], [], [], [], []
        for ev in events_or_step:
            kind, rid = _kind(ev.kind), ev.req_id
            blocks = list(ev.block_ids[0]) if ev.block_ids else None
            r = self._live.get(rid)
            if kind in (PrefixCacheEventKind.FINISHED, PrefixCacheEventKind.ABORTED):
                if r is not None:
                    finished.append(r.iid)
                    del self._live[rid]
                continue
            if kind == PrefixCacheEventKind.REPLACED:
                continue  # reserved upstream
            if kind == PrefixCacheEventKind.RESUMED and r is not None:
                resumed.append(r.iid)
                if blocks is not None:
                    r.blocks = blocks
                if ev.hit_end:
                    r.pos = ev.hit_end
                continue
            if r is None:  # STARTED (or a first sight of any other kind)
                hit = int(ev.hit_end)
                self._next += 1
                r = self._live[rid] = _Req(self._next, hit, blocks or [])
                arrivals.append(r.iid)
                hits.append(hit)
                hit_blocks.extend((blocks or [])[: hit // bs] if hit > 0 else [])  # too few: the core's HitBlocks
            else:  # EXTENDED: a live request arriving again, a continuation (not a hit)
                arrivals.append(r.iid)
                hits.append(0)
                r.pos = int(ev.hit_end) if ev.hit_end else r.pos
                if blocks is not None:
                    r.blocks = blocks
        self._pending = (dict(num_scheduled_tokens or {}), arrivals, hits, hit_blocks, finished, resumed)

    def _batch(self, sched, write_layout, ntok):
        """The batch in row order: requests, starts, counts, and the block
        table (grown from each write's slots)."""
        bs = self.config.block_size
        order = []
        if write_layout is not None:
            row = 0
            for w in write_layout.writes:
                if w.row_start != row:
                    raise OmniPrefixCacheUnmatchError(
                        "write layout: request %r starts at row %d, expected %d (rows must follow each other)"
                        % (w.req_id, w.row_start, row))
                order.append((w.req_id, w.row_end - w.row_start, w.slots))
                row = w.row_end
        else:
            order = [(rid, int(n), None) for rid, n in sched.items() if int(n) > 0]
        reqs = []
        for rid, n, sl in order:
            r = self._live.get(rid)
            if r is None:
                raise OmniPrefixCacheUnmatchError("request %r scheduled but never started" % rid)
            if sl is not None and len(sl):
                sl = np.asarray(sl, np.int64)
                if len(sl) != n:
                    raise OmniPrefixCacheUnmatchError("request %r: %d slots for %d rows" % (rid, len(sl), n))
                idx = (r.pos + np.arange(n)) // bs
                need = int(idx[-1]) + 1
                if len(r.blocks) < need:
                    r.blocks = list(r.blocks) + [0] * (need - len(r.blocks))
                for i, b in zip(idx.tolist(), (sl // bs).tolist()):
                    r.blocks[i] = b
            elif n and len(r.blocks) * bs < r.pos + n:
                raise OmniPrefixCacheUnmatchError(
                    "request %r: %d block ids cover %d tokens, the step needs %d (pass write_layout)"
                    % (rid, len(r.blocks), len(r.blocks) * bs, r.pos + n))
            reqs.append((rid, r, n))
        stride = max([len(r.blocks) for _, r, _ in reqs] + [1])
        table = np.zeros((max(1, len(reqs)), stride), np.int32)
        for i, (_, r, _) in enumerate(reqs):
            table[i, : len(r.blocks)] = r.blocks
        return reqs, table

    def save_outputs(self, hidden_states, mm_outputs, *, num_tokens_unpadded, num_tokens_padded,
                     write_layout=None) -> int:
        """After the forward: saves the step's rows (hidden_states and the
        per-token tensors of mm_outputs, first dimension the step's tokens,
        padded or not) and returns the step id, to be consumed exactly once
        (materialize or discard_step)."""
        if self._pending is None:
            raise OmniPrefixCacheUnmatchError("save_outputs without new_step_starts")
        sched, arrivals, hits, hit_blocks, finished, resumed = self._pending
        tensors = {}
        if hidden_states is not None and self.policy.needs_full_hidden_states:
            tensors[HIDDEN_KEY] = hidden_states
        for k, v in (mm_outputs or {}).items():
            if core._torch_tensor(v) or isinstance(v, np.ndarray):
                tensors[k] = v
        for k, v in list(tensors.items()):
            if core._torch_tensor(v):
                if v.device.type != "cpu":
                    v = v.to("cpu")
                tensors[k] = v.contiguous()
            else:
                tensors[k] = np.ascontiguousarray(v)
        for k, v in tensors.items():
            if k not in self._meta and (self._core is None or k in self._index):
                self._meta[k] = _KeyMeta(k, v)
        if self._core is None:
            self._create({k: m.row_bytes for k, m in self._meta.items()})
        outs = []
        for k in self._names:
            outs.append(tensors.pop(k, None))
        for k in tensors:
            if k not in self._ignored:
                self._ignored.add(k)
                warnings.warn("omnicache.vllm_omni: key %r first appeared after the cache was created: not cached" % k)
        reqs, table = self._batch(sched, write_layout, num_tokens_unpadded)
        n = len(reqs)
        plan = core.Plan(
            ids=np.fromiter((r.iid for _, r, _ in reqs), np.int64, n),
            rows=np.arange(n, dtype=np.int32),
            start=np.fromiter((r.pos for _, r, _ in reqs), np.int32, n),
            count=np.fromiter((c for _, _, c in reqs), np.int32, n),
            table=table, arrivals=np.array(arrivals, np.int64), hit_tokens=np.array(hits, np.int32),
            hit_blocks=np.array(hit_blocks, np.int32), finished=np.array(finished, np.int64),
            resumed=np.array(resumed, np.int64))
        try:
            self._core.begin(plan)
            sid = self._core.save(outs, tokens=int(num_tokens_unpadded), padded=int(num_tokens_padded))
        except OmnicacheError as e:
            raise self._wrap(e) from e
        self._pending = None
        for _, r, c in reqs:
            r.pos += c
        with self._lock:
            self._steps[sid] = {rid: r.iid for rid, r, _ in reqs}
        return sid

    def materialize(self, step_id, req_ids) -> StageCacheOutputs:
        """Per save-time request of req_ids its full-prompt rows
        ``[cached prefix | this step]``, per key; consumes the step."""
        with self._lock:
            ids = self._steps.pop(step_id, None)
        if ids is None:
            raise OmniPrefixCacheUnmatchError("step id %r was never saved or was already consumed" % (step_id,))
        try:
            iids = [ids[r] for r in req_ids]
        except KeyError as e:
            self._core.discard(step_id)
            raise OmniPrefixCacheUnmatchError("request %r was not saved in step %r" % (e.args[0], step_id)) from None
        try:
            res = self._core.materialize(step_id, np.array(iids, np.int64))
        except OmnicacheError as e:
            raise self._wrap(e) from e
        hidden, mm = None, {}
        for k in self._names:
            meta = self._meta.get(k)  # None: never saved, rows as bytes
            per = {rid: meta.build(res.rows(i, k)) if meta else res.rows(i, k) for i, rid in enumerate(req_ids)}
            if k == HIDDEN_KEY:
                hidden = per
            else:
                mm[k] = per
        return StageCacheOutputs(hidden_states=hidden, mm_outputs=mm)

    def discard_step(self, step_id):
        """Consumes a step id without reading it."""
        with self._lock:
            ids = self._steps.pop(step_id, None)
        if ids is None:
            raise OmniPrefixCacheUnmatchError("step id %r was never saved or was already consumed" % (step_id,))
        try:
            self._core.discard(step_id)
        except OmnicacheError as e:
            raise self._wrap(e) from e

    def stats(self):
        """The core's counters (empty before the core exists)."""
        return self._core.stats() if self._core is not None else {}

    def shutdown(self):
        if self._core is not None:
            try:
                self._core.close()
            except OmnicacheError as e:
                raise self._wrap(e) from e


__all__ = ["HIDDEN_KEY", "OmniPrefixCacheUnmatchError", "OmniPrefixCacheStagingTimeoutError", "PrefixCacheConfig",
           "ModelCachePolicy", "StageCacheOutputs", "PrefixCacheEventKind", "PrefixCacheRequestEvent",
           "PrefixCacheStep", "PrefixCacheWrite", "PrefixCacheWriteLayout", "OmniPrefixCacheManager"]
