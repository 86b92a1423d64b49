"""omnicache.vllm_omni: prepare_read_plans begins the step before the
forward (its hit reads start then), abort_prepared_step drops them, the
prefetch_reads switch, memory_stats, and which device a cache stages
through."""

import os

import numpy as np
import pytest

from conftest import torch_or_fail
from omnicache import vllm_omni as vo
from omnicache._vo_state import select_device
from omnicache.errors import UnsupportedError
from vo_world import RB, K, World, ev, layout, slots_of

U = vo.OmniPrefixCacheUnmatchError


def hit_step(w):
    """a writes 8 rows on blocks 1 and 2; b arrives hitting them. Returns
    b's layout and rows, b registered."""
    w.mat(w.step([w.start("a", [1, 2])], {"a": 8}), ["a"])
    w.m.new_step_starts([w.start("b", [1, 2, 3], hit=8)], num_scheduled_tokens={"b": 2})
    return w.schedule({"b": 2})


@pytest.mark.parametrize("prefetch", [True, False])
def test_prepare_starts_the_hit_reads(prefetch):
    """With prefetch_reads the hit's rows are read ahead from
    prepare_read_plans on (their buffers held before the save), and
    materialize serves them; without, materialize reads them. Rows exact
    either way."""
    w = World(prefetch_reads=prefetch)
    lay, h = hit_step(w)
    w.m.prepare_read_plans(lay)
    ahead = w.m.memory_stats()["host_read_ahead_bytes"]
    assert ahead == ((8 + 2) * RB if prefetch else 0)  # b's result buffer, its prefix read into it from Begin on
    sid = w.m.save_outputs(h, {}, num_tokens_unpadded=2, num_tokens_padded=2, write_layout=lay)
    w.commit(lay, h, {"b": 2})
    out = w.mat(sid, ["b"])
    np.testing.assert_array_equal(out.hidden_states["b"], np.concatenate([w.want("a", 8), w.want("b", 2, start=8)]))
    st = w.m.stats()
    # the read ahead served it, or (consumed before the committer reached it) the materialize took it over
    assert st["PrefetchUsed"] + st["HitReadsOnCaller"] == (1 if prefetch else 0) and st["HitRowsRead"] == 8


def test_prepare_contract():
    """prepare_read_plans twice, a save with another layout, a save without
    one: upstream's words; each undoes nothing the engine can retry, and
    none leaves the core's step begun."""
    w = World()
    lay, h = hit_step(w)
    other = layout(("b", slots_of([1, 2, 4], 8, 2)))
    w.m.prepare_read_plans(lay)
    with pytest.raises(U, match="prefix-cache write layout prepared more than once for one step"):
        w.m.prepare_read_plans(other)
    with pytest.raises(U, match="save write layout differs from the pre-forward layout"):
        w.m.save_outputs(h, {}, num_tokens_unpadded=2, num_tokens_padded=2, write_layout=other)
    with pytest.raises(ValueError, match="save_outputs requires an adapter-produced write_layout"):
        w.m.save_outputs(h, {}, num_tokens_unpadded=2, num_tokens_padded=2)
    assert w.m.stats()["PrefetchDropped"] == 1  # the first failed save undid the Begin; nothing was begun after
    same = layout(("b", slots_of([1, 2, 3], 8, 2)))  # equal, not the same object
    sid = w.m.save_outputs(h, {}, num_tokens_unpadded=2, num_tokens_padded=2, write_layout=same)
    w.commit(lay, h, {"b": 2})
    out = w.mat(sid, ["b"])
    np.testing.assert_array_equal(out.hidden_states["b"], np.concatenate([w.want("a", 8), w.want("b", 2, start=8)]))
    with pytest.raises(U, match="prepare_read_plans without new_step_starts"):
        w.m.prepare_read_plans(lay)
    w.m.abort_prepared_step()  # no step: nothing to do


def test_prepare_refuses_a_bad_layout_and_changes_nothing():
    w = World()
    lay, h = hit_step(w)
    with pytest.raises(U, match="write layout gives req b 1 rows, num_scheduled_tokens 2"):
        w.m.prepare_read_plans(layout(("b", slots_of([1, 2, 3], 8, 1))))
    w.m.prepare_read_plans(lay)
    w.commit(lay, h, {"b": 2})
    w.mat(w.m.save_outputs(h, {}, num_tokens_unpadded=2, num_tokens_padded=2, write_layout=lay), ["b"])
    np.testing.assert_array_equal(w.got["b"], np.concatenate([w.want("a", 8), w.want("b", 2, start=8)]))


