"""The upstream vLLM-Omni manager's interface and adapter types, and its
scheduler adapter (omnicache.vllm_omni re-exports them): configuration,
policy, errors, events, write layouts, and the translation of a vLLM
scheduler output and input batch into events and layouts, duck-typed."""

import dataclasses
import enum
from typing import Any, Dict, FrozenSet, NamedTuple, Optional, Tuple

import numpy as np

HIDDEN_KEY = "__hidden_states__"


class OmniPrefixCacheUnmatchError(RuntimeError):
    """A contract, config or occupancy error: a hit over absent rows, a step
    id consumed twice or never saved, a step larger than a staging page, a
    failed write (sticky: every later call raises it). The core's exception,
    when there is one, is the __cause__."""


class OmniPrefixCacheStagingTimeoutError(OmniPrefixCacheUnmatchError):
    """A save found no free staging page in time (``unconsumed``: the step
    ids holding the pages)."""

    unconsumed = ()


class OmniPrefixCacheTierMissError(OmniPrefixCacheUnmatchError):
    """Not upstream's (a P/D decode side): materialize could not import the
    rows of tier blocks (evicted, flushed, the store unreachable) for the
    requests ``failed``: recompute them. ``outputs`` holds the other
    requests' rows (a StageCacheOutputs), served exact. The core's
    TierMissError is the __cause__."""

    failed = ()
    outputs = None


# ---- interface ----


@dataclasses.dataclass(frozen=True)
class PrefixCacheConfig:
    """Upstream's fields and defaults, and four of the adapter's own:
    ``cuda_device``, the CUDA device ordinal the cache stages through (None:
    the device of the first save_outputs' tensors, the host when they are
    host tensors); the shared tier of a disaggregated (P/D) deployment:
    ``tier`` (a spec: "embedded://NAME" for instances of one process,
    "redis://HOST:PORT", "redis-cluster://H1:P1,..."; None: no tier) and
    ``tier_model`` (its namespace's model name, the same on both sides),
    ``publish_barrier`` (the prefill side: wait_published can wait for a
    request's blocks) and ``tier_import_timeout_s`` (the decode side's bound
    of one import; 0: 2 s)."""

    num_blocks: int
    block_size: int
    gpu_staging_bytes: int = 512 << 20
    staging_depth: int = 4
    staging_capacity_tokens: int = 1024
    staging_claim_timeout_s: float = 30.0
    copy_chunk_bytes: int = 16 << 20
    cuda_device: Optional[int] = None
    tier: Optional[str] = None
    tier_model: str = ""
    publish_barrier: bool = False
    tier_import_timeout_s: float = 0.0

    @classmethod
    def from_vllm_config(cls, *, num_blocks, block_size, scheduler_config=None, model_config=None, **kw):
        """capacity = the scheduler's max_num_batched_tokens, else
        max_model_len (from either config), else 1024; at least 1."""
        cap = getattr(scheduler_config, "max_num_batched_tokens", None)
        if not cap:
            cap = getattr(scheduler_config, "max_model_len", None) or getattr(model_config, "max_model_len", None)
        return cls(num_blocks=num_blocks, block_size=block_size, staging_capacity_tokens=max(1, int(cap or 1024)),
                   **kw)


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


# ---- adapter types ----


class PrefixCacheEventKind(str, enum.Enum):
    STARTED = "started"
    EXTENDED = "extended"
    RESUMED = "resumed"
    FINISHED = "finished"
    ABORTED = "aborted"
    REPLACED = "replaced"


TERMINAL = (PrefixCacheEventKind.FINISHED, PrefixCacheEventKind.ABORTED)


@dataclasses.dataclass(frozen=True)
class PrefixCacheRequestEvent:
    """Upstream's event, extended for a shared tier (fields upstream's
    event does not have; both empty by default): ``block_hashes``, the
    chained hashes of the request's full blocks known so far (vLLM's
    Request.block_hashes: a prompt's at STARTED), whose rows the cache
    publishes to the tier once a step computed them (a P/D prefill side);
    ``tier_hashes``, on a STARTED event with a hit, the hashes of the hit's
    last len(tier_hashes) blocks, whose KV came from outside (a P/D decode
    side: the transferred prompt) and whose rows the cache imports from the
    tier."""

    req_id: str
    kind: PrefixCacheEventKind
    hit_start: int = 0
    hit_end: int = 0
    block_ids: Tuple[Tuple[int, ...], ...] = ()
    scheduled_tokens: int = 0
    block_hashes: Tuple[int, ...] = ()
    tier_hashes: Tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class PrefixCacheStep:
    events: Tuple[PrefixCacheRequestEvent, ...]
    scheduled_tokens: Tuple[Tuple[str, int], ...] = ()

    def __iter__(self):
        return iter(self.events)


