import os
import subprocess
import sys

import numpy as np
import pytest

import omnicache as oc
from oracle import Mirror, row_bytes, slots

BS = 4
KEYS = [oc.Key("hidden", 16), oc.Key("mm", 8, optional=True)]


def rows_for(seed, req, start, count, rb):
    return np.stack([row_bytes(seed, req, p, rb) for p in range(start, start + count)])


def new_cache(**kw):
    kw.setdefault("num_blocks", 64)
    kw.setdefault("block_size", BS)
    return oc.Cache(KEYS, **kw)


def test_import_loads_nothing():
    code = ("import omnicache, omnicache.vllm_omni, sys; "
            "assert omnicache._ffi._lib is None; "
            "assert 'libomnicache' not in open('/proc/self/maps').read(); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_version():
    assert oc.version().startswith("omnicache 0.1.0")


def test_only_abi_symbols_exported():
    lib = oc._ffi.lib_path()
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True)
    names = [line.split()[-1] for line in out.stdout.splitlines() if line.strip()]
    assert names and all(n.startswith("omnicache_") for n in names), names


def test_hit_reads_exact_rows_and_optional_zeros():
    """Two requests prefill; one finishes; a new one hits its first two
    blocks: materialize gives [hit prefix | this step] exactly as the
    oracle's mirror holds them, the optional key absent in the prefix read
    as zeros."""
    c = new_cache()
    m = Mirror(KEYS)
    table = np.array([[3, 5, 9, 11], [20, 21, 22, 23], [3, 5, 30, 31]], dtype=np.int32)
    # step 1: requests 1 and 2 prefill 8 and 6 tokens; the optional key omitted
    plan = oc.Plan(ids=[1, 2], rows=[0, 1], start=[0, 0], count=[8, 6], table=table,
                   arrivals=[1, 2], hit_tokens=[0, 0])
    c.begin(plan)
    h = np.concatenate([rows_for(0, 1, 0, 8, 16), rows_for(0, 2, 0, 6, 16)])
    sid = c.save({"hidden": h, "mm": None})
    s1 = np.concatenate([slots(table, 0, 0, 8, BS), slots(table, 1, 0, 6, BS)])
    m.write("hidden", s1, h)
    m.omit("mm", s1)
    r = c.materialize(sid)
    assert list(r.ids) == [1, 2] and list(r.prefix) == [0, 0] and list(r.tokens) == [8, 6]
    np.testing.assert_array_equal(r.rows(0, "hidden"), h[:8])
    np.testing.assert_array_equal(r.rows(1, "hidden"), h[8:])
    assert not r.rows(1, "mm").any()
    # step 2: request 1 finishes; request 3 arrives hitting 8 tokens (blocks 3, 5)
    # and computes 3 more; request 2 decodes one token
    plan = oc.Plan(ids=[3, 2], rows=[2, 1], start=[8, 6], count=[3, 1], table=table,
                   arrivals=[3], hit_tokens=[8], hit_blocks=[3, 5], finished=[1])
    c.begin(plan)
    h2 = np.concatenate([rows_for(0, 3, 8, 3, 16), rows_for(0, 2, 6, 1, 16)])
    mm2 = np.concatenate([rows_for(1, 3, 8, 3, 8), rows_for(1, 2, 6, 1, 8)])
    sid2 = c.save({"hidden": h2, "mm": mm2})
    r = c.materialize(sid2, [3])
    hit = slots(table, 2, 0, 8, BS)
    assert list(r.ids) == [3] and list(r.prefix) == [8] and list(r.tokens) == [11]
    want_h = np.concatenate([m.read("hidden", hit, 16), h2[:3]])
    want_mm = np.concatenate([m.read("mm", hit, 8), mm2[:3]])
    np.testing.assert_array_equal(r.rows(0, "hidden"), want_h)
    np.testing.assert_array_equal(r.rows(0, "mm"), want_mm)
    assert not r.rows(0, "mm")[:8].any()  # optional rows never written read as zeros
    st = c.stats()
    assert st["HitRequests"] == 1 and st["HitTokens"] == 8 and st["Steps"] == 2
    c.close()


def test_results_survive_engine_overwrite():
    c = new_cache()
    table = np.arange(8, dtype=np.int32).reshape(2, 4)
    c.begin(oc.Plan(ids=[1], rows=[0], start=[0], count=[4], table=table, arrivals=[1]))
    h = rows_for(0, 1, 0, 4, 16)
    keep = h.copy()
    sid = c.save({"hidden": h})
    h[:] = 0xAB  # the engine reuses its buffer at once
    r = c.materialize(sid)
    np.testing.assert_array_equal(r.rows(0, "hidden"), keep)
    c.close()


