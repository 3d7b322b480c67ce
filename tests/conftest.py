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

Torch's own modules are never dropped: many register a ``TORCH_LIBRARY`` block
when imported (``torch._inductor.test_operators``,
``torch.distributed._functional_collectives``), and a second import raises
"Only a single TORCH_LIBRARY can be used to register the namespace ...". An
in-process run that imported one made every later test in that worker that
imports it fail, depending on which tests xdist happened to give the worker.

pytester's inner ``python -m pytest`` sessions are forks of a process that has
imported torch once (``tests/zygote.py``), where nothing about the session needs a
fresh interpreter.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import zygote
from _pytest.pytester import Pytester, SysModulesSnapshot

from pytest_backends import _native

with contextlib.suppress(ImportError):
    import numpy  # noqa: F401
with contextlib.suppress(ImportError):
    import torch.utils.cpp_extension  # noqa: F401

os.environ.setdefault("PYTEST_BACKENDS_CACHE_DIR", str(_native._cache_root()))


_restore = SysModulesSnapshot.restore


def _restore_keeping_torch(self: SysModulesSnapshot) -> None:
    kept = {name: m for name, m in sys.modules.items() if name.split(".", 1)[0] == "torch"}
    _restore(self)
    for name, module in kept.items():
        sys.modules.setdefault(name, module)


SysModulesSnapshot.restore = _restore_keeping_torch  # type: ignore[method-assign]


_popen = Pytester.popen


def _popen_or_fork(self: Pytester, cmdargs: Any, **kw: Any) -> Any:
    return zygote.popen_or_fork(_popen, self, cmdargs, **kw)


Pytester.popen = _popen_or_fork  # type: ignore[method-assign]