@dataclasses.dataclass(frozen=True)
class PrefixCacheWrite:
    """One request's rows [row_start, row_end) of the step's outputs;
    ``slots``, one KV slot per row, may be left empty when the layout's
    ``slots_cpu`` holds them."""

    req_id: str
    row_start: int
    row_end: int
    slots: Tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True, eq=False)
class PrefixCacheWriteLayout:
    """The step's writes in batch order and its row count; ``slots_cpu``:
    every row's KV slot as one CPU integer tensor or numpy array (None: the
    writes' ``slots``, concatenated). Equal layouts have equal writes, row
    counts and slots."""

    writes: Tuple[PrefixCacheWrite, ...]
    total_rows: int
    slots_cpu: Any = None

    def __eq__(self, other):
        if self is other:
            return True
        if not isinstance(other, PrefixCacheWriteLayout):
            return NotImplemented
        if self.writes != other.writes or self.total_rows != other.total_rows:
            return False
        a, b = layout_slots(self), layout_slots(other)
        return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))

    __hash__ = object.__hash__


def layout_slots(layout):
    """The layout's slots as an int64 numpy array (a view of a CPU tensor's
    memory where it can be), or None when it carries none."""
    s = layout.slots_cpu
    if s is None:
        if not any(w.slots for w in layout.writes):
            return None
        return np.fromiter((x for w in layout.writes for x in w.slots), np.int64)
    if not isinstance(s, np.ndarray):
        if getattr(getattr(s, "device", None), "type", "cpu") != "cpu":
            raise TypeError("write_layout.slots_cpu: a %s tensor; the slots are host memory" % s.device.type)
        s = s.numpy() if hasattr(s, "numpy") else np.asarray(s)
    if s.dtype != np.int64:
        if s.dtype.kind not in "iu":
            raise TypeError("write_layout.slots_cpu: dtype %s, want an integer array" % s.dtype)
        s = s.astype(np.int64)
    return s.reshape(-1)


# ---- the scheduler adapter ----


def _req_id(data):
    v = getattr(data, "req_id", None)
    if v is None:
        v = getattr(data, "request_id", None)
    if v is None:
        raise AttributeError("scheduled request data has no req_id/request_id")
    return str(v)


def _block_groups(blocks):
    """vLLM's block_ids (a flat list, or one list per KV group) as a tuple of
    tuples."""
    if blocks is None:
        return ()
    if not isinstance(blocks, (list, tuple)):
        raise TypeError("block_ids must be a sequence, got %s" % type(blocks).__name__)
    if blocks and not isinstance(blocks[0], (list, tuple)):
        return (tuple(int(b) for b in blocks),)
    return tuple(tuple(int(b) for b in g) for g in blocks)


def _counts(num_scheduled_tokens):
    """{req_id: count} with every count an int >= 0 (ValueError otherwise)."""
    out = {}
    for rid, n in dict(num_scheduled_tokens or {}).items():
        n = int(n)
        if n < 0:
            raise ValueError("num_scheduled_tokens[%r] is %d: a count is >= 0" % (rid, n))
        out[str(rid)] = n
    return out


