"""Plan: one step's plan, struct-of-arrays, as the library reads it
(omnicache_plan)."""

import ctypes

import numpy as np

from . import _ffi
from ._args import _I64, _int, _ints
from .errors import PlanError

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
        self._ref = ctypes.addressof(self._c)  # what begin hands the library
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

    def result_rows(self):
        """The rows materialize of the whole step returns per key when the
        hits are those of this plan's arrivals: every scheduled token plus
        the hit tokens of the arrivals scheduled in the step (a hit of an
        earlier arrival first scheduled now makes more: Cache.begin_into's
        buffers are then left unused)."""
        k = self._keep
        ids, count = k.get("ids"), k.get("count")
        if ids is None or self._n == 0:
            return 0
        rows = int(np.asarray(count).sum())
        arr, hits = k.get("arrivals"), k.get("hit_tokens")
        if arr is not None and self._c.n_arrivals:
            arr, hits = np.asarray(arr), np.asarray(hits)
            on = hits > 0
            if on.any():
                rows += int(hits[on][np.isin(arr[on], np.asarray(ids))].sum())
        return rows


def _plan_field(name):
    return property(lambda self: self._keep.get(name), doc="The plan's %s array as given (None: unset)." % name)


# plan.ids, plan.count, ...: the arrays as given. Properties rather than
# __getattr__, which would slow every attribute access of a Plan (begin
# reads plan._ref each step).
for _f in _PLAN_FIELDS:
    setattr(Plan, _f, _plan_field(_f))
del _f
