"""omnicache.vllm_omni: the upstream manager's names, an engine loop with a
hit, and every failure of upstream's list raised at its call, with its
class and its words, changing nothing."""

import numpy as np
import pytest

from conftest import torch_or_fail
from omnicache import vllm_omni as vo
from omnicache.errors import WriteFailedError
from vo_world import BS, K, World, ev, layout, rows, slots_of

U = vo.OmniPrefixCacheUnmatchError


def test_config_defaults_and_from_vllm_config():
    c = vo.PrefixCacheConfig(num_blocks=8, block_size=4)
    assert (c.gpu_staging_bytes, c.staging_depth, c.staging_capacity_tokens, c.staging_claim_timeout_s,
            c.copy_chunk_bytes, c.cuda_device) == (512 << 20, 4, 1024, 30.0, 16 << 20, None)

    class S:
        max_num_batched_tokens = 8192

    class M:
        max_model_len = 4096

    assert vo.PrefixCacheConfig.from_vllm_config(num_blocks=1, block_size=4, scheduler_config=S()).staging_capacity_tokens == 8192
    assert vo.PrefixCacheConfig.from_vllm_config(num_blocks=1, block_size=4, model_config=M()).staging_capacity_tokens == 4096
    assert vo.PrefixCacheConfig.from_vllm_config(num_blocks=1, block_size=4).staging_capacity_tokens == 1024
    assert vo.PrefixCacheConfig.from_vllm_config(num_blocks=1, block_size=4, cuda_device=1).cuda_device == 1
    with pytest.raises(ValueError):
        vo.ModelCachePolicy(needs_full_hidden_states=True, mm_outputs_written_in_sample=True)
    assert vo.ModelCachePolicy().hidden_key == vo.HIDDEN_KEY
    assert issubclass(vo.OmniPrefixCacheStagingTimeoutError, U)
    assert issubclass(U, RuntimeError)


def test_engine_loop_hit_gives_full_prompt_rows():
    torch = torch_or_fail()
    m = vo.OmniPrefixCacheManager(vo.PrefixCacheConfig(num_blocks=32, block_size=BS))
    a_blocks = [3, 4, 9]
    # step 1: "a" prefills 8 tokens (2 padded rows)
    m.new_step_starts(vo.PrefixCacheStep((ev("a", K.STARTED, 0, a_blocks),), (("a", 8),)))
    h1 = torch.randn(10, 4).to(torch.bfloat16)
    codes1 = torch.arange(10 * 2, dtype=torch.float32).reshape(10, 2)
    s1 = m.save_outputs(h1, {"codes": codes1, "meta": "not a tensor", "ref": torch.zeros(3, 2)},
                        num_tokens_unpadded=8, num_tokens_padded=10, write_layout=layout(("a", slots_of(a_blocks, 0, 8))))
    out = m.materialize(s1, ["a"])
    assert torch.equal(out.hidden_states["a"], h1[:8])
    assert torch.equal(out.mm_outputs["codes"]["a"], codes1[:8])
    assert set(out.mm_outputs) == {"codes"}  # neither a non-tensor nor a tensor of other rows is cached
    # step 2: "a" decodes one token
    m.new_step_starts([], num_scheduled_tokens={"a": 1})
    h2 = torch.randn(1, 4).to(torch.bfloat16)
    s2 = m.save_outputs(h2, {"codes": torch.zeros(1, 2)}, num_tokens_unpadded=1, num_tokens_padded=1,
                        write_layout=layout(("a", slots_of(a_blocks, 8, 1))))
    m.discard_step(s2)
    # step 3: "a" finishes; "b" arrives hitting a's first two blocks, computes 3 more
    b_blocks = [3, 4, 12]
    m.new_step_starts([ev("a", K.FINISHED), ev("b", K.STARTED, 8, b_blocks)], num_scheduled_tokens={"b": 3})
    h3 = torch.randn(3, 4).to(torch.bfloat16)
    codes3 = torch.ones(3, 2)
    s3 = m.save_outputs(h3, {"codes": codes3}, num_tokens_unpadded=3, num_tokens_padded=3,
                        write_layout=layout(("b", slots_of(b_blocks, 8, 3))))
    out = m.materialize(s3, ["b"])
    assert torch.equal(out.hidden_states["b"], torch.cat([h1[:8], h3]))
    assert torch.equal(out.mm_outputs["codes"]["b"], torch.cat([codes1[:8], codes3]))
    assert m.stats()["HitRequests"] == 1
    m.shutdown()


