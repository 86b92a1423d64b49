"""omnicache.vllm_omni: a preempted request that resumes, against the row
oracle. RESUMED tells the core the request was preempted and resumed,
schedules it from the event's hit_end, and serves the resume's hit as a
hit: its rows land at the slots the layout names, a later hit over them
gets exactly them, and the request is delivered each of its rows once."""

import numpy as np
import pytest

from vo_world import BS, K, World, ev, layout, rows, slots_of
from omnicache import vllm_omni as vo


def run_ten(w, blocks):
    """Request a computes 10 tokens (8 of prefill, 2 decodes), each step
    materialized."""
    w.mat(w.step([w.start("a", blocks)], {"a": 8}), ["a"])
    w.mat(w.step([], {"a": 1}), ["a"])
    w.mat(w.step([], {"a": 1}), ["a"])


def test_resume_without_hit_recomputes_at_the_right_slots():
    """Preempted after 10 tokens, resumed with no hit on new blocks that an
    earlier tenant wrote, recomputing 0..10: the rows land at the layout's
    slots (a later request hitting those blocks gets exactly a's rows
    0..7), and a is delivered 0..10 once."""
    w = World()
    w.mat(w.step([w.start("t", [5, 6])], {"t": 8}), ["t"])  # the earlier tenant of blocks 5 and 6
    run_ten(w, [1, 2, 3])
    w.mat(w.step([w.finish("t"), w.start("b", [8, 9])], {"b": 4}), ["b"])  # a preempted: not scheduled
    sid = w.step([w.resume("a", [5, 6, 7])], {"a": 11, "b": 1})
    out = w.mat(sid, ["a", "b"])
    assert out.hidden_states["a"].tolist() == w.want("a", 1, start=10).tolist()  # only the row it never had
    np.testing.assert_array_equal(w.got["a"], w.want("a", 11))
    out = w.mat(w.step([w.start("c", [5, 6, 10], hit=8)], {"c": 1}), ["c"])
    np.testing.assert_array_equal(out.hidden_states["c"], np.concatenate([w.want("a", 8), w.want("c", 1, start=8)]))
    np.testing.assert_array_equal(out.hidden_states["c"][:8], w.held([5, 6], 8))
    st = w.m.stats()
    assert st["HitRequests"] == 1 and st["LiveRequests"] == 3  # a, b, c


def test_resume_with_hit_delivers_no_row_twice():
    """Resumed with hit_end=4 (its first block still cached), recomputing
    4..10: rows 4..9 are not delivered again, and a hit over the new
    blocks serves the recomputed rows."""
    w = World()
    run_ten(w, [1, 2, 3])
    w.mat(w.step([w.start("b", [8, 9])], {"b": 4}), ["b"])
    out = w.mat(w.step([w.resume("a", [1, 11, 12], hit=4)], {"a": 7, "b": 1}), ["a", "b"])
    assert out.hidden_states["a"].tolist() == w.want("a", 1, start=10).tolist()
    np.testing.assert_array_equal(w.got["a"], w.want("a", 11))
    w.mat(w.step([], {"a": 1}), ["a"])
    np.testing.assert_array_equal(w.got["a"], w.want("a", 12))
    out = w.mat(w.step([w.start("c", [1, 11, 13], hit=8)], {"c": 2}), ["c"])
    np.testing.assert_array_equal(out.hidden_states["c"], np.concatenate([w.want("a", 8), w.want("c", 2, start=8)]))
    assert w.m.stats()["HitRequests"] == 2  # a's resume, then c


def test_resume_with_steps_not_consumed_yet():
    """The steps before the preemption are consumed after the resume's
    step was saved (a step late): consumed in order, a still gets every
    row once."""
    w = World()
    w.mat(w.step([w.start("a", [1, 2, 3])], {"a": 8}), ["a"])
    late = [w.step([], {"a": 1}), w.step([], {"a": 1})]  # positions 8, 9: not consumed yet
    resumed = w.step([w.resume("a", [4, 5, 6])], {"a": 11})
    for sid in late + [resumed]:
        w.mat(sid, ["a"])
    np.testing.assert_array_equal(w.got["a"], w.want("a", 11))


def test_restart_of_a_live_request_is_a_resume():
    """A STARTED (or EXTENDED) event for a live request at a position below
    its own (a runner that resumes through new requests) recomputes as a
    resume: no row twice."""
    w = World()
    run_ten(w, [1, 2, 3])
    w.blocks["a"], w.pos["a"] = [1, 7, 8], 4
    out = w.mat(w.step([ev("a", K.STARTED, 4, [1, 7, 8])], {"a": 7}), ["a"])
    assert out.hidden_states["a"].tolist() == w.want("a", 1, start=10).tolist()
    np.testing.assert_array_equal(w.got["a"], w.want("a", 11))