def test_decode_steps_in_place_plan():
    """An engine updates the plan's arrays in place and calls begin(plan)
    again: a run of decode steps through the decode buffer, every row
    exact."""
    c = new_cache()
    n = 3
    table = np.arange(n * 8, dtype=np.int32).reshape(n, 8)
    ids = np.array([10, 11, 12], np.int64)
    start = np.zeros(n, np.int32)
    plan = oc.Plan(ids=ids, rows=np.arange(n, dtype=np.int32), start=start,
                   count=np.ones(n, np.int32), table=table, arrivals=ids.copy())
    outs = oc.Outputs(c, tokens=n)
    buf = np.zeros((n, 16), np.uint8)
    outs.set("hidden", buf)
    for step in range(10):
        c.begin(plan)
        for i in range(n):
            buf[i] = row_bytes(0, ids[i], start[i], 16)
        sid = c.save(outs)
        r = c.materialize(sid)
        np.testing.assert_array_equal(r.keys["hidden"], buf)
        if step == 0:
            plan.clear_events()
        start += 1
    c.sync()
    assert c.stats()["BufferedSteps"] > 0
    c.close()


def test_plan_keywords_and_lists():
    c = new_cache()
    c.begin(ids=[1], rows=[0], start=[0], count=[2], table=[[1, 2]], arrivals=[1])
    sid = c.save([np.ones((2, 16), np.uint8), None])
    c.discard(sid)
    c.close()


def test_backends():
    """make python builds the _fast extension and the per-step calls go
    through it; OMNICACHE_NO_FAST=1 or OMNICACHE_CTYPES=1 falls back to
    ctypes, and both paths save the same rows."""
    assert oc._calls.hot().backend == "fast"
    code = ("import numpy as np, omnicache as oc; c = oc.Cache([oc.Key('h', 8)], num_blocks=8, block_size=4); "
            "c.begin(ids=[1], rows=[0], start=[0], count=[2], table=[[0, 1]], arrivals=[1]); "
            "s = c.save([np.full((2, 8), 3, np.uint8)]); r = c.materialize(s); "
            "c.begin(ids=[1], rows=[0], start=[2], count=[1], table=[[0, 1]]); "
            "s2 = c.save([np.full((1, 8), 4, np.uint8)]); "
            "assert s2 == s + 1 and r.rows(0, 'h').min() == 3 and c.materialize(s2).rows(0, 'h').min() == 4; "
            "print(oc._calls.hot().backend)")
    for env, want in (({}, "fast"), ({"OMNICACHE_NO_FAST": "1"}, "ctypes"), ({"OMNICACHE_CTYPES": "1"}, "ctypes"),
                      ({"OMNICACHE_NO_FAST": "1", "OMNICACHE_CTYPES": "1"}, "ctypes")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(os.environ, **env))
        assert out.returncode == 0 and out.stdout.strip() == want, (env, out.stdout, out.stderr)


def test_entry_points_before_any_cache():
    """The per-step entry points asked for before the library was loaded
    load it (no deadlock on the loader's lock)."""
    out = subprocess.run([sys.executable, "-c", "import omnicache; print(omnicache._calls.hot().backend)"],
                         capture_output=True, text=True, env=os.environ, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() in ("fast", "ctypes"), out.stderr


def test_begin_discards_the_step_before():
    """begin(plan, discard=step) discards step and begins plan in one call;
    a failed discard begins nothing."""
    import omnicache as oc
    c = oc.Cache([oc.Key("hidden", 8)], num_blocks=8, block_size=4)
    try:
        rows = np.zeros((2, 8), dtype=np.uint8)
        c.begin(ids=[1], rows=[0], start=[0], count=[2], table=[[0, 1]], arrivals=[1])
        s1 = c.save([rows])
        plan = oc.Plan(ids=[1], rows=[0], start=[2], count=[1], table=[[0, 1]])
        c.begin(plan, discard=s1)
        s2 = c.save([rows[:1]])
        with pytest.raises(oc.UnknownStepError):
            c.discard(s1)  # discarded by begin
        with pytest.raises(oc.UnknownStepError):
            c.begin(oc.Plan(ids=[1], rows=[0], start=[3], count=[1], table=[[0, 1]]), discard=s1)
        c.begin(oc.Plan(ids=[1], rows=[0], start=[3], count=[1], table=[[0, 1]]), discard=s2)  # nothing was begun
        c.save([rows[:1]])
    finally:
        c.close()
