"""make bench-python's module runs (briefly) and checks what it times:
the slot mapping against numpy, materialize's rows against torch.cat's;
--cuda refuses cleanly where there is no CUDA device."""

import os
import subprocess
import sys

import pytest

NO_TORCH = os.environ.get("OMNICACHE_TEST_NO_TORCH") == "1"


def bench(*args):
    return subprocess.run([sys.executable, "-m", "omnicache._bench", *args], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env=os.environ)


def test_slots_part():
    out = bench("--only", "slots", "--rounds", "1", "--steps", "20")
    assert out.returncode == 0, out.stderr
    for shape in ("decode16", "decode64", "prefill16384"):
        assert shape in out.stdout


@pytest.mark.skipif(NO_TORCH, reason="OMNICACHE_TEST_NO_TORCH=1")
def test_rows_part_checks_materialize_against_torch_cat():
    out = bench("--only", "rows", "--rounds", "1", "--steps", "20")
    assert out.returncode == 0, out.stderr
    for shape in ("decode16", "decode64", "prefill2048 ", "prefill2048 hit1024"):
        assert shape in out.stdout


def test_cuda_refuses_without_a_device():
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present: the refusal is for machines without one")
    except ImportError:
        pass  # refused for want of torch
    out = bench("--cuda", "--only", "rows")
    assert out.returncode == 1
    assert "no CUDA device" in out.stderr and "Traceback" not in out.stderr
