import numpy as np
import pytest

from conftest import torch_or_fail
from omnicache import vllm_omni as vo
from omnicache.vllm_omni import PrefixCacheEventKind as K

BS = 4


def ev(rid, kind, hit_end=0, blocks=None):
    return vo.PrefixCacheRequestEvent(rid, kind, hit_end=hit_end, block_ids=(tuple(blocks),) if blocks else ())


def layout(*writes):
    ws, row = [], 0
    for rid, slots in writes:
        ws.append(vo.PrefixCacheWrite(rid, row, row + len(slots), tuple(slots)))
        row += len(slots)
    return vo.PrefixCacheWriteLayout(tuple(ws), row)


def slots_of(blocks, start, n):
    return [blocks[p // BS] * BS + p % BS for p in range(start, start + n)]


def test_config_defaults_and_from_vllm_config():
    c = vo.PrefixCacheConfig(num_blocks=8, block_size=4)
    assert (c.gpu_staging_bytes, c.staging_depth, c.staging_capacity_tokens, c.staging_claim_timeout_s,
            c.copy_chunk_bytes) == (512 << 20, 4, 1024, 30.0, 16 << 20)

    class S:
        max_num_batched_tokens = 8192

    class M:
        max_model_len = 4096

    assert vo.PrefixCacheConfig.from_vllm_config(num_blocks=1, block_size=4, scheduler_config=S()).staging_capacity_tokens == 8192
    assert vo.PrefixCacheConfig.from_vllm_config(num_blocks=1, block_size=4, model_config=M()).staging_capacity_tokens == 4096
    assert vo.PrefixCacheConfig.from_vllm_config(num_blocks=1, block_size=4).staging_capacity_tokens == 1024
    with pytest.raises(ValueError):
        vo.ModelCachePolicy(needs_full_hidden_states=True, mm_outputs_written_in_sample=True)
    assert vo.ModelCachePolicy().hidden_key == vo.HIDDEN_KEY
    assert issubclass(vo.OmniPrefixCacheStagingTimeoutError, vo.OmniPrefixCacheUnmatchError)
    assert issubclass(vo.OmniPrefixCacheUnmatchError, RuntimeError)


def test_engine_loop_hit_gives_full_prompt_rows():
    torch = torch_or_fail()
    m = vo.OmniPrefixCacheManager(vo.PrefixCacheConfig(num_blocks=32, block_size=BS))
    a_blocks = [3, 4, 9]
    # step 1: "a" prefills 8 tokens (2 padded rows)
    m.new_step_starts(vo.PrefixCacheStep((ev("a", K.STARTED, 0, a_blocks),), (("a", 8),)))
    h1 = torch.randn(10, 4).to(torch.bfloat16)
    codes1 = torch.arange(10 * 2, dtype=torch.float32).reshape(10, 2)
    s1 = m.save_outputs(h1, {"codes": codes1, "meta": "not a tensor"}, num_tokens_unpadded=8, num_tokens_padded=10,
                        write_layout=layout(("a", slots_of(a_blocks, 0, 8))))
    out = m.materialize(s1, ["a"])
    assert torch.equal(out.hidden_states["a"], h1[:8])
    assert torch.equal(out.mm_outputs["codes"]["a"], codes1[:8])
    # step 2: "a" decodes one token (block 9 from the write's slot)
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
    with pytest.raises(vo.OmniPrefixCacheUnmatchError, match="already consumed"):
        m.materialize(s3, ["b"])
    with pytest.raises(vo.OmniPrefixCacheUnmatchError, match="already consumed"):
        m.discard_step(s3)
    m.shutdown()


def test_numpy_outputs_without_layout_and_optional_keys():
    m = vo.OmniPrefixCacheManager(vo.PrefixCacheConfig(num_blocks=32, block_size=BS))
    m.new_step_starts([ev("x", K.STARTED, 0, [1, 2]), ev("y", K.STARTED, 0, [5])],
                      num_scheduled_tokens={"x": 5, "y": 2})
    h = np.arange(7 * 3, dtype=np.float32).reshape(7, 3)
    s = m.save_outputs(h, {"aux": np.ones((7, 1), np.int64)}, num_tokens_unpadded=7, num_tokens_padded=7)
    out = m.materialize(s, ["y", "x"])
    np.testing.assert_array_equal(out.hidden_states["y"], h[5:])
    np.testing.assert_array_equal(out.hidden_states["x"], h[:5])
    # next step omits "aux": its rows read as zeros
    m.new_step_starts([], num_scheduled_tokens={"x": 1})
    s = m.save_outputs(np.ones((1, 3), np.float32), {}, num_tokens_unpadded=1, num_tokens_padded=1)
    out = m.materialize(s, ["x"])
    assert out.mm_outputs["aux"]["x"].tolist() == [[0]]
    with pytest.warns(UserWarning, match="first appeared after"):
        m.new_step_starts([], num_scheduled_tokens={"y": 1})
        m.discard_step(m.save_outputs(np.ones((1, 3), np.float32), {"late": np.ones((1, 2))},
                                      num_tokens_unpadded=1, num_tokens_padded=1))
    m.shutdown()


def test_upstream_errors():
    m = vo.OmniPrefixCacheManager(vo.PrefixCacheConfig(num_blocks=32, block_size=BS, staging_depth=1,
                                                       staging_claim_timeout_s=0.05, staging_capacity_tokens=16),
                                  keys={vo.HIDDEN_KEY: 8})
    with pytest.raises(vo.OmniPrefixCacheUnmatchError, match="without new_step_starts"):
        m.save_outputs(np.ones((1, 2), np.float32), {}, num_tokens_unpadded=1, num_tokens_padded=1)
    # a hit over rows never written: unmatch, never garbage
    m.new_step_starts([ev("a", K.STARTED, 4, [7, 8])], num_scheduled_tokens={"a": 1})
    s = m.save_outputs(np.ones((1, 2), np.float32), {}, num_tokens_unpadded=1, num_tokens_padded=1)
    with pytest.raises(vo.OmniPrefixCacheUnmatchError, match="absent rows") as ei:
        m.materialize(s, ["a"])
    assert ei.value.__cause__ is not None
    # the staging page of an unconsumed step: a staging timeout
    m.new_step_starts([], num_scheduled_tokens={"a": 1})
    s = m.save_outputs(np.ones((1, 2), np.float32), {}, num_tokens_unpadded=1, num_tokens_padded=1)
    m.new_step_starts([ev("c", K.STARTED, 0, [20])], num_scheduled_tokens={"c": 2})  # not a decode step
    with pytest.raises(vo.OmniPrefixCacheStagingTimeoutError) as ei:
        m.save_outputs(np.ones((2, 2), np.float32), {}, num_tokens_unpadded=2, num_tokens_padded=2)
    assert ei.value.unconsumed == (s,)
    m.discard_step(s)
    # a request not saved in the step (the failed save's step starts again)
    m.new_step_starts([ev("c", K.STARTED, 0, [20])], num_scheduled_tokens={"c": 2})
    import time
    for _ in range(100):
        try:
            s = m.save_outputs(np.ones((2, 2), np.float32), {}, num_tokens_unpadded=2, num_tokens_padded=2)
            break
        except vo.OmniPrefixCacheStagingTimeoutError:
            time.sleep(0.01)  # the page comes back once the discarded step's write landed
    with pytest.raises(vo.OmniPrefixCacheUnmatchError, match="not saved in step"):
        m.materialize(s, ["zz"])
    # a step larger than a staging page
    m.new_step_starts([ev("big", K.STARTED, 0, list(range(10, 15)))], num_scheduled_tokens={"big": 20})
    with pytest.raises(vo.OmniPrefixCacheUnmatchError, match="staging page"):
        m.save_outputs(np.ones((20, 2), np.float32), {}, num_tokens_unpadded=20, num_tokens_padded=20)
    m.shutdown()