def test_numpy_outputs_and_optional_keys():
    m = vo.OmniPrefixCacheManager(vo.PrefixCacheConfig(num_blocks=32, block_size=BS))
    m.new_step_starts([ev("x", K.STARTED, 0, [1, 2]), ev("y", K.STARTED, 0, [5])],
                      num_scheduled_tokens={"x": 5, "y": 2})
    h = np.arange(7 * 3, dtype=np.float32).reshape(7, 3)
    lay = layout(("x", slots_of([1, 2], 0, 5)), ("y", slots_of([5], 0, 2)))
    s = m.save_outputs(h, {"aux": np.ones((7, 1), np.int64)}, num_tokens_unpadded=7, num_tokens_padded=7,
                       write_layout=lay)
    out = m.materialize(s, ["y", "x"])
    np.testing.assert_array_equal(out.hidden_states["y"], h[5:])
    np.testing.assert_array_equal(out.hidden_states["x"], h[:5])
    # next step omits "aux": its rows read as zeros
    m.new_step_starts([], num_scheduled_tokens={"x": 1})
    s = m.save_outputs(np.ones((1, 3), np.float32), {}, num_tokens_unpadded=1, num_tokens_padded=1,
                       write_layout=layout(("x", slots_of([1, 2], 5, 1))))
    out = m.materialize(s, ["x"])
    assert out.mm_outputs["aux"]["x"].tolist() == [[0]]
    with pytest.warns(UserWarning, match="first appeared after"):
        m.new_step_starts([], num_scheduled_tokens={"y": 1})
        m.discard_step(m.save_outputs(np.ones((1, 3), np.float32), {"late": np.ones((1, 2))}, num_tokens_unpadded=1,
                                      num_tokens_padded=1, write_layout=layout(("y", slots_of([5], 2, 1)))))
    m.shutdown()


def test_registration_failures_change_nothing():
    """A hit without block ids, or not block aligned, is refused by
    new_step_starts (not at the save) with upstream's words; the refused
    call registers none of its events: not the finish, not the other
    arrival."""
    w = World()
    w.mat(w.step([w.start("a", [1, 2])], {"a": 4}), ["a"])
    for bad, msg in ((ev("b", K.STARTED, 8), r"prefix hit for req b \(8 tokens\) carries no block_ids"),
                     (ev("b", K.STARTED, 8, [3]), r"prefix hit for req b \(8 tokens\) carries 1 block_ids, needs 2"),
                     (ev("b", K.STARTED, 6, [1, 2]), r"prefix hit not block aligned \(req=b, hit_upto=6, block_size=4\)"),
                     (ev("b", K.STARTED, 4, [64]), r"block ids \[64\] outside \[0, 64\)")):
        with pytest.raises(U, match=msg):
            w.m.new_step_starts([w.finish("a"), ev("c", K.STARTED, 0, [7]), bad], num_scheduled_tokens={"c": 4})
    with pytest.raises(ValueError, match="unknown kind 'preempted'"):
        w.m.new_step_starts([vo.PrefixCacheRequestEvent("a", "preempted")])
    with pytest.raises(ValueError, match=r"num_scheduled_tokens\['a'\] is -1"):
        w.m.new_step_starts([], num_scheduled_tokens={"a": -1})
    with pytest.raises(U, match="req a: two events in one step"):
        w.m.new_step_starts([ev("a", K.EXTENDED, 4), ev("a", K.RESUMED)])
    # a is still live and decodes; c was never registered
    w.mat(w.step([], {"a": 1}), ["a"])
    np.testing.assert_array_equal(w.got["a"], w.want("a", 5))
    w.m.new_step_starts([], num_scheduled_tokens={"c": 4})
    with pytest.raises(U, match="req c has rows but is not live"):
        w.m.save_outputs(rows(9, 0, 4), {}, num_tokens_unpadded=4, num_tokens_padded=4,
                         write_layout=layout(("c", slots_of([7], 0, 4))))
    assert w.m.stats()["LiveRequests"] == 1


def test_save_failures_at_the_save():
    """save_outputs' refusals, each with upstream's class and words; after
    each the same step saves."""
    w = World(staging_capacity_tokens=16)
    w.m.new_step_starts([w.start("a", [1, 2, 3, 4, 5])], num_scheduled_tokens={"a": 8})
    lay, h = w.schedule({"a": 8})
    with pytest.raises(ValueError, match="save_outputs requires an adapter-produced write_layout"):
        w.m.save_outputs(h, {}, num_tokens_unpadded=8, num_tokens_padded=8)
    with pytest.raises(U, match="slot mapping covers 8 of 9 scheduled tokens; CPU-side slot derivation out of sync "
                                "with the batch"):
        w.m.save_outputs(np.concatenate([h, h[:1]]), {}, num_tokens_unpadded=9, num_tokens_padded=9, write_layout=lay)
    with pytest.raises(U, match="hidden_states has 7 rows, need 8"):
        w.m.save_outputs(h[:7], {}, num_tokens_unpadded=8, num_tokens_padded=8, write_layout=lay)
    with pytest.raises(U, match="step has 20 tokens; staging capacity is 16"):
        w.m.save_outputs(np.zeros((20, 8), np.uint8), {}, num_tokens_unpadded=20, num_tokens_padded=20,
                         write_layout=layout(("a", slots_of(w.blocks["a"], 0, 20))))
    with pytest.raises(ValueError, match="write_layout is missing its CPU slot snapshot"):
        w.m.save_outputs(h, {}, num_tokens_unpadded=8, num_tokens_padded=8,
                         write_layout=vo.PrefixCacheWriteLayout((vo.PrefixCacheWrite("a", 0, 8),), 8))
    with pytest.raises(U, match="write layout gives req a 4 rows, num_scheduled_tokens 8"):
        w.m.save_outputs(h[:4], {}, num_tokens_unpadded=4, num_tokens_padded=4,
                         write_layout=layout(("a", slots_of(w.blocks["a"], 0, 4))))
    with pytest.raises(ValueError, match="unpadded <= padded"):
        w.m.save_outputs(h, {}, num_tokens_unpadded=8, num_tokens_padded=7, write_layout=lay)
    assert w.m.stats() == {}  # nothing reached a core (it is created by the first save that succeeds)
    sid = w.m.save_outputs(h, {}, num_tokens_unpadded=8, num_tokens_padded=8, write_layout=lay)
    w.commit(lay, h, {"a": 8})
    w.mat(sid, ["a"])
    np.testing.assert_array_equal(w.got["a"], w.want("a", 8))
    with pytest.raises(U, match="save_outputs without new_step_starts"):
        w.m.save_outputs(h[:1], {}, num_tokens_unpadded=1, num_tokens_padded=1, write_layout=layout(("a", [20])))