def test_continuation_moves_to_its_computed_tokens():
    """EXTENDED for a live request at or past its position continues it
    there (streamed input): its next rows are saved from hit_end."""
    w = World()
    w.mat(w.step([w.start("a", [1, 2, 3])], {"a": 4}), ["a"])
    out = w.mat(w.step([ev("a", K.EXTENDED, 4, [1, 2, 3])], {"a": 4}), ["a"])
    np.testing.assert_array_equal(out.hidden_states["a"], w.want("a", 4, start=4))
    np.testing.assert_array_equal(w.got["a"], w.want("a", 8))


def test_positions_out_of_sync_are_refused():
    """A layout whose slots disagree with the request's position (the engine
    resumed a at 2, the event said 0) is refused at save, naming the
    request, and nothing is saved: the step saved with the right layout is
    exact."""
    w = World()
    run_ten(w, [1, 2, 3])
    w.m.new_step_starts([ev("a", K.RESUMED, 0, [4, 5, 6])], num_scheduled_tokens={"a": 9})
    bad = layout(("a", slots_of([4, 5, 6], 2, 9)))
    before = w.m.stats()
    with pytest.raises(vo.OmniPrefixCacheUnmatchError, match=r"req a's row for position 0 has slot 18.*not the engine's"):
        w.m.save_outputs(rows(1, 2, 9), {}, num_tokens_unpadded=9, num_tokens_padded=9, write_layout=bad)
    assert w.m.stats()["Steps"] == before["Steps"]
    good = layout(("a", slots_of([4, 5, 6], 0, 9)))
    w.blocks["a"], w.pos["a"] = [4, 5, 6], 0
    sid = w.m.save_outputs(w.want("a", 9), {}, num_tokens_unpadded=9, num_tokens_padded=9, write_layout=good)
    w.commit(good, w.want("a", 9), {"a": 9})
    assert len(w.mat(sid, ["a"]).hidden_states["a"]) == 0  # rows it had
    w.mat(w.step([], {"a": 2}), ["a"])
    np.testing.assert_array_equal(w.got["a"], w.want("a", 11))


def test_resume_hit_without_blocks_refused_at_registration():
    w = World()
    run_ten(w, [1, 2, 3])
    for e, msg in ((ev("a", K.RESUMED, 4), r"prefix hit for req a \(4 tokens\) carries no block_ids"),
                   (ev("a", K.RESUMED, 6, [1, 2]), r"prefix hit not block aligned \(req=a, hit_upto=6, block_size=4\)")):
        with pytest.raises(vo.OmniPrefixCacheUnmatchError, match=msg):
            w.m.new_step_starts([e], num_scheduled_tokens={"a": 11})
    # nothing registered: a decodes on from 10
    w.mat(w.step([], {"a": 1}), ["a"])
    np.testing.assert_array_equal(w.got["a"], w.want("a", 11))
    assert BS == 4


@pytest.mark.parametrize("hit", [0, 4])
def test_resume_begun_aborted_then_saved(hit):
    """The resume's step is begun by prepare_read_plans, its forward fails
    (abort_prepared_step) and runs again: the core's Begin of the
    preemption and resume is undone and done again, and a is still
    delivered 0..10 once, b its hit exactly."""
    w = World()
    run_ten(w, [1, 2, 3])
    w.mat(w.step([w.start("b", [8, 9])], {"b": 4}), ["b"])
    blocks = [1, 11, 12] if hit else [11, 12, 13]
    w.m.new_step_starts([w.resume("a", blocks, hit=hit)], num_scheduled_tokens={"a": 11 - hit})
    lay, h = w.schedule({"a": 11 - hit})
    w.m.prepare_read_plans(lay)
    w.m.abort_prepared_step()
    w.m.prepare_read_plans(lay)
    sid = w.m.save_outputs(h, {}, num_tokens_unpadded=11 - hit, num_tokens_padded=11 - hit, write_layout=lay)
    w.commit(lay, h, {"a": 11 - hit})
    w.mat(sid, ["a"])
    np.testing.assert_array_equal(w.got["a"], w.want("a", 11))
    out = w.mat(w.step([w.start("c", blocks[:2] + [14], hit=8)], {"c": 1}), ["c"])
    np.testing.assert_array_equal(out.hidden_states["c"], np.concatenate([w.want("a", 8), w.want("c", 1, start=8)]))
