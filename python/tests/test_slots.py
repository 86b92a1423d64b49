"""FullAttentionGroupView: the step's KV slots from a block table through
the library's slot kernels, exact against a plain Python reference."""

import os

import numpy as np
import pytest

import omnicache as oc
from omnicache import _calls, _ffi
from omnicache.slots import FullAttentionGroupView
from omnicache.vllm_omni import PrefixCacheWriteLayout

NO_TORCH = os.environ.get("OMNICACHE_TEST_NO_TORCH") == "1"


def reference(table, bs, computed, rows, counts):
    """Each scheduled token's slot, one position at a time."""
    out = []
    for r, c in zip(rows, counts):
        for pos in range(int(computed[r]), int(computed[r]) + int(c)):
            out.append(int(table[r][pos // bs]) * bs + pos % bs)
    return out


def random_case(rng):
    """A block table, its computed tokens, the batch's ids (with holes) and
    one step's scheduled requests (a subset, maybe shuffled) and counts."""
    nrows = int(rng.integers(1, 33))
    blocks = int(rng.integers(1, 65))
    bs = int(rng.choice([1, 2, 3, 4, 8, 16, 32]))
    table = rng.integers(0, (1 << 31) // (bs * 2), size=(nrows, blocks), dtype=np.int32)
    cap = blocks * bs
    computed = rng.integers(0, cap + 1, size=nrows, dtype=np.int32)
    ids = ["req-%d" % i for i in range(nrows)]
    for i in rng.choice(nrows, size=int(rng.integers(0, max(1, nrows // 4))), replace=False):
        ids[i] = None  # a hole: a row the batch does not use
    live = [i for i in range(nrows) if ids[i] is not None]
    sched_rows = [i for i in live if rng.random() < 0.8]
    if rng.random() < 0.3:
        rng.shuffle(sched_rows)
    counts = [int(rng.integers(0, cap - computed[i] + 1)) for i in sched_rows]
    return table, bs, computed, ids, sched_rows, counts


@pytest.mark.parametrize("fallback", [False, True])
def test_slots_exact_on_random_tables(fallback):
    """1,000 random tables and steps: every slot equals the reference's,
    whichever way the counts and the rows are given."""
    rng = np.random.default_rng(51)
    for case in range(1000):
        table, bs, computed, ids, rows, counts = random_case(rng)
        index = {r: i for i, r in enumerate(ids) if r is not None} if case % 2 else None
        v = FullAttentionGroupView(table, bs, computed, ids, req_id_to_index=index)
        req = [ids[i] for i in rows]
        # a dict may leave out requests with nothing scheduled
        sched = {r: c for r, c in zip(req, counts) if c or case % 5} if case % 3 else counts
        got = v._slots_ctypes(req, sched) if fallback else v.step_slots_cpu(req, sched)
        assert got.dtype == np.int64 and got.tolist() == reference(table, bs, computed, rows, counts), case


def test_the_fast_path_is_used():
    v = FullAttentionGroupView(np.zeros((1, 1), np.int32), 16, np.zeros(1, np.int32), ["a"])
    assert (v._cslots is not None) == (_calls.hot().backend == "fast")
    assert _calls.hot().backend == "fast" or os.environ.get("OMNICACHE_NO_FAST") or os.environ.get("OMNICACHE_CTYPES")


@pytest.mark.skipif(NO_TORCH, reason="OMNICACHE_TEST_NO_TORCH=1")
def test_torch_table_gives_torch_slots_and_reads_in_place():
    import torch

    table = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    computed = torch.tensor([0, 5, 2], dtype=torch.int32)
    v = FullAttentionGroupView(table, 4, computed, ["a", "b", "c"])
    s = v.step_slots_cpu(["b", "c"], {"b": 2, "c": 3})
    assert s.dtype == torch.int64 and s.tolist() == [4 * 5 + 1, 4 * 5 + 2, 8 * 4 + 2, 8 * 4 + 3, 9 * 4 + 0]
    table[1, 1] = 40  # the engine updates its table and counts in place
    computed[1] = 6
    assert v.step_slots_cpu(["b"], [1]).tolist() == [40 * 4 + 2]


def test_refusals_return_nothing():
    table = np.arange(8, dtype=np.int32).reshape(2, 4)
    v = FullAttentionGroupView(table, 4, np.array([0, 14], np.int32), ["a", "b"])
    with pytest.raises(KeyError, match="'x' is not in the batch"):
        v.step_slots_cpu(["a", "x"], [1, 1])
    assert v.step_slots_cpu(["a", "b"], {"a": 1}).tolist() == [0]  # b: no entry, nothing scheduled
    with pytest.raises(ValueError, match="-1 scheduled tokens"):
        v.step_slots_cpu(["a"], [-1])
    with pytest.raises(ValueError, match="1 requests, 2 scheduled counts"):
        v.step_slots_cpu(["a"], [1, 1])
    with pytest.raises(oc.ArgumentError, match=r"request 1: positions \[14, 17\), a row holds 16"):
        v.step_slots_cpu(["a", "b"], [2, 3])  # b's row ends at position 16
    with pytest.raises(TypeError, match="int32"):
        FullAttentionGroupView(table.astype(np.int64), 4, np.zeros(2, np.int32), ["a", "b"])
    with pytest.raises(ValueError, match="num_computed_tokens has 1 rows"):
        FullAttentionGroupView(table, 4, np.zeros(1, np.int32), ["a", "b"])
    assert v.step_slots_cpu([], []).tolist() == []


def test_build_write_layout():
    """The batch's order, one write per request of the batch (none for one
    with no tokens scheduled), rows after each other; slots_cpu holds
    every row's slot (the adapter's layout)."""
    table = np.array([[7, 8], [3, 4], [5, 6], [9, 9]], np.int32)
    v = FullAttentionGroupView(table, 2, np.array([1, 0, 3, 0], np.int32), ["a", None, "c", "idle"])
    assert v.batch_req_ids() == ["a", "c", "idle"]
    lay = v.build_write_layout({"c": 1, "a": 2})
    assert isinstance(lay, PrefixCacheWriteLayout)
    assert [(w.req_id, w.row_start, w.row_end) for w in lay.writes] == [("a", 0, 2), ("c", 2, 3), ("idle", 3, 3)]
    assert lay.total_rows == 3 and lay.slots_cpu.tolist() == [7 * 2 + 1, 8 * 2 + 0, 6 * 2 + 1]


@pytest.mark.skipif(NO_TORCH, reason="OMNICACHE_TEST_NO_TORCH=1")
def test_manager_fed_through_the_group_view():
    """An engine's persistent block table and computed tokens, updated in
    place, give the manager its layouts: a prefill, then a request hitting
    its first two blocks beside its decode; rows exact."""
    import torch

    from omnicache import vllm_omni as vo

    bs = 4
    table, computed, ids = np.zeros((4, 8), np.int32), np.zeros(4, np.int32), []
    view = FullAttentionGroupView(table, bs, computed, ids)
    a = vo.PrefixCacheSchedulerAdapter()
    m = vo.OmniPrefixCacheManager(vo.PrefixCacheConfig(num_blocks=32, block_size=bs))
    full = torch.arange(12 * 3, dtype=torch.float32).reshape(12, 3)

    def step(events, sched, rows):
        m.new_step_starts(vo.PrefixCacheStep(tuple(events), tuple(sched.items())))
        lay = view.build_write_layout(sched)
        n = lay.total_rows
        sid = m.save_outputs(rows, {}, num_tokens_unpadded=n, num_tokens_padded=n, write_layout=lay)
        for r, k in sched.items():
            computed[ids.index(r)] += k
        return m.materialize(sid, list(sched)).hidden_states

    ids.append("x")
    table[0, :3] = [1, 2, 3]
    out = step([vo.PrefixCacheRequestEvent("x", vo.PrefixCacheEventKind.STARTED, block_ids=((1, 2, 3),))],
               {"x": 8}, full[:8])
    assert torch.equal(out["x"], full[:8])
    ids.append("y")
    table[1, :3], computed[1] = [1, 2, 4], 8
    out = step([vo.PrefixCacheRequestEvent("y", vo.PrefixCacheEventKind.STARTED, 0, 8, ((1, 2, 4),))],
               {"x": 1, "y": 1}, torch.stack([full[8], full[8]]))
    assert torch.equal(out["x"], full[8:9]) and torch.equal(out["y"], full[:9])
    m.shutdown()


def test_abi_slots_short_buffer_and_bad_rows_write_nothing():
    """omnicache_slots: a dst too short is SHORT_BUFFER with the number
    needed; a row outside the table ARGUMENT; neither writes a slot."""
    import ctypes

    L = _ffi.lib()
    table = np.arange(8, dtype=np.int32).reshape(2, 4)
    rows, start, count = np.array([1], np.int32), np.array([2], np.int32), np.array([3], np.int32)
    dst = np.full(4, -7, np.int64)
    written = _ffi.c_i64()

    def call(rows, cap):
        return L.omnicache_slots(table.ctypes.data, table.size, 4, rows.ctypes.data, start.ctypes.data,
                                 count.ctypes.data, 1, 4, dst.ctypes.data, cap, ctypes.byref(written))

    assert call(rows, 2) == 102 and written.value == 3 and (dst == -7).all()
    assert call(np.array([2], np.int32), 4) == 100 and "row 2, table of 2 rows" in _ffi.last_error()
    assert (dst == -7).all()
    assert call(rows, 4) == 0 and written.value == 3 and dst[:3].tolist() == [4 * 4 + 2, 4 * 4 + 3, 5 * 4 + 0]
