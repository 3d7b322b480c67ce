"""Package discovery for setuptools; all other metadata lives in ``pyproject.toml``.

Every package under ``pytest_backends/`` is found, never listed by hand, and
the C++/CUDA sources in the top-level ``native/`` directory are shipped inside
the package as ``pytest_backends.native`` so an installed plugin can build them.
"""

from setuptools import find_packages, setup

NATIVE_DIRS = {
    "pytest_backends.native": "native",
    "pytest_backends.native.cuda": "native/cuda",
}

setup(
    packages=[*find_packages(include=["pytest_backends", "pytest_backends.*"]), *NATIVE_DIRS],
    package_dir=NATIVE_DIRS,
)
