"""Builds the library (make python) before the tests run, and puts the
package of this tree first on sys.path."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
ROOT = os.path.dirname(PKG)

if PKG not in sys.path:
    sys.path.insert(0, PKG)
os.environ["PYTHONPATH"] = PKG + os.pathsep + os.environ.get("PYTHONPATH", "")


def pytest_sessionstart(session):
    if os.environ.get("OMNICACHE_LIB") or os.environ.get("OMNICACHE_TEST_NO_BUILD"):
        return
    env = dict(os.environ)
    env["PATH"] = "/usr/local/go/bin" + os.pathsep + env.get("PATH", "")
    subprocess.run(["make", "--no-print-directory", "-C", ROOT, "python"], check=True, env=env)


def torch_or_fail():
    """torch, or a failure: torch tests never skip silently. Set
    OMNICACHE_TEST_NO_TORCH=1 to skip them on purpose."""
    import pytest

    if os.environ.get("OMNICACHE_TEST_NO_TORCH"):
        pytest.skip("OMNICACHE_TEST_NO_TORCH is set")
    try:
        import torch
    except ImportError as e:  # pragma: no cover
        pytest.fail("torch is not importable (%s): install python3-torch or set OMNICACHE_TEST_NO_TORCH=1" % e)
    return torch
