import numpy as np
import pytest
import torch

import omnicache as oc

BS = 4


def cache(**kw):
    return oc.Cache([oc.Key("hidden", 16), oc.Key("mm", 8, optional=True)], num_blocks=64, block_size=BS,
                    cuda_device=0, **kw)


def test_cuda_rows_ordered_after_the_producer_stream():
    """The engine writes its outputs on its own stream after a long kernel
    and saves at once: the cache's clone waits for the event save records,
    and the engine may overwrite the tensor as soon as save returns."""
    assert torch.cuda.is_available()
    c = cache()
    table = torch.arange(16, dtype=torch.int32).reshape(2, 8)
    s = torch.cuda.Stream()
    hidden = torch.zeros(6, 8, dtype=torch.bfloat16, device="cuda")
    mm = torch.zeros(6, 2, dtype=torch.float32, device="cuda")
    src_h = torch.randn(6, 8).to(torch.bfloat16)
    src_mm = torch.randn(6, 2)
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of device time before the rows are written
        hidden.copy_(src_h.cuda(non_blocking=True))
        mm.copy_(src_mm.cuda(non_blocking=True))
        c.begin(ids=[1, 2], rows=[0, 1], start=[0, 0], count=[4, 2], table=table, arrivals=[1, 2])
        sid = c.save({"hidden": hidden, "mm": mm})  # event recorded on s, the current stream
        hidden.fill_(7)  # the clone is done: overwriting is safe
        mm.fill_(7)
    r = c.materialize(sid)
    got = torch.from_numpy(r.keys["hidden"].copy()).view(torch.bfloat16).reshape(6, 8)
    assert torch.equal(got, src_h)
    assert np.array_equal(r.keys["mm"].view(np.float32).reshape(6, 2), src_mm.numpy())
    # a hit over request 1's first block, read back from the mirror
    c.begin(ids=[3], rows=[0], start=[4], count=[1], table=table, arrivals=[3], hit_tokens=[4], hit_blocks=[0],
            finished=[1, 2])
    h3 = torch.randn(1, 8).to(torch.bfloat16).cuda()
    sid = c.save({"hidden": h3, "mm": None})
    r = c.materialize(sid)
    got = torch.from_numpy(r.rows(0, "hidden").copy()).view(torch.bfloat16)
    assert torch.equal(got, torch.cat([src_h[:4], h3.cpu()]))
    assert not r.rows(0, "mm")[4:].any()
    st = c.stats()
    assert st["HitRequests"] == 1 and st["ClonedBytes"] > 0
    c.close()


def test_decode_steps_on_cuda():
    c = cache()
    n = 3
    table = np.arange(n * 8, dtype=np.int32).reshape(n, 8)
    ids = np.array([10, 11, 12], np.int64)
    start = np.zeros(n, np.int32)
    plan = oc.Plan(ids=ids, rows=np.arange(n, dtype=np.int32), start=start, count=np.ones(n, np.int32),
                   table=table, arrivals=ids.copy())
    out = torch.empty(n, 4, dtype=torch.float32, device="cuda")
    outs = oc.Outputs(c, {"hidden": out, "mm": None}, tokens=n)
    for step in range(20):
        c.begin(plan)
        want = torch.randn(n, 4)
        out.copy_(want.cuda())
        sid = c.save(outs)
        r = c.materialize(sid)
        assert np.array_equal(r.keys["hidden"].view(np.float32).reshape(n, 4), want.numpy())
        if step == 0:
            plan.clear_events()
        start += 1
    c.sync()
    assert c.stats()["BufferedSteps"] > 0
    c.close()


def test_cuda_refusals():
    c = cache()
    c.begin(ids=[1], rows=[0], start=[0], count=[2], table=[[0, 1]], arrivals=[1])
    with pytest.raises(ValueError, match="not contiguous"):
        c.save([torch.zeros(8, 2, device="cuda").t(), None], tokens=2)
    h = oc.Cache([oc.Key("hidden", 16)], num_blocks=8, block_size=BS)
    h.begin(ids=[1], rows=[0], start=[0], count=[2], table=[[0, 1]], arrivals=[1])
    with pytest.raises(TypeError, match="cache on the host device"):
        h.save([torch.zeros(2, 4, device="cuda")], tokens=2)
    c.close()
    h.close()


def test_no_such_device():
    with pytest.raises(oc.NoDeviceError, match="device 4096 requested"):
        oc.Cache([oc.Key("hidden", 16)], num_blocks=8, block_size=BS, cuda_device=4096)


def test_accepted_rows_on_cuda():
    """Speculative decoding with CUDA rows: only the accepted rows are
    delivered and written; a hit over them serves exactly those rows."""
    c = cache()
    table = np.arange(16, dtype=np.int32).reshape(2, 8)
    h1, h2, h3 = torch.randn(4, 4), torch.randn(3, 4), torch.randn(2, 4)

    def rows(r):
        return torch.from_numpy(r.keys["hidden"].copy()).view(torch.float32)

    c.begin(ids=[1], rows=[0], start=[0], count=[4], table=table, arrivals=[1])
    r = c.materialize(c.save({"hidden": h1.cuda(), "mm": None}))
    assert torch.equal(rows(r), h1)
    c.begin(ids=[1], rows=[0], start=[4], count=[3], table=table)  # one token and two drafts
    r = c.materialize(c.save({"hidden": h2.cuda(), "mm": None}, accepted=[2]))
    assert list(r.tokens) == [2] and list(r.from_) == [4] and torch.equal(rows(r), h2[:2])
    c.begin(ids=[1], rows=[0], start=[6], count=[2], table=table)
    r = c.materialize(c.save({"hidden": h3.cuda(), "mm": None}))
    assert list(r.from_) == [6] and torch.equal(rows(r), h3)
    h4 = torch.randn(1, 4)
    c.begin(ids=[2], rows=[1], start=[8], count=[1], table=table, arrivals=[2], hit_tokens=[8], hit_blocks=[0, 1])
    r = c.materialize(c.save({"hidden": h4.cuda(), "mm": None}))
    assert list(r.prefix) == [8] and list(r.from_) == [0]
    assert torch.equal(rows(r), torch.cat([h1, h2[:2], h3, h4]))
    c.close()


