"""omnicache.vllm_omni.PrefixCacheSchedulerAdapter over plain objects shaped
like vLLM's scheduler output and a group view: the events and write
layouts it builds, frozen, and a manager fed with them."""

import dataclasses
from types import SimpleNamespace as NS

import numpy as np
import pytest

from conftest import torch_or_fail
from omnicache import vllm_omni as vo

K = vo.PrefixCacheEventKind
BS = 4


def sched_out(new=(), cached=(), resumed=(), finished=(), aborted=None, num=None, legacy_resumed=False):
    """A vLLM SchedulerOutput's shape: new = (req_id, computed, blocks);
    cached = (req_id, computed, new_blocks or None)."""
    c = NS(req_ids=[r for r, _, _ in cached], new_block_ids=[b for _, _, b in cached],
           num_computed_tokens=[n for _, n, _ in cached], new_token_ids=[], num_output_tokens=[0] * len(cached))
    if legacy_resumed:
        c.resumed_from_preemption = [r in resumed for r, _, _ in cached]
    else:
        c.resumed_req_ids = set(resumed)
    so = NS(scheduled_new_reqs=[NS(req_id=r, num_computed_tokens=n, block_ids=b, prompt_token_ids=[0] * 8)
                                for r, n, b in new],
            scheduled_cached_reqs=c, num_scheduled_tokens=dict(num or {}), finished_req_ids=set(finished),
            total_num_scheduled_tokens=sum((num or {}).values()))
    if aborted is not None:
        so.aborted_req_ids = set(aborted)
    return so


