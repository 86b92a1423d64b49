"""Cache.begin_into: a step's rows made into the engine's buffers (Go
Plan.ResultInto): a hit's prefix read into them during the forward, a
prefill's rows (over 4 MiB) copied there by save, materialize of the whole
step finding them in place."""

import numpy as np
import pytest

import omnicache as oc

RB, BS, N = 64 << 10, 16, 128  # a step of 8 MiB of rows
STRIDE = 2 * N // BS
TABLE = np.tile(np.arange(STRIDE, dtype=np.int32), (2, 1))  # both rows: blocks 0..15


def rows(n, seed):
    return (np.arange(n, dtype=np.uint8)[:, None] + np.uint8(seed)).repeat(RB, axis=1)


def test_result_rows():
    p = oc.Plan(ids=[1, 2], rows=[0, 1], start=[0, 8], count=[4, 2], table=TABLE, arrivals=[2, 3],
                hit_tokens=[8, 16])
    assert p.result_rows() == 4 + 2 + 8, "request 3 arrived but is not scheduled: its hit is not in the step"
    assert oc.Plan().result_rows() == 0


def test_prefill_and_hit_into_the_engines_buffers():
    c = oc.Cache([oc.Key("hidden", RB)], num_blocks=2 * STRIDE, block_size=BS, staging_capacity_tokens=N)
    out, want = rows(N, 1), rows(N, 1)
    plan = oc.Plan(ids=[1], rows=[0], start=[0], count=[N], table=TABLE, arrivals=[1], hit_tokens=[0])
    into = np.zeros((plan.result_rows(), RB), np.uint8)
    c.begin_into(plan, [into])
    sid = c.save([out])
    assert np.array_equal(into, want), "save copied the prefill's rows into the buffer"
    out[:] = 0  # the engine's next forward
    r = c.materialize(sid, alloc=lambda k, n: into[:n])
    assert r.keys["hidden"] is into or np.shares_memory(r.keys["hidden"], into)
    assert np.array_equal(r.rows(0, "hidden"), want)

    # request 2 hits request 1's first 64 tokens and computes 128 more
    hit = N // 2
    plan = oc.Plan(ids=[2], rows=[1], start=[hit], count=[N], table=TABLE, arrivals=[2], hit_tokens=[hit],
                   hit_blocks=list(range(hit // BS)), finished=[1])
    into = np.zeros((plan.result_rows(), RB), np.uint8)
    c.begin_into(plan, [into])
    out[:] = rows(N, 50)
    sid = c.save([out])
    out[:] = 0
    r = c.materialize(sid, alloc=lambda k, n: into[:n])
    assert np.shares_memory(r.keys["hidden"], into)
    assert np.array_equal(into[:hit], want[:hit]) and np.array_equal(into[hit:], rows(N, 50))
    c.close()


def test_buffers_too_small_or_miscounted():
    c = oc.Cache([oc.Key("hidden", RB)], num_blocks=2 * STRIDE, block_size=BS, staging_capacity_tokens=N)
    plan = oc.Plan(ids=[1], rows=[0], start=[0], count=[N], table=TABLE, arrivals=[1], hit_tokens=[0])
    with pytest.raises(oc.ArgumentError, match="2 buffers for 1 keys"):
        c.begin_into(plan, [np.zeros((N, RB), np.uint8)] * 2)
    with pytest.raises(oc.SequenceError):
        c.save([rows(N, 1)])  # nothing was begun
    small = np.zeros((N - 1, RB), np.uint8)
    c.begin_into(plan, [small])
    sid = c.save([rows(N, 1)])
    assert not small.any(), "a buffer too small is left unused"
    assert np.array_equal(c.materialize(sid).rows(0, "hidden"), rows(N, 1))
    c.close()
