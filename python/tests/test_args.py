"""Arguments the package refuses before they reach the library, each with a
typed omnicache error (also the built-in exception the same mistake raised
before: ValueError, TypeError, KeyError, ImportError), and the cache usable
and unchanged afterwards."""

import os
import subprocess
import sys

import numpy as np
import pytest

import omnicache as oc

BS = 4
TABLE = np.arange(64, dtype=np.int32).reshape(4, 16)


def cache(**kw):
    kw.setdefault("num_blocks", 64)
    kw.setdefault("block_size", BS)
    return oc.Cache(kw.pop("keys", [oc.Key("hidden", 8), oc.Key("mm", 4, optional=True)]), **kw)


def plan(ids=(1,), count=(4,), start=None, arrivals=None):
    ids = list(ids)
    return oc.Plan(ids=ids, rows=list(range(len(ids))), start=start or [0] * len(ids), count=list(count), table=TABLE,
                   arrivals=ids if arrivals is None else arrivals)


def rows(n, seed, dtype=np.float32, shape=(2,)):
    """n rows of 8 bytes (two float32 by default), distinct per seed."""
    return (np.arange(n * int(np.prod(shape)), dtype=np.float64).reshape((n,) + shape) + 100 * seed).astype(dtype)


def test_a_key_keeps_its_dtype_and_row_shape():
    with cache() as c:
        c.begin(plan())
        first = rows(4, 1)
        s1 = c.save({"hidden": first})
        c.discard(s1)
        for other, what in [(rows(4, 2, np.int32), "dtype int32"), (rows(4, 2, np.float32, (2, 1)), r"rows \(2, 1\)"),
                            (rows(4, 2, np.uint8, (8,)), "dtype uint8")]:
            c.begin(plan(ids=(2,)))
            with pytest.raises(oc.KeyLayoutError, match=what) as ei:
                c.save({"hidden": other})
            assert isinstance(ei.value, oc.OutputsError) and isinstance(ei.value, TypeError)
            assert "float32" in str(ei.value)
            with pytest.raises(oc.SequenceError):  # the refused save undid its begin, as the library's do
                c.save({"hidden": rows(4, 3)})
        again = rows(4, 3)
        c.begin(plan(ids=(2,)))
        s2 = c.save({"hidden": again})
        r = c.materialize(s2)
        assert np.array_equal(r.rows(0, "hidden", np.float32).reshape(4, 2), again)
        # an optional key keeps its own first layout; omitting it is no layout
        c.begin(plan(ids=(3,)))
        s3 = c.save({"hidden": rows(4, 4), "mm": np.ones((4, 2), np.int16)})
        c.discard(s3)
        c.begin(plan(ids=(4,)))
        with pytest.raises(oc.KeyLayoutError, match="'mm'"):
            c.save({"hidden": rows(4, 5), "mm": np.ones((4, 1), np.float32)})
        c.begin(plan(ids=(4,)))
        c.discard(c.save({"hidden": rows(4, 5)}))