def test_memory_stats():
    w = World(staging_capacity_tokens=64)
    assert set(w.m.memory_stats().values()) == {0}  # no core yet
    lay, h = hit_step(w)
    w.m.prepare_read_plans(lay)
    sid = w.m.save_outputs(h, {}, num_tokens_unpadded=2, num_tokens_padded=2, write_layout=lay)
    w.m._core.sync()  # the committer writes the mirror in the background
    ms, st = w.m.memory_stats(), w.m.stats()
    assert ms["host_mirror_bytes"] == st["MirrorResidentBytes"] > 0
    assert ms["host_staging_bytes"] == st["PagesInUse"] * 64 * RB and st["PagesInUse"] >= 1  # sid holds its page
    assert ms["host_read_ahead_bytes"] == st["ReadAheadBytes"]
    assert (ms["device_bytes"], ms["device_budget_bytes"]) == (st["BudgetCharged"], 512 << 20)
    w.m.discard_step(sid)
    assert w.m.memory_stats()["host_read_ahead_bytes"] == 0


def test_device_selection():
    """From the tensors' devices, or the configured ordinal; the host when
    none is CUDA."""
    assert select_device(None, {("cpu", None)}) is None
    assert select_device(None, set()) is None
    assert select_device(None, {("cpu", None), ("cuda", 1)}) == 1
    assert select_device(2, {("cpu", None)}) == 2
    assert select_device(1, {("cuda", 1)}) == 1
    for conf, devs, msg in ((None, {("cuda", 0), ("cuda", 1)}, r"several CUDA devices \(cuda:0, cuda:1\)"),
                            (0, {("cuda", 1)}, r"outputs on cuda:1, the cache stages through cuda:0"),
                            (None, {("meta", None)}, "outputs on a meta device")):
        with pytest.raises(U, match=msg):
            select_device(conf, devs)


def test_cuda_device_without_a_cuda_library():
    """A configured CUDA device with this (host) build of the library: a
    clear error naming the CUDA build, at keys= creation or at the first
    save, which can be saved once the config is right. Against the cuda
    build (OMNICACHE_CUDA_BUILD=1, .gpu/run.sh) the device opens instead."""
    cfg = vo.PrefixCacheConfig(num_blocks=16, block_size=4, cuda_device=0)
    if os.environ.get("OMNICACHE_CUDA_BUILD") == "1":
        vo.OmniPrefixCacheManager(cfg, keys={vo.HIDDEN_KEY: RB}).shutdown()
        return
    with pytest.raises(U, match=r"cannot stage through cuda:0.*make python-cuda") as ei:
        vo.OmniPrefixCacheManager(cfg, keys={vo.HIDDEN_KEY: RB})
    assert isinstance(ei.value.__cause__, UnsupportedError)
    m = vo.OmniPrefixCacheManager(cfg)
    m.new_step_starts([vo.PrefixCacheRequestEvent("a", vo.PrefixCacheEventKind.STARTED, block_ids=((1,),))],
                      num_scheduled_tokens={"a": 2})
    lay = layout(("a", [4, 5]))
    with pytest.raises(U, match="cannot stage through cuda:0"):
        m.save_outputs(np.ones((2, RB), np.uint8), {}, num_tokens_unpadded=2, num_tokens_padded=2, write_layout=lay)
    assert m.stats() == {}


def test_meta_tensor_refused():
    torch = torch_or_fail()
    w = World()
    w.m.new_step_starts([w.start("a", [1])], num_scheduled_tokens={"a": 2})
    lay, _ = w.schedule({"a": 2})
    with pytest.raises(U, match="outputs on a meta device"):
        w.m.save_outputs(torch.empty(2, 2, device="meta"), {}, num_tokens_unpadded=2, num_tokens_padded=2,
                         write_layout=lay)


