"""omnicache.vllm_omni: the event API called twice, or not at all, and
steps whose forward or save failed. Events are queued, never overwritten;
a failed save leaves the manager ready (the core's Begin undone) with the
step registered for a retry; a step that computed rows and is never saved
is dropped: its events reach the core, its slots serve no stale rows."""

import numpy as np
import pytest

from conftest import torch_or_fail
from omnicache import vllm_omni as vo
from vo_world import K, World, layout, rows, slots_of

U = vo.OmniPrefixCacheUnmatchError


def test_events_of_a_step_without_tokens_carry_over():
    """A step with no scheduled tokens (no forward, no save): its finish and
    its arrival's hit are not overwritten by the next new_step_starts; an
    arrival that finishes before any save never reaches the core."""
    w = World()
    w.mat(w.step([w.start("a", [1, 2, 3])], {"a": 8}), ["a"])
    w.m.new_step_starts([w.finish("a"), w.start("b", [1, 2, 5], hit=8), w.start("c", [9])], num_scheduled_tokens={})
    w.m.new_step_starts([w.finish("c")], num_scheduled_tokens={"b": 2})
    lay, h = w.schedule({"b": 2})
    out = w.m.materialize(w.m.save_outputs(h, {}, num_tokens_unpadded=2, num_tokens_padded=2, write_layout=lay), ["b"])
    np.testing.assert_array_equal(out.hidden_states["b"], np.concatenate([w.want("a", 8), w.want("b", 2, start=8)]))
    st = w.m.stats()
    assert st["HitRequests"] == 1 and st["LiveRequests"] == 1  # b


def test_failed_save_not_retried_is_rolled_back():
    """The save of a step that finishes a fails and the engine goes on: a
    leaves the core, b's row of the failed step is lost (a later hit over
    its slot is refused, never an older tenant's row), and b goes on from
    the next position."""
    w = World()
    w.mat(w.step([w.start("t", [4])], {"t": 4}), ["t"])  # an older tenant of block 4
    w.mat(w.step([w.finish("t"), w.start("a", [1]), w.start("b", [2, 4])], {"a": 2, "b": 4}), ["a", "b"])
    w.m.new_step_starts([w.finish("a")], num_scheduled_tokens={"b": 1})
    lay, h = w.schedule({"b": 1})
    before = w.m.stats()
    with pytest.raises(U, match="hidden_states has 0 rows, need 1"):
        w.m.save_outputs(h[:0], {}, num_tokens_unpadded=1, num_tokens_padded=1, write_layout=lay)
    assert w.m.stats()["Steps"] == before["Steps"] and w.m.stats()["LiveRequests"] == 2
    w.lost({"b": 1})
    sid = w.step([], {"b": 1})
    assert w.m.stats()["LiveRequests"] == 1
    out = w.mat(sid, ["b"])
    np.testing.assert_array_equal(out.hidden_states["b"], w.want("b", 1, start=5))
    # c hits b's blocks: position 4 (slot 16) was never saved
    sid = w.step([w.start("c", [2, 4, 7], hit=8)], {"c": 1})
    with pytest.raises(U, match="hit span for req c key=__hidden_states__ is not readable"):
        w.m.materialize(sid, ["c"])


