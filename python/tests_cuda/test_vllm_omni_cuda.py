"""omnicache.vllm_omni with CUDA outputs (a GPU and a CUDA build of the
library: OMNICACHE_LIB=.gpu/libomnicache-cuda.so python3 -m pytest
python/tests_cuda). The manager hands CUDA tensors to the core's CUDA
device, ordered after the stream that produced them, with no synchronous
copy to the host on the engine's thread. Skipped without CUDA."""

import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from vo_world import BS, K, ev, layout, slots_of  # noqa: E402

from omnicache import vllm_omni as vo  # noqa: E402

U = vo.OmniPrefixCacheUnmatchError


def manager(**cfg):
    keys = cfg.pop("keys", None)
    return vo.OmniPrefixCacheManager(vo.PrefixCacheConfig(num_blocks=64, block_size=BS, **cfg), keys=keys)


@pytest.fixture
def no_host_copy(monkeypatch):
    """Fails any synchronous copy of a CUDA tensor to the host (to, cpu,
    numpy) while the fixture is active."""

    def guard(name):
        orig = getattr(torch.Tensor, name)

        def f(self, *a, **kw):
            if self.is_cuda and (name != "to" or "cpu" in str(a[:1]) + str(kw.get("device", ""))):
                raise AssertionError("a synchronous %s() of a CUDA tensor on the engine's thread" % name)
            return orig(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, f)

    for name in ("to", "cpu", "numpy"):
        guard(name)
    yield
    monkeypatch.undo()


def test_cuda_outputs_go_to_the_core_device(no_host_copy):
    """The first save's CUDA tensors make the cache stage through their
    device; the rows are written on a side stream after ~0.1 s of device
    work and saved at once: the save orders after that stream, the engine
    overwrites the buffers as soon as it returns, and materialize gives the
    rows the stream wrote."""
    m = manager()
    blocks = [1, 2, 3]
    m.new_step_starts([ev("a", K.STARTED, 0, blocks)], num_scheduled_tokens={"a": 6})
    lay = layout(("a", slots_of(blocks, 0, 6)))
    src_h, src_mm = torch.randn(6, 8).to(torch.bfloat16), torch.randn(6, 2)
    hidden = torch.zeros(8, 8, dtype=torch.bfloat16, device="cuda")  # 2 padded rows
    mm = torch.zeros(6, 2, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)
        hidden[:6].copy_(src_h.pin_memory().cuda(non_blocking=True))
        mm.copy_(src_mm.pin_memory().cuda(non_blocking=True))
        sid = m.save_outputs(hidden, {"mm": mm}, num_tokens_unpadded=6, num_tokens_padded=8, write_layout=lay)
        hidden.fill_(7)
        mm.fill_(7)
    assert m._core.cuda_device == 0
    out = m.materialize(sid, ["a"])
    assert torch.equal(out.hidden_states["a"], src_h) and torch.equal(out.mm_outputs["mm"]["a"], src_mm)
    assert m.stats()["ClonedBytes"] > 0  # cloned on the device, not copied on the host
    m.shutdown()