def test_sizes_are_checked_before_the_abi():
    for kw, err, what in [
        (dict(num_blocks=2 ** 64 + 16), oc.ConfigError, "num_blocks 18446744073709551632"),
        (dict(block_size=2 ** 63), oc.ConfigError, "block_size"),
        (dict(staging_capacity_tokens=-1), oc.ConfigError, "staging_capacity_tokens -1"),
        (dict(read_ahead_bytes=2 ** 70), oc.ConfigError, "read_ahead_bytes"),
        (dict(cuda_device=2 ** 31), oc.ConfigError, "cuda_device"),
        (dict(num_blocks=64.0), oc.ArgumentTypeError, "num_blocks: 64.0 is a float"),
        (dict(copy_workers=True), oc.ArgumentTypeError, "copy_workers: True is a bool"),
        (dict(alloc_staging="later"), oc.ConfigError, "alloc_staging"),
    ]:
        with pytest.raises(err, match=what):
            cache(**kw)
    with pytest.raises(oc.ConfigError, match="row_bytes 18446744073709551624"):
        oc.Key("hidden", 2 ** 64 + 8)
    with pytest.raises(oc.ConfigError, match="row_bytes 0"):
        oc.Key("hidden", 0)
    with pytest.raises(oc.ArgumentTypeError, match="row_bytes: 8.5 is a float"):
        oc.Key("hidden", 8.5)
    with pytest.raises(oc.ArgumentTypeError, match="keys"):
        oc.Cache([("hidden",)], num_blocks=64, block_size=BS)
    c = cache(num_blocks=np.int64(64))  # numpy integers are integers
    assert c.num_blocks == 64 and type(c.num_blocks) is int
    with pytest.raises(oc.PlanError, match="stride 18446744073709551616"):
        oc.Plan().set_table(TABLE.ravel(), stride=2 ** 64)
    outs = oc.Outputs(c)
    for field, v, err in [("tokens", 2 ** 63, oc.ArgumentError), ("tokens", -1, oc.ArgumentError),
                          ("tokens", 2.0, oc.ArgumentTypeError), ("padded", -3, oc.ArgumentError)]:
        with pytest.raises(err, match=field):
            setattr(outs, field, v)
    outs.tokens = 4
    with pytest.raises(oc.ArgumentError, match="padded 3: fewer than the 4 tokens"):
        outs.padded = 3
    c.close()


def test_bad_arguments_are_typed_and_change_nothing():
    with cache() as c:
        p = plan()
        for call, err, what in [
            (lambda: c.begin(123), oc.ArgumentTypeError, "plan is a int"),
            (lambda: c.begin(p, discard="x"), oc.ArgumentTypeError, "discard: 'x' is a str"),
            (lambda: c.begin(p, -1), oc.ArgumentError, "discard -1"),
            (lambda: c.begin(ids=[1], nonsense=2), oc.ArgumentTypeError, "nonsense"),
            (lambda: c.materialize("abc"), oc.ArgumentTypeError, "step: 'abc' is a str"),
            (lambda: c.materialize(-1), oc.ArgumentError, "step -1"),
            (lambda: c.materialize(2 ** 64), oc.ArgumentError, "step 18446744073709551616"),
            (lambda: c.discard(1.0), oc.ArgumentTypeError, "step: 1.0 is a float"),
            (lambda: c.discard(-2), oc.ArgumentError, "step -2"),
            (lambda: c.discard(2 ** 64), oc.ArgumentError, "step 18446744073709551616"),
            (lambda: c.lookup("abc"), oc.ArgumentTypeError, "hashes"),
            (lambda: oc.Plan(ids=[1, "x"]), oc.ArgumentTypeError, "ids"),
            (lambda: oc.Plan(ids=[2 ** 64]), oc.ArgumentTypeError, "ids"),
            (lambda: oc.Plan(ids=[1], rows=[0, 1], start=[0], count=[1]), oc.PlanError, "batch arrays disagree"),
            (lambda: oc.Outputs(c).set("nope", None), oc.UnknownKeyError, "no key 'nope'"),
            (lambda: oc.Outputs(c).set(5, None), oc.ArgumentError, "key index 5"),
            (lambda: oc.Outputs(c).update(7), oc.ArgumentTypeError, "a int"),
            (lambda: oc.Outputs(c).update([None]), oc.ArgumentError, "1 tensors for 2 keys"),
        ]:
            with pytest.raises(err, match=what) as ei:
                call()
            assert isinstance(ei.value, oc.OmnicacheError) and ei.value.code == 100 or isinstance(ei.value, oc.PlanError)
        assert isinstance(oc.UnknownKeyError("m"), KeyError)
        before = c.stats()
        c.begin(p)  # nothing was begun by the refused calls
        s = c.save({"hidden": rows(4, 1)})
        assert c.materialize(s).rows(0, "hidden", np.float32).reshape(4, 2).tolist() == rows(4, 1).tolist()
        assert c.stats()["Steps"] == before["Steps"] + 1


