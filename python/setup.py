"""The omnicache wheel: the package, the prebuilt libomnicache.so (make
python builds it into omnicache/_lib; make python-wheel runs this) and the
_fast extension (omnicache/_fast.c, the per-step calls without ctypes),
compiled here against this Python's headers (python3-dev). The extension
does not link libomnicache.so; when it cannot be compiled the wheel
carries none and the package calls the library through ctypes."""

import os

from setuptools import Extension, setup
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.path.join(HERE, "omnicache", "_lib", "libomnicache.so")
if not os.path.exists(LIB):
    raise SystemExit("omnicache: %s missing: run `make python` first" % LIB)


class BinaryDistribution(Distribution):
    """The wheel carries a shared library: a platform wheel, even when the
    optional extension was not built."""

    def has_ext_modules(self):
        return True


setup(
    name="omnicache",
    version="0.1.0",
    description="The per-token output prefix cache of a multimodal inference engine (Go core, C ABI, Python package)",
    packages=["omnicache"],
    package_data={"omnicache": ["_lib/libomnicache.so", "_lib/omnicache.h"]},
    ext_modules=[Extension("omnicache._fast", ["omnicache/_fast.c"], optional=True)],
    install_requires=["numpy"],
    extras_require={"torch": ["torch"]},
    python_requires=">=3.9",
    distclass=BinaryDistribution,
    zip_safe=False,
)
