"""omnicache: the per-token output prefix cache of a multimodal inference
engine, from Python.

Importing loads nothing: the Go library (omnicache/_lib/libomnicache.so) is
loaded by the first Cache or version() call, so a parent may import the
package and fork workers; each worker that uses it loads it after the fork.

    from omnicache import Cache, Key, Plan
    cache = Cache([Key("hidden", 4096 * 2)], num_blocks=1024, block_size=16)

The engine contract (Cache.begin / save / materialize or discard) is the Go
package's (github.com/omnicache/omnicache); omnicache.vllm_omni adapts it
to the upstream vLLM-Omni manager's shape.
"""

from .core import Cache, Key, Outputs, Plan, Result, stat_names, version
from .errors import *  # noqa: F401,F403
from .errors import ERRORS, ArgumentTypeError, KeyLayoutError, LoadError, OmnicacheError, StagingTimeoutError, UnknownKeyError

__version__ = "0.1.0"

__all__ = ["Cache", "Key", "Outputs", "Plan", "Result", "stat_names", "version", "OmnicacheError",
           "StagingTimeoutError", "ERRORS", "ArgumentTypeError", "UnknownKeyError", "KeyLayoutError",
           "LoadError"] + [c.__name__ for c in ERRORS.values()]
