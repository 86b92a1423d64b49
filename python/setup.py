"""The omnicache wheel: the package and the prebuilt libomnicache.so
(make python builds it into omnicache/_lib; make python-wheel runs this)."""

import os

from setuptools import setup
from setuptools.dist import Distribution

try:
    from wheel.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover
    bdist_wheel = None

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.path.join(HERE, "omnicache", "_lib", "libomnicache.so")
if not os.path.exists(LIB):
    raise SystemExit("omnicache: %s missing: run `make python` first" % LIB)


class BinaryDistribution(Distribution):
    """The wheel carries a shared library: a platform wheel."""

    def has_ext_modules(self):
        return True


cmdclass = {}
if bdist_wheel is not None:

    class PlatformWheel(bdist_wheel):
        """py3-none-<platform>: the library is loaded with ctypes/cffi, not
        linked against one Python's ABI."""

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = PlatformWheel

setup(
    name="omnicache",
    version="0.1.0",
    description="The per-token output prefix cache of a multimodal inference engine (Go core, C ABI, Python package)",
    packages=["omnicache"],
    package_data={"omnicache": ["_lib/libomnicache.so", "_lib/omnicache.h"]},
    install_requires=["numpy"],
    extras_require={"fast": ["cffi"], "torch": ["torch"]},
    python_requires=">=3.9",
    distclass=BinaryDistribution,
    cmdclass=cmdclass,
    zip_safe=False,
)
