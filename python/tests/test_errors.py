"""Every error code reaches Python as its exception class: triggered
through the API where this build can reach it, else by the mapping."""

import ctypes
import os

import numpy as np
import pytest

import omnicache as oc
from omnicache import _ffi

BS = 4
KEYS = [oc.Key("hidden", 16), oc.Key("mm", 8, optional=True)]
TABLE = np.arange(32, dtype=np.int32).reshape(4, 8)


def cache(**kw):
    kw.setdefault("num_blocks", 64)
    kw.setdefault("block_size", BS)
    return oc.Cache(kw.pop("keys", KEYS), **kw)


def step(c, ids=(1,), count=(4,), start=None, arrivals=None, hit_tokens=None, hit_blocks=None, finished=None,
         rows=None, h=None):
    ids = list(ids)
    plan = oc.Plan(ids=ids, rows=rows if rows is not None else list(range(len(ids))),
                   start=start if start is not None else [0] * len(ids), count=list(count), table=TABLE,
                   arrivals=ids if arrivals is None else arrivals, hit_tokens=hit_tokens, hit_blocks=hit_blocks,
                   finished=finished)
    c.begin(plan)
    n = sum(count)
    return c.save({"hidden": np.ones((n, 16), np.uint8) if h is None else h}, tokens=n)


def test_not_triggerable_codes_map():
    # a faulty device (write failure, device timeout), a tier that refuses
    # credentials or was closed, a panic, an unmapped error: not reachable
    # through this build's API; the mapping holds
    for code, cls in [(16, oc.WriteFailedError), (17, oc.DeviceTimeoutError), (20, oc.TierAuthError),
                      (22, oc.TierClosedError), (104, oc.PanicError), (106, oc.InternalError)]:
        assert isinstance(oc.errors.error(code, "x"), cls)


def test_config():
    with pytest.raises(oc.ConfigError, match="blocks"):
        oc.Cache(KEYS, num_blocks=0, block_size=4)
    with pytest.raises(oc.ConfigError):
        oc.Cache([oc.Key("a", 4), oc.Key("a", 4)], num_blocks=4, block_size=4)
    with pytest.raises(ValueError):  # ConfigError is a ValueError too
        oc.Cache(KEYS, num_blocks=4, block_size=0)
    c = cache()
    with pytest.raises(oc.ConfigError, match="without a tier"):
        c.lookup([1, 2])
    c.close()


def test_closed():
    c = cache()
    c.close()
    c.close()  # idempotent
    for call in (c.sync, c.stats, lambda: c.discard(1), lambda: c.materialize(1),
                 lambda: c.begin(ids=[1], rows=[0], start=[0], count=[1], table=TABLE)):
        with pytest.raises(oc.ClosedError):
            call()


def test_sequence():
    c = cache()
    with pytest.raises(oc.SequenceError, match="Save without Begin"):
        c.save({"hidden": np.ones((1, 16), np.uint8)}, tokens=1)
    c.close()


def test_plan():
    c = cache()
    with pytest.raises(oc.PlanError):
        step(c, rows=[9])  # outside the block table
    with pytest.raises(oc.PlanError):
        step(c, ids=(1, 1), count=(1, 1))  # scheduled twice
    c.close()


def test_unaligned_hit_and_hit_blocks():
    c = cache()
    with pytest.raises(oc.UnalignedHitError):
        step(c, start=[3], hit_tokens=[3], hit_blocks=[0])
    with pytest.raises(oc.HitBlocksError):
        step(c, start=[4], hit_tokens=[4])
    c.close()


def test_token_count_and_outputs():
    c = cache()
    c.begin(ids=[1], rows=[0], start=[0], count=[4], table=TABLE, arrivals=[1])
    with pytest.raises(oc.TokenCountError):
        c.save({"hidden": np.ones((4, 16), np.uint8)}, tokens=3)
    c.begin(ids=[1], rows=[0], start=[0], count=[4], table=TABLE, arrivals=[1])  # a failed save undid begin
    with pytest.raises(oc.OutputsError, match="required"):
        c.save({"hidden": None}, tokens=4)
    c.begin(ids=[1], rows=[0], start=[0], count=[4], table=TABLE, arrivals=[1])
    with pytest.raises(oc.OutputsError):
        c.save({"hidden": np.ones((2, 16), np.uint8)}, tokens=4)  # too few rows
    c.close()


