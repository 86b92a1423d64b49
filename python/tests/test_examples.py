"""The examples in python/examples run as written and check themselves."""

import os
import re
import subprocess
import sys

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def test_vllm_engine_loop():
    """The engine loop over vLLM-shaped objects: every request's rows exact,
    through prefix hits, a preemption and a resume with a hit."""
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, "vllm_engine_loop.py")], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ))
    assert p.returncode == 0, p.stdout + p.stderr
    m = re.search(r"(\d+) preempted \((\d+) resumed with a hit\): (\d+) hits .*rows exact$", p.stdout.strip())
    assert m, p.stdout
    preempted, resumed, hits = map(int, m.groups())
    assert preempted >= 1 and resumed >= 1 and hits >= 3, p.stdout
