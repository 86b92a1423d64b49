"""CUDA tests: run on a machine with a GPU against a cuda build of the
library (make python-cuda; OMNICACHE_LIB=.gpu/libomnicache-cuda.so), with
python3 -m pytest python/tests_cuda. Not part of make test."""

import os
import sys

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if PKG not in sys.path:
    sys.path.insert(0, PKG)