class PrefixCacheSchedulerAdapter:
    """Turns a vLLM scheduler output into events (``translate_step``) and
    the batch the input batch laid out into a write layout
    (``build_write_layout``). Duck-typed: a scheduler output has
    ``scheduled_new_reqs`` (``req_id``, ``num_computed_tokens``,
    ``block_ids``), ``scheduled_cached_reqs`` (``req_ids``,
    ``num_computed_tokens``, ``new_block_ids``, and ``resumed_req_ids`` or
    ``resumed_from_preemption``), ``num_scheduled_tokens``,
    ``finished_req_ids`` and optionally ``aborted_req_ids``."""

    def __init__(self):
        self._observed = set()

    def translate_scheduler_output(self, scheduler_output) -> Tuple[PrefixCacheRequestEvent, ...]:
        """Events: new requests first (STARTED, or EXTENDED for a request
        seen before and not finished this step; hit_end = its computed
        tokens, its block ids), then resumed requests in the cached
        requests' order (RESUMED, hit_end = the computed tokens it resumes
        from, block_ids its new block table), then finished and aborted
        requests in sorted order."""
        so = scheduler_output
        sched = _counts(getattr(so, "num_scheduled_tokens", None))
        aborted = {str(r) for r in (getattr(so, "aborted_req_ids", None) or ())}
        terminal = {str(r) for r in (getattr(so, "finished_req_ids", None) or ())} | aborted
        cached = getattr(so, "scheduled_cached_reqs", None)
        cached_ids = [str(r) for r in (getattr(cached, "req_ids", None) or ())]
        computed = self._field(cached, "num_computed_tokens", cached_ids)
        new_blocks = self._field(cached, "new_block_ids", cached_ids)
        resumed_set = getattr(cached, "resumed_req_ids", None)
        if resumed_set is not None:
            resumed_set = {str(r) for r in resumed_set}
            missing = resumed_set - set(cached_ids)
            if missing:
                raise ValueError("scheduled_cached_reqs.resumed_req_ids missing from req_ids: %s" % sorted(missing))
            resumed = [i for i, r in enumerate(cached_ids) if r in resumed_set]
        else:
            flags = self._field(cached, "resumed_from_preemption", cached_ids)
            resumed = [i for i, f in enumerate(flags) if f]
        for rid in terminal:  # an id may be reused in the same step
            self._observed.discard(rid)
        events = []
        for data in getattr(so, "scheduled_new_reqs", None) or ():
            rid = _req_id(data)
            kind = PrefixCacheEventKind.EXTENDED if rid in self._observed else PrefixCacheEventKind.STARTED
            self._observed.add(rid)
            events.append(PrefixCacheRequestEvent(
                rid, kind, 0, int(getattr(data, "num_computed_tokens", 0) or 0),
                _block_groups(getattr(data, "block_ids", None)), sched.get(rid, 0)))
        for i in resumed:
            rid = cached_ids[i]
            self._observed.add(rid)
            events.append(PrefixCacheRequestEvent(
                rid, PrefixCacheEventKind.RESUMED, 0, int(computed[i]) if computed else 0,
                _block_groups(new_blocks[i]) if new_blocks else (), sched.get(rid, 0)))
        for rid in sorted(terminal):
            kind = PrefixCacheEventKind.ABORTED if rid in aborted else PrefixCacheEventKind.FINISHED
            events.append(PrefixCacheRequestEvent(rid, kind))
        return tuple(events)

    @staticmethod
    def _field(cached, name, req_ids):
        """A per-cached-request field: empty, or one entry per request."""
        v = tuple(getattr(cached, name, None) or ())
        if v and len(v) != len(req_ids):
            raise ValueError("scheduled_cached_reqs.%s has %d entries for %d req_ids" % (name, len(v), len(req_ids)))
        return v

    def translate_step(self, scheduler_output) -> PrefixCacheStep:
        events = self.translate_scheduler_output(scheduler_output)
        sched = _counts(getattr(scheduler_output, "num_scheduled_tokens", None))
        return PrefixCacheStep(events, tuple(sched.items()))

    def build_write_layout(self, group_view, *, num_scheduled_tokens) -> PrefixCacheWriteLayout:
        """The step's writes in the group view's request order
        (``batch_req_ids()``; without it, num_scheduled_tokens' order), each
        request's rows one after another, and every row's KV slot from
        ``group_view.step_slots_cpu(req_ids, num_scheduled_tokens)`` as the
        layout's ``slots_cpu`` (the writes' own ``slots`` stay empty)."""
        sched = _counts(num_scheduled_tokens)
        order = group_view.batch_req_ids() if hasattr(group_view, "batch_req_ids") else list(sched)
        order = [str(r) for r in order]
        slots = group_view.step_slots_cpu(order, sched)
        writes, row = [], 0
        for rid in order:
            n = sched.get(rid, 0)
            writes.append(PrefixCacheWrite(rid, row, row + n))
            row += n
        got = int(slots.numel()) if hasattr(slots, "numel") else int(np.size(slots))
        if got != row:
            raise ValueError("write layout slot count %d does not match scheduled row count %d" % (got, row))
        return PrefixCacheWriteLayout(tuple(writes), row, slots)