def test_outputs_texts_name_the_condition():
    """Each wrong output names its own condition (only a short tensor says
    "too small"), through the package and through the ABI's own checks,
    and every failed save undid its begin: the same plan begins again."""
    c = cache()
    plan = dict(ids=[1], rows=[0], start=[0], count=[4], table=TABLE, arrivals=[1])
    cases = [
        ("accepted count out of range: request 1: 5 tokens accepted of 4", lambda: c.save([np.ones((4, 16), np.uint8), None], accepted=[5])),
        ("2 accepted counts for 1 scheduled requests", lambda: c.save([np.ones((4, 16), np.uint8), None], accepted=[1, 1])),
        ("key \"hidden\" is required", lambda: c.save({"hidden": None}, tokens=4)),
        ("key \"hidden\": tensor too small: 2 rows", lambda: c.save({"hidden": np.ones((2, 16), np.uint8)}, tokens=4)),
    ]
    for text, save in cases:
        c.begin(**plan)
        with pytest.raises(oc.OutputsError) as ei:
            save()
        assert text in str(ei.value)
        assert "too small" not in str(ei.value) or "tensor too small" in text
    # the ABI's own check of the tensor count (the package checks it first)
    c.begin(**plan)
    o = oc.Outputs(c, [np.ones((4, 16), np.uint8), None], tokens=4)
    o._c.ntensors = 1
    with pytest.raises(oc.OutputsError, match="1 tensors for 2 keys") as ei:
        c.save(o)
    assert "too small" not in str(ei.value)
    c.begin(**plan)  # undone by the failed save
    c.discard(c.save([np.ones((4, 16), np.uint8), None]))
    assert c.stats()["Steps"] == 1
    c.close()


def test_step_too_large():
    c = cache(staging_capacity_tokens=4)
    with pytest.raises(oc.StepTooLargeError):
        step(c, count=[8])
    c.close()


def test_staging_timeout_names_unconsumed_steps():
    c = cache(staging_depth=1, staging_claim_timeout_s=-1, decode_buffer=False)
    sid = step(c)
    with pytest.raises(oc.StagingTimeoutError) as ei:
        step(c, ids=(2,), rows=[1])
    assert ei.value.unconsumed == [sid] and ei.value.code == 10
    c.discard(sid)
    c.sync()  # the page comes back once its write landed
    step(c, ids=(2,), rows=[1])
    c.close()


def test_staging_timeout_names_1500_unconsumed_steps():
    """With 1,500 steps unconsumed the message is cut at 4,095 bytes, but
    unconsumed holds every id (handed over as data, not parsed): consuming
    them frees the pages, and the save that timed out then succeeds. The
    ids belong to the thread's last failed call: a later error names none."""
    n = 1500
    c = cache(staging_depth=n, staging_capacity_tokens=4, staging_claim_timeout_s=-1, decode_buffer=False)
    sids = [step(c, ids=(i + 1,), count=(1,), finished=[i] if i else None) for i in range(n)]
    with pytest.raises(oc.StagingTimeoutError) as ei:
        step(c, ids=(n + 1,), count=(1,), finished=[n])
    assert len(str(ei.value)) >= 4000  # the message was cut ...
    assert ei.value.unconsumed == sids  # ... the ids were not
    with pytest.raises(oc.UnknownStepError):
        c.discard(1 << 40)
    assert _ffi.last_error_steps() == []
    for sid in ei.value.unconsumed:
        c.discard(sid)
    c.sync()
    c.discard(step(c, ids=(n + 1,), count=(1,), finished=[n]))
    c.close()


def test_unknown_step_and_not_in_step():
    c = cache()
    sid = step(c)
    with pytest.raises(oc.NotInStepError):
        c.materialize(sid, [99])
    c.discard(sid)  # a failed materialize consumed nothing
    with pytest.raises(oc.UnknownStepError):
        c.discard(sid)
    with pytest.raises(oc.UnknownStepError):
        c.materialize(sid)
    c.close()


