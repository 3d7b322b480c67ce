"""Where two kernel paths part: the first op whose result differs beyond its bound.

:func:`assert_paths_agree` (in :mod:`.api`) compares configurations in this
process; :mod:`.trace` saves per-op sketches so two processes, machines or
torch versions can be compared offline (``pytest-backends diverge``).
Names resolve lazily: importing this package never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "Divergence",
    "PathsAgreement",
    "PathsDisagreeError",
    "assert_paths_agree",
    "first_divergence",
]

if TYPE_CHECKING:
    from pytest_backends.paths.api import Divergence as Divergence
    from pytest_backends.paths.api import PathsAgreement as PathsAgreement
    from pytest_backends.paths.api import PathsDisagreeError as PathsDisagreeError
    from pytest_backends.paths.api import assert_paths_agree as assert_paths_agree
    from pytest_backends.paths.api import first_divergence as first_divergence


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'pytest_backends.paths' has no attribute {name!r}")
    value = getattr(importlib.import_module("pytest_backends.paths.api"), name)
    globals()[name] = value
    return value
