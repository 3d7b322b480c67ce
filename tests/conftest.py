"""Shared test configuration.

pytester moves ``HOME`` for the runs it starts, which would move the native
extension's per-user build cache with it and rebuild the extension in every
subprocess. Pin the cache to this user's real one before that happens.

pytester also drops, after each test, the modules imported during it; NumPy
refuses to be imported a second time in one process, so it is imported here,
before any test, wherever it is installed. So is ``torch.utils.cpp_extension``,
which loading the native extension imports: dropped and imported again, it left
a torch builtin's method table freed, and a later call of it (the leak guard's
``torch.is_inference_mode_enabled()``) crashed the process (a test loading the
extension inside pytester, then an in-process recorder test).
"""

from __future__ import annotations

import contextlib
import os

from pytest_backends import _native

with contextlib.suppress(ImportError):
    import numpy  # noqa: F401
with contextlib.suppress(ImportError):
    import torch.utils.cpp_extension  # noqa: F401

os.environ.setdefault("PYTEST_BACKENDS_CACHE_DIR", str(_native._cache_root()))