def test_dropped_step_keeps_the_keys_layout():
    """A step that registered, was prepared and aborted, and is dropped by the
    next new_step_starts is saved with zero rows in each key's saved layout
    (float32 rows of 4 here, not bytes): the drop goes through, and a hit over
    its slots is refused rather than served."""
    m = vo.OmniPrefixCacheManager(vo.PrefixCacheConfig(num_blocks=64, block_size=4))
    m.new_step_starts([ev("x", K.STARTED, 0, [1, 2])], num_scheduled_tokens={"x": 8})
    m.discard_step(m.save_outputs(np.ones((8, 4), np.float32), {}, num_tokens_unpadded=8, num_tokens_padded=8,
                                  write_layout=layout(("x", slots_of([1, 2], 0, 8)))))
    m.new_step_starts([ev("x", K.FINISHED), ev("y", K.STARTED, 0, [1, 2, 3])], num_scheduled_tokens={"y": 8})
    m.prepare_read_plans(layout(("y", slots_of([1, 2, 3], 0, 8))))
    m.abort_prepared_step()
    m.new_step_starts([ev("z", K.STARTED, 8, [1, 2, 4])], num_scheduled_tokens={"z": 1})
    sid = m.save_outputs(np.ones((1, 4), np.float32), {}, num_tokens_unpadded=1, num_tokens_padded=1,
                         write_layout=layout(("z", slots_of([1, 2, 4], 8, 1))))
    with pytest.raises(vo.OmniPrefixCacheUnmatchError, match="hit span for req z key=__hidden_states__ is not readable"):
        m.materialize(sid, ["z"])
    m.shutdown()


XB = list(range(1, 17))  # x's 16 blocks of 4


def hit_on_prefill(**kw):
    """A manager (kw its options) whose request x computed 64 tokens (rows
    x) and whose request y, registered next, hits them and computes 2 at
    layout lay, prepared: (m, x, lay)."""
    m = vo.OmniPrefixCacheManager(vo.PrefixCacheConfig(num_blocks=64, block_size=4), **kw)
    m.new_step_starts([ev("x", K.STARTED, 0, XB)], num_scheduled_tokens={"x": 64})
    x = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
    m.discard_step(m.save_outputs(x, {}, num_tokens_unpadded=64, num_tokens_padded=64,
                                  write_layout=layout(("x", slots_of(XB, 0, 64)))))
    m.new_step_starts([ev("x", K.FINISHED), ev("y", K.STARTED, 64, XB + [20])], num_scheduled_tokens={"y": 2})
    lay = layout(("y", slots_of(XB + [20], 64, 2)))
    m.prepare_read_plans(lay)
    return m, x, lay


def test_steps_begun_with_their_rows_buffers():
    """A step with arrivals (after the first save) is begun with buffers for
    its rows (Cache.begin_into): the hit is read into them during the
    forward and materialize of the whole step returns them, rows exact; the
    manager keeps them only until the step is consumed or dropped."""
    m, x, lay = hit_on_prefill()
    assert m._pend.into is not None and len(m._pend.into[0]) == 66
    y = np.full((2, 4), 7, np.float32)
    sid = m.save_outputs(y, {}, num_tokens_unpadded=2, num_tokens_padded=2, write_layout=lay)
    into = m._into[sid][0]
    got = m.materialize(sid, ["y"]).hidden_states["y"]
    assert np.shares_memory(got, into) and np.array_equal(got, np.concatenate([x, y]))
    assert m._into == {}
    m.new_step_starts([ev("z", K.STARTED, 64, XB + [21])], num_scheduled_tokens={"z": 1})
    m.prepare_read_plans(layout(("z", slots_of(XB + [21], 64, 1))))
    assert m._pend.into is not None
    m.abort_prepared_step()
    assert m._pend.into is None
    sid = m.save_outputs(np.ones((1, 4), np.float32), {}, num_tokens_unpadded=1, num_tokens_padded=1,
                         write_layout=layout(("z", slots_of(XB + [21], 64, 1))))
    m.discard_step(sid)
    assert m._into == {}
    m.shutdown()


def test_result_buffers_off():
    """result_buffers=False begins every step plainly: materialize makes its
    own buffers, the rows the same."""
    m, x, lay = hit_on_prefill(result_buffers=False)
    assert m._pend.into is None
    y = np.full((2, 4), 7, np.float32)
    sid = m.save_outputs(y, {}, num_tokens_unpadded=2, num_tokens_padded=2, write_layout=lay)
    assert m._into == {}
    assert np.array_equal(m.materialize(sid, ["y"]).hidden_states["y"], np.concatenate([x, y]))
    m.shutdown()