def test_cuda_hit_with_read_plans(no_host_copy):
    """A hit over CUDA-saved rows, its reads started by prepare_read_plans
    before the forward: prefix and step rows exact; a decode loop over a
    reused CUDA buffer, each step exact."""
    m = manager()
    a, b = [1, 2, 3], [1, 2, 4, 5]
    h1 = torch.randn(8, 4, device="cuda")
    m.new_step_starts([ev("a", K.STARTED, 0, a)], num_scheduled_tokens={"a": 8})
    m.discard_step(m.save_outputs(h1, {}, num_tokens_unpadded=8, num_tokens_padded=8,
                                  write_layout=layout(("a", slots_of(a, 0, 8)))))
    m.new_step_starts([ev("a", K.FINISHED), ev("b", K.STARTED, 8, b)], num_scheduled_tokens={"b": 2})
    lay = layout(("b", slots_of(b, 8, 2)))
    m.prepare_read_plans(lay)
    h2 = torch.randn(2, 4, device="cuda")
    out = m.materialize(m.save_outputs(h2, {}, num_tokens_unpadded=2, num_tokens_padded=2, write_layout=lay), ["b"])
    want = torch.empty(10, 4)
    want.copy_(torch.cat([h1, h2]))  # the test's own copy (copy_ is not guarded)
    assert torch.equal(out.hidden_states["b"], want)
    buf = torch.empty(4, 4, device="cuda")  # a graph buffer: padded, overwritten every step
    for pos in range(10, 14):
        m.new_step_starts([], num_scheduled_tokens={"b": 1})
        step = torch.randn(1, 4)
        buf[:1].copy_(step.cuda())
        sid = m.save_outputs(buf, {}, num_tokens_unpadded=1, num_tokens_padded=4,
                             write_layout=layout(("b", slots_of(b, pos, 1))))
        buf.fill_(-1)
        assert torch.equal(m.materialize(sid, ["b"]).hidden_states["b"], step)
    m.shutdown()


def test_host_cache_refuses_cuda_outputs():
    """A cache made from host tensors is a host cache: CUDA outputs later
    are refused with a clear error (nothing is copied), and the step saves
    with host tensors."""
    m = manager()
    m.new_step_starts([ev("a", K.STARTED, 0, [1, 2])], num_scheduled_tokens={"a": 4})
    m.discard_step(m.save_outputs(torch.ones(4, 4), {}, num_tokens_unpadded=4, num_tokens_padded=4,
                                  write_layout=layout(("a", slots_of([1, 2], 0, 4)))))
    m.new_step_starts([], num_scheduled_tokens={"a": 1})
    lay = layout(("a", slots_of([1, 2], 4, 1)))
    with pytest.raises(U, match=r"outputs on cuda:0, but the cache stages through the host"):
        m.save_outputs(torch.ones(1, 4, device="cuda"), {}, num_tokens_unpadded=1, num_tokens_padded=1,
                       write_layout=lay)
    h = torch.full((1, 4), 3.0)
    assert torch.equal(m.materialize(m.save_outputs(h, {}, num_tokens_unpadded=1, num_tokens_padded=1,
                                                    write_layout=lay), ["a"]).hidden_states["a"], h)
    m.shutdown()


def test_configured_device_and_host_rows():
    """PrefixCacheConfig.cuda_device with keys= makes the cache on that
    device at once; it takes host rows too; a dropped step (forward failed,
    engine went on) leaves its slots unreadable, not stale."""
    m = manager(cuda_device=0, keys={vo.HIDDEN_KEY: 16})
    assert m._core.cuda_device == 0
    m.new_step_starts([ev("x", K.STARTED, 0, [1, 2])], num_scheduled_tokens={"x": 8})
    m.discard_step(m.save_outputs(torch.ones(8, 4), {}, num_tokens_unpadded=8, num_tokens_padded=8,
                                  write_layout=layout(("x", slots_of([1, 2], 0, 8)))))
    m.new_step_starts([ev("x", K.FINISHED), ev("y", K.STARTED, 0, [1, 2, 3])], num_scheduled_tokens={"y": 8})
    m.prepare_read_plans(layout(("y", slots_of([1, 2, 3], 0, 8))))
    m.abort_prepared_step()
    m.new_step_starts([ev("z", K.STARTED, 8, [1, 2, 4])], num_scheduled_tokens={"z": 1})
    sid = m.save_outputs(torch.ones(1, 4, device="cuda"), {}, num_tokens_unpadded=1, num_tokens_padded=1,
                         write_layout=layout(("z", slots_of([1, 2, 4], 8, 1))))
    with pytest.raises(U, match="hit span for req z key=__hidden_states__ is not readable"):
        m.materialize(sid, ["z"])
    m.shutdown()