def test_row_size_and_row_count_and_padding():
    # A wrong row size (refused in Python) and a wrong row count (refused by
    # the library) are both OutputsError, and both undo the begun step.
    with cache() as c:
        c.begin(plan())
        with pytest.raises(oc.OutputsError, match="rows of 4 bytes") as ei:
            c.save({"hidden": np.zeros((4, 1), np.float32)})
        assert isinstance(ei.value, ValueError)
        c.begin(plan())
        with pytest.raises(oc.OutputsError, match="2 rows") as ei:
            c.save({"hidden": rows(2, 1)}, tokens=4)
        assert ei.value.code == 8
        # Rows past the tokens are padding: neither stored nor delivered.
        c.begin(plan())
        padded = rows(6, 7)
        s = c.save({"hidden": padded}, tokens=4, padded=6)
        r = c.materialize(s)
        assert r.tokens.tolist() == [4]
        assert np.array_equal(r.rows(0, "hidden", np.float32).reshape(4, 2), padded[:4])
        c.begin(plan(ids=(2,), arrivals=[2]))
        with pytest.raises(oc.ArgumentError, match="tokens -4"):  # a negative count summed
            c.save({"hidden": rows(4, 1)}, tokens=-4)
        c.begin(plan(ids=(2,), arrivals=[2]))
        c.discard(c.save({"hidden": rows(4, 1)}))


def test_a_step_larger_than_the_staging_page_says_what_to_do():
    n = 2048
    table = np.arange(n // 16, dtype=np.int32).reshape(1, -1)
    with oc.Cache([oc.Key("hidden", 8)], num_blocks=n // 16, block_size=16) as c:
        with pytest.raises(oc.StepTooLargeError, match="staging_capacity_tokens") as ei:
            c.begin(oc.Plan(ids=[1], rows=[0], start=[0], count=[n], table=table, arrivals=[1]))
        assert "from_vllm_config" in str(ei.value) and "1,024" in str(ei.value)
    with oc.Cache([oc.Key("hidden", 8)], num_blocks=n // 16, block_size=16, staging_capacity_tokens=n) as c:
        c.begin(oc.Plan(ids=[1], rows=[0], start=[0], count=[n], table=table, arrivals=[1]))
        c.discard(c.save({"hidden": np.zeros((n, 8), np.uint8)}))


def _load(lib, tmp_path):
    env = dict(os.environ, OMNICACHE_LIB=str(lib))
    code = ("import omnicache as oc\n"
            "try:\n    oc.version()\n"
            "except oc.LoadError as e:\n    print(type(e).__name__, isinstance(e, ImportError), e)\n")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path, check=True).stdout


def test_a_library_that_cannot_load_raises_load_error(tmp_path):
    # A library linked against the NVIDIA driver's libcuda.so.1, loaded
    # where the driver is not: the package's error names the driver. On a
    # GPU machine (OMNICACHE_CUDA_BUILD=1, .gpu/run.sh) the driver is there:
    # only the missing library is tried.
    if os.environ.get("OMNICACHE_CUDA_BUILD") == "1":
        out = _load(tmp_path / "missing.so", tmp_path)
        assert out.startswith("LoadError True ") and "not found" in out, out
        return
    (tmp_path / "cuda.c").write_text("int cuInit(unsigned f) { return (int)f; }\n")
    (tmp_path / "lib.c").write_text("extern int cuInit(unsigned); int omnicache_probe(void) { return cuInit(0); }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", "libcuda.so.1", "cuda.c"], cwd=tmp_path, check=True)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", "libomnicache-cuda.so", "lib.c", "-L.", "-l:libcuda.so.1"],
                   cwd=tmp_path, check=True)
    os.remove(tmp_path / "libcuda.so.1")
    out = _load(tmp_path / "libomnicache-cuda.so", tmp_path)
    assert out.startswith("LoadError True ") and "NVIDIA driver" in out and "libcuda.so.1" in out, out
    out = _load(tmp_path / "missing.so", tmp_path)
    assert out.startswith("LoadError True ") and "not found" in out, out