def test_absent_required_is_partial_result():
    c = cache()
    sid = step(c, ids=(1, 2), count=(4, 4), start=[4, 0], arrivals=[1, 2], hit_tokens=[4, 0],
               hit_blocks=[20], rows=[0, 1])  # request 1 hits block 20, never written
    with pytest.raises(oc.AbsentRequiredError) as ei:
        c.materialize(sid)
    e = ei.value
    assert e.failed == [1]
    r = e.result
    assert list(r.ids) == [1, 2] and list(r.tokens) == [8, 4]
    assert isinstance(r.error(0), oc.AbsentRequiredError) and r.error(1) is None
    assert not r.rows(0, "hidden").any() and r.rows(1, "hidden").all()
    c.close()


def test_reassigned():
    c = cache(prefetch=False, decode_buffer=False)
    table = np.array([[0, 1, 2, 3], [0, 1, 4, 5], [0, 1, 6, 7]], np.int32)

    def st(ids, rows, start, count, **kw):
        c.begin(oc.Plan(ids=ids, rows=rows, start=start, count=count, table=table, **kw))
        return c.save({"hidden": np.full((sum(count), 16), ids[0], np.uint8)})

    c.discard(st([1], [0], [0], [8], arrivals=[1]))
    c.sync()
    late = st([2], [1], [8], [1], arrivals=[2], hit_tokens=[8], hit_blocks=[0, 1], finished=[1])
    # a new tenant writes blocks 0 and 1 before the late read
    c.discard(st([3], [2], [0], [8], arrivals=[3], finished=[2]))
    c.sync()
    with pytest.raises(oc.ReassignedError) as ei:
        c.materialize(late)
    assert ei.value.failed == [2]
    c.close()


def test_budget():
    keys = [oc.Key("hidden", 16), oc.Key("codes", 64, deferred=True)]
    c = oc.Cache(keys, num_blocks=64, block_size=BS, device_budget_bytes=128)
    c.begin(ids=[1], rows=[0], start=[0], count=[4], table=TABLE, arrivals=[1])
    with pytest.raises(oc.BudgetError):
        c.save({"hidden": np.ones((4, 16), np.uint8), "codes": np.ones((4, 64), np.uint8)})
    c.close()


def test_tier_miss_and_tier_config():
    with pytest.raises(oc.TierConfigError):
        oc.Cache(KEYS, num_blocks=64, block_size=BS, tier="bogus")
    c = oc.Cache([oc.Key("hidden", 16)], num_blocks=64, block_size=BS, tier="embedded", tier_model="m")
    assert c.lookup(np.array([7, 8], np.uint64)) == 0
    plan = oc.Plan(ids=[1], rows=[0], start=[4], count=[1], table=TABLE, arrivals=[1], hit_tokens=[4],
                   hit_blocks=[0], tier_blocks=[1], tier_hashes=np.array([12345], np.uint64))
    c.begin(plan)
    sid = c.save({"hidden": np.ones((1, 16), np.uint8)})
    with pytest.raises(oc.TierMissError) as ei:
        c.materialize(sid)
    assert ei.value.failed == [1]
    c.close()


def test_tier_unavailable():
    with pytest.raises(oc.TierUnavailableError, match="connect"):
        oc.Cache([oc.Key("hidden", 16)], num_blocks=64, block_size=BS, tier="redis://127.0.0.1:1", tier_model="m")


def _raw():
    L = _ffi.lib()
    return L, ctypes.create_string_buffer(512)


