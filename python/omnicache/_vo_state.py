"""The state omnicache.vllm_omni's manager keeps between its calls: live
requests and their positions, the step whose events were registered and
not saved yet, the batch a write layout lays out (checked against those
positions), key shapes, and the choice of device. Validation raises
before anything changes; the manager applies."""

import numpy as np

from . import core
from ._vo_interface import (HIDDEN_KEY, TERMINAL, OmniPrefixCacheUnmatchError, PrefixCacheEventKind, PrefixCacheStep,
                            StageCacheOutputs, _counts, layout_slots)

Unmatch = OmniPrefixCacheUnmatchError
K = PrefixCacheEventKind


class Req:
    """A live request: its core id and the position its next scheduled
    token has (the engine's num_computed_tokens); with a tier its full
    blocks' hashes (events' block_hashes) and those noted for publishing
    (the blocks a step computed)."""

    __slots__ = ("rid", "iid", "pos", "hashes", "noted")

    def __init__(self, rid, iid, pos):
        self.rid, self.iid, self.pos = rid, iid, pos
        self.hashes, self.noted = (), {}  # noted: an ordered set


class Pending:
    """The step new_step_starts registered and save_outputs has not saved
    yet: its scheduled counts, and the events the core has not been told
    (arrivals with their hits, finished ids, preempted and resumed
    requests), gathered over every new_step_starts since the last save.
    ``layout`` is the step's write layout once one is known (prepare or a
    save attempt), ``batch`` its checked batch; ``prepared``: given to
    prepare_read_plans; ``begun``: the core holds the step begun (with
    ``into``, the buffers of its rows, when begun with them)."""

    __slots__ = ("sched", "arrivals", "finished", "preempted", "resumed", "layout", "batch", "prepared", "begun",
                 "into")

    def __init__(self):
        self.sched = {}
        self.arrivals = {}  # rid -> (Req, hit tokens, hit block ids, tier hashes)
        self.finished = []  # core ids
        self.preempted = {}  # rid -> Req
        self.resumed = {}  # rid -> Req
        self.layout = self.batch = self.into = None  # into: the core's begin_into buffers while begun
        self.prepared = self.begun = False

    def counts(self):
        """{req_id: rows} this step computes: its layout's when known, else
        the scheduled counts."""
        if self.layout is not None:
            return {w.req_id: w.row_end - w.row_start for w in self.layout.writes if w.row_end > w.row_start}
        return {r: n for r, n in self.sched.items() if n > 0}


def step_events(events_or_step, num_scheduled_tokens):
    """((kind, event) pairs, {req_id: count}) of new_step_starts' arguments
    (a kind given by value, as another module's enum or a string, is read
    as this module's): a
    PrefixCacheStep's own counts unless num_scheduled_tokens is given, else
    num_scheduled_tokens, else the events' scheduled_tokens."""
    if isinstance(events_or_step, PrefixCacheStep):
        events = tuple(events_or_step.events)
        if num_scheduled_tokens is None:
            num_scheduled_tokens = dict(events_or_step.scheduled_tokens)
    else:
        events = tuple(events_or_step)
    if num_scheduled_tokens is None:
        num_scheduled_tokens = {ev.req_id: ev.scheduled_tokens for ev in events if ev.scheduled_tokens}
    kinds = []
    for ev in events:
        try:
            kinds.append(K(getattr(ev.kind, "value", ev.kind)))
        except ValueError:
            raise ValueError("event for req %s: unknown kind %r" % (ev.req_id, ev.kind)) from None
    return tuple(zip(kinds, events)), _counts(num_scheduled_tokens)