def test_consume_failures():
    """materialize and discard_step of a step never saved or consumed, and
    materialize of a request the step did not save: upstream's words."""
    w = World()
    s1 = w.step([w.start("a", [1, 2])], {"a": 4})
    s2 = w.step([], {"a": 1})
    with pytest.raises(U, match=r"materialize\(step %d\) got req ids outside the save snapshot: \['zz'\]" % s2):
        w.m.materialize(s2, ["a", "zz"])
    for call in (w.m.materialize, w.m.discard_step):
        with pytest.raises(U, match=r"step context %d missing \(have \[%d\]\); already consumed or never saved"
                                    % (s2, s1)):
            call(s2, ["a"]) if call == w.m.materialize else call(s2)
    w.mat(s1, ["a"])
    with pytest.raises(U, match=r"step context 999 missing \(have \[\]\)"):
        w.m.discard_step(999)


def test_hit_not_readable_and_staging_timeout():
    """A hit over rows never written: "hit span ... is not readable", never
    garbage. No free staging page in time: the staging timeout with the
    unconsumed steps, and the same step saves once one is consumed."""
    w = World(staging_depth=1, staging_claim_timeout_s=0.05)
    sid = w.step([w.start("a", [7, 8, 9], hit=4)], {"a": 1})
    with pytest.raises(U, match=r"hit span for req a key=__hidden_states__ is not readable \(.*absent") as ei:
        w.m.materialize(sid, ["a"])
    assert ei.value.__cause__ is not None
    held = w.step([], {"a": 1})
    w.m.new_step_starts([w.start("c", [20])], num_scheduled_tokens={"c": 2})
    lay, h = w.schedule({"c": 2})
    with pytest.raises(vo.OmniPrefixCacheStagingTimeoutError,
                       match=r"; unconsumed step contexts \(ids=\[%d\]\) or a stuck write" % held) as ei:
        w.m.save_outputs(h, {}, num_tokens_unpadded=2, num_tokens_padded=2, write_layout=lay)
    assert ei.value.unconsumed == (held,)
    w.m.discard_step(held)
    for _ in range(200):  # the page comes back once the discarded step's write landed
        try:
            sid = w.m.save_outputs(h, {}, num_tokens_unpadded=2, num_tokens_padded=2, write_layout=lay)
            break
        except vo.OmniPrefixCacheStagingTimeoutError:
            pass
    w.commit(lay, h, {"c": 2})
    w.mat(sid, ["c"])
    np.testing.assert_array_equal(w.got["c"], w.want("c", 2))


def test_failed_write_is_sticky(monkeypatch):
    """A failed write (the core's ErrWriteFailed) is raised by the call that
    meets it and by every later call, as upstream's manager does."""
    w = World()
    sid = w.step([w.start("a", [1, 2])], {"a": 4})
    core = w.m._core

    def failed(*a, **kw):
        raise WriteFailedError("omnicache: write failed: device lost", 16)

    monkeypatch.setattr(core, "save", failed)
    w.m.new_step_starts([], num_scheduled_tokens={"a": 1})
    lay, h = w.schedule({"a": 1})
    with pytest.raises(U, match="prefix cache write failed.*device lost"):
        w.m.save_outputs(h, {}, num_tokens_unpadded=1, num_tokens_padded=1, write_layout=lay)
    for call in (lambda: w.m.new_step_starts([]), lambda: w.m.materialize(sid, ["a"]), lambda: w.m.discard_step(sid),
                 lambda: w.m.save_outputs(h, {}, num_tokens_unpadded=1, num_tokens_padded=1, write_layout=lay),
                 lambda: w.m.prepare_read_plans(lay)):
        with pytest.raises(U, match="prefix cache write failed.*device lost"):
            call()