def test_failed_save_after_begin_leaves_the_manager_ready():
    """The core began the step (prepare_read_plans) and save_outputs fails
    on the Python side (the hidden states turned bf16): the core's Begin is
    undone, the retry saves the step, and the next step saves (no "Begin
    twice")."""
    torch = torch_or_fail()
    w = World()
    h1 = torch.randn(8, 2)
    w.m.new_step_starts([w.start("a", [1, 2])], num_scheduled_tokens={"a": 8})
    lay = layout(("a", slots_of([1, 2], 0, 8)))
    w.m.discard_step(w.m.save_outputs(h1, {}, num_tokens_unpadded=8, num_tokens_padded=8, write_layout=lay))
    w.m.new_step_starts([w.finish("a"), w.start("b", [1, 2, 3], hit=8)], num_scheduled_tokens={"b": 2})
    lay = layout(("b", slots_of([1, 2, 3], 8, 2)))
    w.m.prepare_read_plans(lay)
    h2 = torch.randn(2, 2)
    with pytest.raises(U, match=r"key __hidden_states__: rows of torch torch.bfloat16 \(4,\).*torch.float32 \(2,\)"):
        w.m.save_outputs(h2.to(torch.bfloat16).repeat(1, 2), {}, num_tokens_unpadded=2, num_tokens_padded=2,
                         write_layout=lay)
    st = w.m.stats()
    assert st["Steps"] == 1 and st["PrefetchDropped"] == 1
    out = w.m.materialize(w.m.save_outputs(h2, {}, num_tokens_unpadded=2, num_tokens_padded=2, write_layout=lay),
                          ["b"])
    assert torch.equal(out.hidden_states["b"], torch.cat([h1, h2]))
    w.m.new_step_starts([], num_scheduled_tokens={"b": 1})
    h3 = torch.randn(1, 2)
    out = w.m.materialize(w.m.save_outputs(h3, {}, num_tokens_unpadded=1, num_tokens_padded=1,
                                           write_layout=layout(("b", slots_of([1, 2, 3], 10, 1)))), ["b"])
    assert torch.equal(out.hidden_states["b"], h3)


def test_failed_save_after_begin_not_retried():
    """The same failure, and the engine goes on: the next step drops the
    failed one (b's hit is registered, its two rows lost) and saves."""
    w = World()
    w.mat(w.step([w.start("a", [1, 2])], {"a": 8}), ["a"])
    w.m.new_step_starts([w.start("b", [1, 2, 3], hit=8)], num_scheduled_tokens={"b": 2})
    lay, h = w.schedule({"b": 2})
    w.m.prepare_read_plans(lay)
    with pytest.raises(U, match="a key's dtype and row shape cannot change"):
        w.m.save_outputs(h.view(np.int16), {}, num_tokens_unpadded=2, num_tokens_padded=2, write_layout=lay)
    w.lost({"b": 2})
    out = w.mat(w.step([], {"b": 1}), ["b"])
    np.testing.assert_array_equal(out.hidden_states["b"], w.want("b", 1, start=10))
    assert w.m.stats()["HitRequests"] == 1 and w.m.stats()["LiveRequests"] == 2


def test_forward_failure_then_retry():
    """prepare_read_plans, the forward fails, abort_prepared_step drops the
    hit reads; the engine runs the forward again and saves: the hit and the
    rows are exact."""
    w = World()
    w.mat(w.step([w.start("a", [1, 2])], {"a": 8}), ["a"])
    w.m.new_step_starts([w.start("b", [1, 2, 3], hit=8)], num_scheduled_tokens={"b": 3})
    lay, h = w.schedule({"b": 3})
    w.m.prepare_read_plans(lay)
    w.m.abort_prepared_step()
    w.m.abort_prepared_step()  # twice: nothing more to drop
    assert w.m.stats()["PrefetchDropped"] == 1
    sid = w.m.save_outputs(h, {}, num_tokens_unpadded=3, num_tokens_padded=3, write_layout=lay)
    w.commit(lay, h, {"b": 3})
    out = w.mat(sid, ["b"])
    np.testing.assert_array_equal(out.hidden_states["b"], np.concatenate([w.want("a", 8), w.want("b", 3, start=8)]))