class GroupView:
    """A vLLM-style group view: the input batch's request order and, per
    scheduled token, its KV slot from the block table (plain Python, the
    reference)."""

    def __init__(self, order, blocks, computed):
        self.order, self.blocks, self.computed = order, blocks, computed
        self.calls = []

    def batch_req_ids(self):
        return list(self.order)

    def step_slots_cpu(self, req_ids, num_scheduled):
        import torch

        self.calls.append((list(req_ids), dict(num_scheduled)))
        out = []
        for r in req_ids:
            for p in range(self.computed[r], self.computed[r] + num_scheduled.get(r, 0)):
                out.append(self.blocks[r][p // BS] * BS + p % BS)
        return torch.tensor(out, dtype=torch.int64)


def test_translate_step():
    a = vo.PrefixCacheSchedulerAdapter()
    so = sched_out(new=[("x", 8, ([3, 4, 5],)), ("y", 0, [6])], num={"x": 2, "y": 4})
    step = a.translate_step(so)
    assert step.events == (vo.PrefixCacheRequestEvent("x", K.STARTED, 0, 8, ((3, 4, 5),), 2),
                           vo.PrefixCacheRequestEvent("y", K.STARTED, 0, 0, ((6,),), 4))
    assert step.scheduled_tokens == (("x", 2), ("y", 4)) and list(step) == list(step.events)
    # x seen again as new: EXTENDED; y resumed on new blocks from 4 computed tokens; z finished, w aborted
    so = sched_out(new=[("x", 10, [3, 4, 5])], cached=[("y", 4, ([6, 9],)), ("q", 3, None)], resumed=["y"],
                   finished=["z", "w"], aborted=["w"], num={"x": 1, "y": 3, "q": 1})
    ev = a.translate_scheduler_output(so)
    assert [(e.req_id, e.kind) for e in ev] == [("x", K.EXTENDED), ("y", K.RESUMED), ("w", K.ABORTED),
                                                ("z", K.FINISHED)]
    assert (ev[1].hit_end, ev[1].block_ids, ev[1].scheduled_tokens) == (4, ((6, 9),), 3)
    # an id that finishes and is new again in one step starts afresh; the legacy resumed flags
    so = sched_out(new=[("x", 0, [7])], cached=[("y", 0, [[8]])], resumed=["y"], finished=["x"],
                   legacy_resumed=True)
    assert [(e.req_id, e.kind) for e in a.translate_scheduler_output(so)] == [
        ("x", K.STARTED), ("y", K.RESUMED), ("x", K.FINISHED)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev[0].hit_end = 0


def test_translate_refusals():
    a = vo.PrefixCacheSchedulerAdapter()
    with pytest.raises(ValueError, match=r"resumed_req_ids missing from req_ids: \['y'\]"):
        a.translate_scheduler_output(sched_out(resumed=["y"]))
    so = sched_out(cached=[("y", 4, None)])
    so.scheduled_cached_reqs.num_computed_tokens = [1, 2]
    with pytest.raises(ValueError, match="num_computed_tokens has 2 entries for 1 req_ids"):
        a.translate_scheduler_output(so)
    with pytest.raises(ValueError, match=r"num_scheduled_tokens\['x'\] is -2"):
        a.translate_step(sched_out(new=[("x", 0, [1])], num={"x": -2}))
    with pytest.raises(AttributeError, match="no req_id/request_id"):
        a.translate_scheduler_output(NS(scheduled_new_reqs=[NS(num_computed_tokens=0)], finished_req_ids=()))
    assert a.translate_scheduler_output(NS(scheduled_new_reqs=[NS(request_id=7, block_ids=None)],
                                           finished_req_ids=()))[0].req_id == "7"


def test_build_write_layout():
    torch_or_fail()
    a = vo.PrefixCacheSchedulerAdapter()
    gv = GroupView(["y", "x", "idle"], {"x": [3, 4, 5], "y": [6, 7], "idle": [9]}, {"x": 8, "y": 2, "idle": 4})
    lay = a.build_write_layout(gv, num_scheduled_tokens={"x": 2, "y": 3})
    assert gv.calls == [(["y", "x", "idle"], {"x": 2, "y": 3})]
    assert lay.writes == (vo.PrefixCacheWrite("y", 0, 3), vo.PrefixCacheWrite("x", 3, 5),
                          vo.PrefixCacheWrite("idle", 5, 5))
    assert lay.total_rows == 5 and lay.slots_cpu.tolist() == [26, 27, 28, 20, 21]
    assert lay == a.build_write_layout(gv, num_scheduled_tokens={"x": 2, "y": 3})  # equal, not the same
    assert lay != a.build_write_layout(GroupView(["y", "x"], {"x": [3, 4, 6], "y": [6, 7]}, {"x": 8, "y": 2}),
                                       num_scheduled_tokens={"x": 2, "y": 3})
    with pytest.raises(dataclasses.FrozenInstanceError):
        lay.total_rows = 1

    class Short(GroupView):
        def step_slots_cpu(self, req_ids, num_scheduled):
            return super().step_slots_cpu(req_ids, num_scheduled)[:-1]

    with pytest.raises(ValueError, match="write layout slot count 4 does not match scheduled row count 5"):
        a.build_write_layout(Short(gv.order, gv.blocks, gv.computed), num_scheduled_tokens={"x": 2, "y": 3})
    with pytest.raises(ValueError, match=r"num_scheduled_tokens\['x'\] is -1"):
        a.build_write_layout(gv, num_scheduled_tokens={"x": -1})

    class NoOrder:  # no batch_req_ids: num_scheduled_tokens' order
        def step_slots_cpu(self, req_ids, num_scheduled):
            return np.arange(sum(num_scheduled.values()), dtype=np.int64)

    lay = a.build_write_layout(NoOrder(), num_scheduled_tokens={"b": 1, "a": 2})
    assert [w.req_id for w in lay.writes] == ["b", "a"] and lay.slots_cpu.tolist() == [0, 1, 2]


def test_manager_fed_by_the_adapter():
    """Events and layouts built from vLLM-shaped objects drive the manager:
    a prefill, a request hitting its blocks, a resume on new blocks."""
    torch = torch_or_fail()
    a = vo.PrefixCacheSchedulerAdapter()
    m = vo.OmniPrefixCacheManager(vo.PrefixCacheConfig(num_blocks=32, block_size=BS))
    blocks, computed = {"x": [1, 2, 3]}, {"x": 0}
    full = torch.arange(12 * 2, dtype=torch.float32).reshape(12, 2)  # x's rows by position; y's prompt is x's

    def step(so, order, rows):
        m.new_step_starts(a.translate_step(so))
        lay = a.build_write_layout(GroupView(order, blocks, computed), num_scheduled_tokens=so.num_scheduled_tokens)
        m.prepare_read_plans(lay)
        n = lay.total_rows
        sid = m.save_outputs(rows, {}, num_tokens_unpadded=n, num_tokens_padded=n, write_layout=lay)
        for r, k in so.num_scheduled_tokens.items():
            computed[r] += k
        return m.materialize(sid, order).hidden_states

    out = step(sched_out(new=[("x", 0, [1, 2, 3])], num={"x": 8}), ["x"], full[:8])
    assert torch.equal(out["x"], full[:8])
    blocks["y"], computed["y"] = [1, 2, 4], 8
    out = step(sched_out(new=[("y", 8, [1, 2, 4])], cached=[("x", 8, None)], num={"x": 1, "y": 1}), ["x", "y"],
               torch.stack([full[8], full[8]]))
    assert torch.equal(out["x"], full[8:9]) and torch.equal(out["y"], full[:9])
    # x preempted, resumed on new blocks with no hit: recomputes 0..9, is delivered only row 9
    blocks["x"], computed["x"] = [5, 6, 7], 0
    out = step(sched_out(cached=[("x", 0, ([5, 6, 7],))], resumed=["x"], num={"x": 10}), ["x"], full[:10])
    assert torch.equal(out["x"], full[9:10])
    assert m.stats()["HitRequests"] == 1