def plan_events(events, live, pos_of, block_size, num_blocks):
    """Checks one new_step_starts' (kind, event) pairs against the live requests (as
    they are once the pending step is dropped: pos_of(req) gives each one's
    position then) and returns what applying them does: the finished
    requests, and per other event ("arrive" | "resume" | "continue", event,
    Req or None, hit block ids). Raises, changing nothing, on a hit without
    block ids or not block aligned (upstream's words), too few or
    out-of-range block ids, a negative hit, two events for one request
    (a finish and a new start of a reused id excepted), or tier hashes on
    an event that is no arrival with a hit, more than its hit blocks, or
    not uint64 (as block hashes)."""
    ending = [ev.req_id for kind, ev in events if kind in TERMINAL]
    gone = set(ending)
    seen = set()
    ops = []
    for kind, ev in events:
        if kind in TERMINAL or kind is K.REPLACED:  # REPLACED: reserved upstream
            continue
        rid = ev.req_id
        if rid in seen:
            raise Unmatch("req %s: two events in one step" % rid)
        seen.add(rid)
        hit = int(ev.hit_end)
        if hit < 0:
            raise ValueError("event for req %s: hit_end %d is negative" % (rid, hit))
        r = None if rid in gone else live.get(rid)
        if r is None:
            op = "arrive"
        elif kind is K.RESUMED or hit < pos_of(r):
            op = "resume"  # recomputes from hit (a restart of a live request is a resume)
        else:
            op = "continue"
        blocks = ()
        if hit > 0 and op != "continue":
            groups = ev.block_ids
            if not groups or not groups[0]:
                raise Unmatch("prefix hit for req %s (%d tokens) carries no block_ids" % (rid, hit))
            if hit % block_size:
                raise Unmatch("prefix hit not block aligned (req=%s, hit_upto=%d, block_size=%d)"
                              % (rid, hit, block_size))
            need = hit // block_size
            blocks = tuple(int(b) for b in groups[0][:need])
            if len(blocks) < need:
                raise Unmatch("prefix hit for req %s (%d tokens) carries %d block_ids, needs %d"
                              % (rid, hit, len(blocks), need))
            bad = [b for b in blocks if b < 0 or b >= num_blocks]
            if bad:
                raise Unmatch("prefix hit for req %s: block ids %s outside [0, %d)" % (rid, bad[:8], num_blocks))
        th = tuple(getattr(ev, "tier_hashes", ()) or ())
        if th and (op != "arrive" or len(th) > len(blocks)):
            raise Unmatch("req %s: %d tier_hashes on a%s event with %d hit blocks: tier blocks are the last of a new "
                          "request's hit" % (rid, len(th), "n arriving" if op == "arrive" else " " + op, len(blocks)))
        for name, hs in (("tier_hashes", th), ("block_hashes", getattr(ev, "block_hashes", ()) or ())):
            if any(type(x) is bool or not isinstance(x, (int, np.integer)) or not 0 <= int(x) < 1 << 64 for x in hs):
                raise ValueError("event for req %s: %s must be uint64 integers" % (rid, name))
        ops.append((op, ev, r, blocks))
    return ending, ops


class Batch:
    """A write layout's batch, checked against the requests' positions: per
    request with rows (batch order) its Req, row count and position; the
    slots; and the block-table entries that map those positions to exactly
    those slots, written into the caller's table scratch."""

    __slots__ = ("reqs", "counts", "starts", "ids", "ntok", "table")

    def ids_map(self):
        return {r.rid: r.iid for r in self.reqs}