def test_device_result_buffers():
    """begin_into with CUDA tensors: the hit rows are copied up during the
    forward, save puts the step's rows there, materialize into the same
    tensors returns them in place; into other CUDA tensors every row is
    copied up; with a draft rejected the rows after it move down."""
    c = cache()
    table = np.arange(32, dtype=np.int32).reshape(2, 16)
    h1 = torch.randn(8, 4, device="cuda")
    s = torch.cuda.Stream()
    c.begin(ids=[1], rows=[0], start=[0], count=[8], table=table, arrivals=[1])
    c.discard(c.save({"hidden": h1, "mm": None}))
    for other in (False, True):
        rid = 2 + other
        plan = oc.Plan(ids=[rid], rows=[1], start=[8], count=[3], table=table, arrivals=[rid], hit_tokens=[8],
                       hit_blocks=[0, 1], finished=[rid - 1] if other else None)
        into = [torch.full((11, 4), 5.0, device="cuda"), torch.full((11, 2), 5.0, device="cuda")]
        c.begin_into(plan, into)
        h = torch.randn(3, 4, device="cuda")
        with torch.cuda.stream(s):
            torch.cuda._sleep(50_000_000)  # the forward, still running when save is called
            out = h * 1.0
            sid = c.save({"hidden": out, "mm": None})
            out.fill_(9)  # save returned: the rows were copied
        bufs = [torch.empty_like(b) for b in into] if other else into
        r = c.materialize(sid, alloc=lambda k, rows: bufs[c.keys.index(k)])  # whole: 11 rows
        got = r.split("hidden")[0].view(torch.float32)
        assert got.data_ptr() == bufs[0].data_ptr()
        assert torch.equal(got, torch.cat([h1, h]))
        assert not r.split("mm")[0].any(), "the omitted key's rows are zeros"
        assert list(r.prefix) == [8]
    c.begin(ids=[1, 3], rows=[0, 1], start=[8, 11], count=[3, 2], table=table)
    d = [torch.zeros(5, 4, device="cuda"), torch.zeros(5, 2, device="cuda")]
    h = torch.randn(5, 4, device="cuda")
    r = c.materialize(c.save({"hidden": h, "mm": None}, accepted=[1, 2]),
                      alloc=lambda k, rows: d[c.keys.index(k)][:rows])
    assert list(r.tokens) == [1, 2]
    assert torch.equal(r.keys["hidden"].view(torch.float32)[:3], torch.cat([h[:1], h[3:]]))
    with pytest.raises(ValueError, match="whole step"):
        c.begin(ids=[1], rows=[0], start=[9], count=[1], table=table)
        c.materialize(c.save({"hidden": h[:1], "mm": None}), reqs=[1], alloc=lambda k, rows: d[c.keys.index(k)][:rows])
    c.close()


def test_materialize_into_the_last_begun_cuda_tensors():
    """materialize(step) of the step begun last with CUDA tensors returns
    its rows in them; an earlier step (its tensors not the last) is
    materialized as without (host rows), its tensors left alone."""
    c = cache()
    table = np.arange(32, dtype=np.int32).reshape(2, 16)
    t1 = [torch.zeros(4, 4, device="cuda"), torch.zeros(4, 2, device="cuda")]
    h1 = torch.randn(4, 4, device="cuda")
    c.begin_into(oc.Plan(ids=[1], rows=[0], start=[0], count=[4], table=table, arrivals=[1]), t1)
    r = c.materialize(c.save({"hidden": h1, "mm": None}))
    assert r.keys["hidden"] is t1[0] and torch.equal(t1[0], h1)
    t2 = [torch.zeros(2, 4, device="cuda"), torch.zeros(2, 2, device="cuda")]
    t3 = [torch.zeros(3, 4, device="cuda"), torch.zeros(3, 2, device="cuda")]
    h2, h3 = torch.randn(2, 4, device="cuda"), torch.randn(3, 4, device="cuda")
    c.begin_into(oc.Plan(ids=[1], rows=[0], start=[4], count=[2], table=table), t2)
    s2 = c.save({"hidden": h2, "mm": None})
    c.begin_into(oc.Plan(ids=[1], rows=[0], start=[6], count=[3], table=table), t3)
    s3 = c.save({"hidden": h3, "mm": None})
    r2 = c.materialize(s2)
    assert isinstance(r2.keys["hidden"], np.ndarray)
    assert np.array_equal(r2.keys["hidden"].view(np.float32).reshape(2, 4), h2.cpu().numpy())
    r3 = c.materialize(s3)
    assert r3.keys["hidden"] is t3[0] and torch.equal(t3[0], h3)
    with pytest.raises(oc.UnknownStepError):
        c.materialize(s3)
    c.close()