def test_abi_argument_bad_handle_unsupported():
    L, msg = _raw()
    assert L.omnicache_new(None, None) == 100
    assert L.omnicache_sync(0) == 101
    assert L.omnicache_sync(123456789) == 101
    L.omnicache_last_error(msg, len(msg))
    assert b"no such cache handle" in msg.value
    c = cache()
    plan = oc.Plan(ids=[1], rows=[0], start=[0], count=[1], table=TABLE)
    plan._c.n = -1
    with pytest.raises(oc.ArgumentError, match="negative length"):
        c.begin(plan)
    plan._c.n, plan._c.ids = 1, None
    with pytest.raises(oc.ArgumentError, match="NULL"):
        c.begin(plan)
    plan.set_batch([1], [0], [0], [1])
    c.begin(plan)
    o = oc.Outputs(c, [np.ones((1, 16), np.uint8), None], tokens=1)
    o._arr[0].flags = _ffi.TENSOR_CUDA
    with pytest.raises(oc.UnsupportedError, match="CUDA"):
        c.save(o)
    c.begin(plan)  # the failed save undid the begin
    c.abort()
    c.close()


def test_abi_short_buffer_keeps_the_rows():
    L, msg = _raw()
    c = cache()
    sid = step(c, ids=(1, 2), count=(4, 2), rows=[0, 1], h=np.arange(6 * 16, dtype=np.uint8).reshape(6, 16))
    res = _ffi.Result()
    kd = (_ffi.c_ptr * 2)()
    kc = (_ffi.c_i64 * 2)()
    res.key_data, res.key_cap, res.nkeys, res.cap_reqs = kd, kc, 2, 0
    assert L.omnicache_materialize(c._h, sid, None, -1, ctypes.byref(res)) == 102
    L.omnicache_last_error(msg, len(msg))
    assert isinstance(oc.errors.error(102, msg.value.decode()), oc.ShortBufferError)
    assert res.n_reqs == 2 and res.total_rows == 6
    ids, pre, tok = np.zeros(2, np.int64), np.zeros(2, np.int32), np.zeros(2, np.int32)
    h, mm = np.zeros((6, 16), np.uint8), np.zeros((6, 8), np.uint8)
    res.cap_reqs, res.ids, res.prefix, res.tokens = 2, ids.ctypes.data, pre.ctypes.data, tok.ctypes.data
    kd[0], kc[0], kd[1], kc[1] = h.ctypes.data, h.nbytes, mm.ctypes.data, mm.nbytes
    assert L.omnicache_materialize(c._h, sid, None, -1, ctypes.byref(res)) == 0
    assert list(ids) == [1, 2] and list(tok) == [4, 2]
    np.testing.assert_array_equal(h, np.arange(6 * 16, dtype=np.uint8).reshape(6, 16))
    with pytest.raises(oc.UnknownStepError):
        c.discard(sid)
    c.close()


def test_materialize_sizes_its_buffers_with_step_rows():
    """The package asks the library for the step's sizes (hit prefixes
    included) before it makes the buffers: exact, and the query consumes
    nothing, also when it fails."""
    c = cache()
    c.discard(step(c, ids=(1,), count=(8,)))
    c.sync()
    sid = step(c, ids=(2,), rows=[0], start=[8], count=[1], arrivals=[2], hit_tokens=[8], hit_blocks=[0, 1],
               finished=[1])
    L = _ffi.lib()
    n, rows = _ffi.c_i64(), _ffi.c_i64()
    assert L.omnicache_step_rows(c._h, sid, None, -1, ctypes.addressof(n), ctypes.addressof(rows)) == 0
    assert (n.value, rows.value) == (1, 9)
    with pytest.raises(oc.NotInStepError):
        c.materialize(sid, [3])
    r = c.materialize(sid, [2])
    assert list(r.prefix) == [8] and list(r.tokens) == [9] and r.keys["hidden"].shape == (9, 16)
    with pytest.raises(oc.UnknownStepError):
        c.materialize(sid)
    c.close()


def test_cuda_device_needs_a_cuda_build():
    """A build without the cuda tag refuses a CUDA device; the GPU bundle
    runs these tests against the cuda build on a GPU machine
    (OMNICACHE_CUDA_BUILD=1, .gpu/run.sh), where device 0 opens."""
    if os.environ.get("OMNICACHE_CUDA_BUILD") == "1":
        oc.Cache(KEYS, num_blocks=64, block_size=BS, cuda_device=0).close()
        return
    with pytest.raises(oc.UnsupportedError, match="CUDA device 0: gpu: built without the cuda tag"):
        oc.Cache(KEYS, num_blocks=64, block_size=BS, cuda_device=0)