def test_forward_failure_then_next_step_serves_no_stale_row():
    """x wrote blocks 1 and 2 and finished; y got them, its forward failed
    and the engine went on. vLLM holds y's KV there: a later hit over them
    is refused, never served x's rows."""
    w = World()
    w.mat(w.step([w.start("x", [1, 2])], {"x": 8}), ["x"])
    w.m.new_step_starts([w.finish("x"), w.start("y", [1, 2, 3])], num_scheduled_tokens={"y": 8})
    lay, _ = w.schedule({"y": 8})
    w.m.prepare_read_plans(lay)
    w.m.abort_prepared_step()
    w.lost({"y": 8})
    w.mat(w.step([], {"y": 1}), ["y"])
    np.testing.assert_array_equal(w.got["y"], w.want("y", 1, start=8))
    sid = w.step([w.start("z", [1, 2, 4], hit=8)], {"z": 1})
    with pytest.raises(U, match="hit span for req z key=__hidden_states__ is not readable"):
        w.m.materialize(sid, ["z"])
    assert w.m.stats()["LiveRequests"] == 2


def test_dropped_step_needs_its_slots():
    """A step that computed rows, never saved and never given a layout: the
    next new_step_starts is refused (its slots are unknown) and changes
    nothing; abort_prepared_step(layout) tells them, and the engine goes
    on."""
    w = World()
    w.mat(w.step([w.start("a", [1, 2])], {"a": 4}), ["a"])
    w.m.new_step_starts([w.start("b", [5])], num_scheduled_tokens={"a": 1, "b": 3})
    with pytest.raises(U, match="scheduled 4 tokens and was never saved, and its write layout is unknown"):
        w.m.new_step_starts([w.finish("b")], num_scheduled_tokens={"a": 1})
    assert w.m.stats()["LiveRequests"] == 1
    lay, _ = w.schedule({"a": 1, "b": 3})
    w.m.abort_prepared_step(lay)
    w.lost({"a": 1, "b": 3})
    w.mat(w.step([w.finish("b")], {"a": 1}), ["a"])
    np.testing.assert_array_equal(w.got["a"], np.concatenate([w.want("a", 4), w.want("a", 1, start=5)]))
    assert w.m.stats()["LiveRequests"] == 1


def test_first_step_dropped_before_the_core_exists():
    """The first step's forward fails before any save (no core yet): its
    scheduled arrival goes on from its next position, an unscheduled
    arrival keeps its hit."""
    w = World()
    w.m.new_step_starts([w.start("a", [1, 2]), w.start("b", [1, 3], hit=4)], num_scheduled_tokens={"a": 4})
    w.lost({"a": 4})
    w.mat(w.step([], {"a": 2}), ["a"])
    np.testing.assert_array_equal(w.got["a"], w.want("a", 2, start=4))
    sid = w.step([], {"b": 1})
    with pytest.raises(U, match="hit span for req b key=__hidden_states__ is not readable"):
        w.m.materialize(sid, ["b"])  # b's hit was carried: its prefix, a's block 1, was never saved
    assert w.m.stats()["HitRequests"] == 1


def test_dropped_resume_step():
    """A resume's step is prepared, its forward fails and the engine goes on:
    the resume reaches the core with the dropped step, a's recomputed rows
    (and its row 10) are lost, it goes on at 11, and a hit over its new
    blocks is refused, not served the older tenant's rows."""
    w = World()
    w.mat(w.step([w.start("t", [11, 12])], {"t": 8}), ["t"])  # the older tenant of blocks 11 and 12
    w.mat(w.step([w.finish("t"), w.start("a", [1, 2, 3])], {"a": 8}), ["a"])
    w.mat(w.step([], {"a": 2}), ["a"])
    w.m.new_step_starts([w.resume("a", [11, 12, 13])], num_scheduled_tokens={"a": 11})
    lay, _ = w.schedule({"a": 11})
    w.m.prepare_read_plans(lay)
    w.m.abort_prepared_step()
    w.lost({"a": 11})
    w.mat(w.step([], {"a": 1}), ["a"])
    np.testing.assert_array_equal(w.got["a"], np.concatenate([w.want("a", 10), w.want("a", 1, start=11)]))
    sid = w.step([w.start("c", [11, 12, 14], hit=8)], {"c": 1})
    with pytest.raises(U, match="hit span for req c key=__hidden_states__ is not readable"):
        w.m.materialize(sid, ["c"])