def build_batch(layout, live, block_size, num_blocks, table):
    """The checked Batch of layout, its block-table entries written into
    table (a 2-D int32 scratch, grown and returned as batch.table). Raises
    ValueError (no slots for a step with rows) or
    OmniPrefixCacheUnmatchError: a request the layout names is not live,
    appears twice, its rows do not follow the previous write's, or a slot
    disagrees with the request's position (the adapter's positions are not
    the engine's: saving would put rows at the wrong slots) or lies outside
    the cache's slots."""
    reqs, counts, row = [], [], 0
    for w in layout.writes:
        if w.row_start != row:
            raise Unmatch("write layout: req %s starts at row %d, expected %d (rows must follow each other)"
                          % (w.req_id, w.row_start, row))
        n = w.row_end - w.row_start
        if n < 0:
            raise Unmatch("write layout: req %s ends at row %d before its start %d" % (w.req_id, w.row_end, row))
        row = w.row_end
        if n == 0:
            continue
        r = live.get(w.req_id)
        if r is None:
            raise Unmatch("write layout: req %s has rows but is not live (no STARTED event, or it finished)"
                          % w.req_id)
        reqs.append(r)
        counts.append(n)
    if layout.total_rows != row:
        raise Unmatch("write layout: total_rows %d, its writes cover %d" % (layout.total_rows, row))
    if len({r.rid for r in reqs}) != len(reqs):
        seen, dup = set(), None
        for r in reqs:
            if r.rid in seen:
                dup = r.rid
                break
            seen.add(r.rid)
        raise Unmatch("write layout: req %s is written twice" % dup)
    slots = layout_slots(layout)
    if slots is None and row:
        raise ValueError("write_layout is missing its CPU slot snapshot")
    if slots is not None and len(slots) != row:
        raise Unmatch("slot mapping covers %d of %d scheduled tokens; CPU-side slot derivation out of sync with the "
                      "batch" % (len(slots), row))
    b = Batch()
    nr = len(reqs)
    b.reqs, b.ntok = reqs, row
    b.counts = np.array(counts, np.int32)
    b.starts = np.fromiter((r.pos for r in reqs), np.int32, nr)
    b.ids = np.fromiter((r.iid for r in reqs), np.int64, nr)
    b.table = table
    if row == 0:
        return b
    bs = block_size
    if row == nr:  # one row a request (decode)
        ri, pos = np.arange(nr), b.starts.astype(np.int64)
    else:
        ri = np.repeat(np.arange(nr), b.counts)
        first = np.zeros(nr, np.int64)
        np.cumsum(b.counts[:-1], out=first[1:])
        pos = np.arange(row, dtype=np.int64) - np.repeat(first - b.starts, b.counts)
    off = (slots - pos) % bs
    if off.any():
        t = int(np.flatnonzero(off)[0])
        r = reqs[int(ri[t])]
        raise Unmatch("write layout: req %s's row for position %d has slot %d (offset %d in its block, the "
                      "position's is %d): the request's position (%d) is not the engine's"
                      % (r.rid, int(pos[t]), int(slots[t]), int(slots[t]) % bs, int(pos[t]) % bs, r.pos))
    lo, hi = int(slots.min()), int(slots.max())
    if lo < 0 or hi >= num_blocks * bs:
        t = int(np.argmin(slots)) if lo < 0 else int(np.argmax(slots))
        raise Unmatch("write layout: req %s has slot %d, outside [0, %d) (%d blocks of %d)"
                      % (reqs[int(ri[t])].rid, int(slots[t]), num_blocks * bs, num_blocks, bs))
    col = pos // bs
    blk = (slots // bs).astype(np.int32)
    need_r, need_c = nr, int(col.max()) + 1
    if table.shape[0] < need_r or table.shape[1] < need_c:
        table = np.zeros((max(need_r, table.shape[0], 8), max(need_c, 2 * table.shape[1])), np.int32)
    table[ri, col] = blk
    if not np.array_equal(table[ri, col], blk):
        t = int(np.flatnonzero(table[ri, col] != blk)[0])
        raise Unmatch("write layout: req %s's rows in its block %d name two blocks" % (reqs[int(ri[t])].rid,
                                                                                      int(col[t])))
    b.table = table
    return b


def full_blocks(batch, block_size):
    """The full blocks the batch completes whose hashes its requests carry
    (Req.hashes), with those hashes: (block ids, hashes, per block its
    Req). A request's block j is complete once the step computes its last
    position, (j+1)*block_size - 1; its block id is the batch table's (the
    step writes that position)."""
    blocks, hashes, reqs = [], [], []
    bs = block_size
    for i, (r, n) in enumerate(zip(batch.reqs, batch.counts.tolist())):
        for j in range(r.pos // bs, min((r.pos + n) // bs, len(r.hashes))):
            blocks.append(int(batch.table[i, j]))
            hashes.append(int(r.hashes[j]))
            reqs.append(r)
    return blocks, hashes, reqs


def make_plan(batch, pend, sentinel_finish=False, publish=False, block_size=0):
    """The core Plan of a checked batch and the pending step's events.
    sentinel_finish adds core id 0 (never a request's) to the finished
    ids: the step is then never a pure decode step, whose rows cannot be
    rejected. publish (a cache with a tier) names the full blocks the step
    completes, with their hashes, for publishing, and notes them on their
    requests (Req.noted)."""
    arr = list(pend.arrivals.values())
    fin = pend.finished + [0] if sentinel_finish else pend.finished
    kw = {}
    if arr:
        kw["arrivals"] = np.fromiter((a[0].iid for a in arr), np.int64, len(arr))
        kw["hit_tokens"] = np.fromiter((a[1] for a in arr), np.int32, len(arr))
        kw["hit_blocks"] = np.fromiter((b for a in arr for b in a[2]), np.int32)
        if any(a[3] for a in arr):
            kw["tier_blocks"] = np.fromiter((len(a[3]) for a in arr), np.int32, len(arr))
            kw["tier_hashes"] = np.fromiter((int(x) for a in arr for x in a[3]), np.uint64)
    if publish:
        blocks, hashes, reqs = full_blocks(batch, block_size)
        if blocks:
            kw["full_blocks"], kw["full_hashes"] = np.array(blocks, np.int32), np.array(hashes, np.uint64)
            for r, h in zip(reqs, hashes):
                r.noted[h] = None
    if fin:
        kw["finished"] = np.array(fin, np.int64)
    if pend.preempted:
        kw["preempted"] = np.fromiter((r.iid for r in pend.preempted.values()), np.int64, len(pend.preempted))
    if pend.resumed:
        kw["resumed"] = np.fromiter((r.iid for r in pend.resumed.values()), np.int64, len(pend.resumed))
    n = len(batch.reqs)
    return core.Plan(ids=batch.ids, rows=np.arange(n, dtype=np.int32), start=batch.starts, count=batch.counts,
                     table=batch.table, **kw)


class KeyMeta:
    """How a key's rows were shaped at its first save: its rows are rebuilt
    with that dtype and trailing shape, and a later save of another dtype or
    shape is refused."""

    __slots__ = ("name", "row_bytes", "dtype", "trailing", "torch")

    def __init__(self, name, t):
        self.name = name
        self.torch = core._torch_tensor(t)
        self.dtype = t.dtype
        self.trailing = tuple(t.shape[1:])
        n = int(np.prod(self.trailing)) if self.trailing else 1
        self.row_bytes = n * (t.element_size() if self.torch else t.dtype.itemsize)

    def check(self, t):
        if core._torch_tensor(t) != self.torch or t.dtype != self.dtype or tuple(t.shape[1:]) != self.trailing:
            raise Unmatch("key %s: rows of %s %s %s; the cache keeps this key's rows as %s %s %s (from its first "
                          "save): a key's dtype and row shape cannot change"
                          % (self.name, _kind_of(t), t.dtype, tuple(t.shape[1:]), "torch" if self.torch else "numpy",
                             self.dtype, self.trailing))

    def build(self, rows):
        """rows: a uint8 [tokens, row_bytes] numpy view."""
        if self.torch:
            import torch

            return torch.from_numpy(rows).view(self.dtype).reshape((-1,) + self.trailing)
        return rows.view(self.dtype).reshape((-1,) + self.trailing)


def _kind_of(t):
    return "torch" if core._torch_tensor(t) else "numpy"


def select_device(configured, devices):
    """The CUDA ordinal a cache stages through, or None for the host: the
    configured one, else the one CUDA device among devices (the step's
    tensors' (type, index); host tensors are ("cpu", None)). Raises
    OmniPrefixCacheUnmatchError for tensors on several CUDA devices, on
    one other than the configured one, or on a device neither the host nor
    CUDA."""
    cuda = set()
    for typ, idx in devices:
        if typ == "cuda":
            cuda.add(0 if idx is None else int(idx))
        elif typ != "cpu":
            raise Unmatch("outputs on a %s device: the cache takes host and CUDA tensors" % typ)
    if len(cuda) > 1:
        raise Unmatch("outputs on several CUDA devices (%s): one cache stages through one"
                      % ", ".join("cuda:%d" % i for i in sorted(cuda)))
    if configured is not None:
        if cuda and cuda != {int(configured)}:
            raise Unmatch("outputs on cuda:%d, the cache stages through cuda:%d (PrefixCacheConfig.cuda_device)"
                          % (cuda.pop(), configured))
        return int(configured)
    return cuda.pop() if cuda else None


def as_layout(z, layout):
    """Zero rows z (uint8 [rows, row_bytes]) in a key's saved layout (dtype
    name, row shape; None: none saved yet): a key keeps the first layout it
    was saved in (KeyLayoutError otherwise)."""
    if layout is None or layout == ("uint8", (z.shape[1],)):
        return z
    dtype, shape = layout
    try:
        return z.view(np.dtype(dtype)).reshape((z.shape[0],) + shape)
    except TypeError:  # a dtype numpy lacks (bfloat16): the rows as torch's
        import torch

        return torch.from_numpy(z).view(getattr(torch, dtype)).reshape((z.shape[0],) + shape)


def zero_rows(buf, n, row_bytes, layout):
    """(buf, n zero rows of row_bytes in layout (as_layout); one row when n
    is 0), buf grown as needed: the zero buffer kept across calls."""
    need = n * row_bytes
    if buf.size < max(need, row_bytes):
        buf = np.zeros(max(need, row_bytes), np.uint8)
    z = buf[:need].reshape(n, row_bytes) if n else buf[:row_bytes].reshape(1, -1)
    return buf, as_layout(z, layout)


def alloc_rows(meta, key, rows):
    """A materialized key's buffer: host memory in the dtype and row shape
    of its saved tensors (meta, a KeyMeta; None: uint8 rows, a key never
    saved)."""
    if meta is None:
        return np.empty((rows, key.row_bytes), np.uint8)
    if meta.torch:
        import torch

        return torch.empty((rows,) + meta.trailing, dtype=meta.dtype)
    return np.empty((rows,) + meta.trailing, meta.dtype)


def into_alloc(keys, into, alloc):
    """materialize's alloc for a step begun with buffers into (per key, in
    keys order): the key's buffer when it holds the rows, else alloc's."""
    by = {k.name: b for k, b in zip(keys, into)}

    def get(key, rows):
        b = by[key.name]
        return b[:rows] if len(b) >= rows else alloc(key, rows)

    return get


def stage_outputs(res, req_ids, names, leave_out=()):
    """The StageCacheOutputs of a core Result of req_ids (keys names, in
    the core's order), without the requests in leave_out. Each request's
    rows are a view of the key's one buffer, made in the key's dtype and
    row shape (alloc_rows): no copy beyond the one out of the cache."""
    hidden, mm = None, {}
    for k in names:
        per = {r: v for r, v in zip(req_ids, res.split(k)) if r not in leave_out}
        if k == HIDDEN_KEY:
            hidden = per
        else:
            mm[k] = per
    return StageCacheOutputs(hidden_states=hidden, mm_outputs=mm)


def is_rows(v, n, padded):
    """A tensor or array of this step's per-token rows: two or more
    dimensions, the first n or padded."""
    if not (core._torch_tensor(v) or isinstance(v, np.ndarray)) or v.ndim < 2:
        return False
    return int(v.shape[0]) in (n, padded)
