"""pytest_backends: backend-aware PyTorch testing.

Public names are resolved lazily so that importing this package (which
pytest does for every run once the plugin is installed) never imports torch.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import TYPE_CHECKING, Any

try:
    # Written once, in pyproject.toml; read from the installed package's metadata.
    __version__ = importlib.metadata.version("pytest-backends")
except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

# public name -> defining submodule
_EXPORTS: dict[str, str] = {
    "snapshot_flags": "flags",
    "restore_flags": "flags",
    "override_flags": "flags",
    "diff_flags": "flags",
    "flag_names": "flags",
    "assert_reproducible": "determinism.api",
    "expect_nondeterministic_alert": "determinism.api",
    "DeterminismError": "determinism.api",
    "NotReproducibleError": "determinism.api",
    "NondeterministicOpError": "determinism.api",
    "AlertExpectationError": "determinism.api",
    "assert_batch_invariant": "batch.api",
    "BatchInvariance": "batch.api",
    "BatchInvarianceError": "batch.api",
    "use_config": "matrix.api",
    "BackendConfig": "matrix.configs",
    "Axis": "matrix.configs",
    "AxisValue": "matrix.configs",
    "assert_close": "tolerance",
    "tolerance_for": "tolerance",
    "reference": "tolerance",
    "Tolerance": "tolerance",
    "flag_effect": "effect",
    "assert_paths_agree": "paths",
    "PathsAgreement": "paths",
    "PathsDisagreeError": "paths",
    "FlagEffect": "effect",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from pytest_backends.batch.api import BatchInvariance as BatchInvariance
    from pytest_backends.batch.api import BatchInvarianceError as BatchInvarianceError
    from pytest_backends.batch.api import assert_batch_invariant as assert_batch_invariant
    from pytest_backends.determinism.api import (
        AlertExpectationError as AlertExpectationError,
    )
    from pytest_backends.determinism.api import (
        DeterminismError as DeterminismError,
    )
    from pytest_backends.determinism.api import (
        NondeterministicOpError as NondeterministicOpError,
    )
    from pytest_backends.determinism.api import (
        NotReproducibleError as NotReproducibleError,
    )
    from pytest_backends.determinism.api import (
        assert_reproducible as assert_reproducible,
    )
    from pytest_backends.determinism.api import (
        expect_nondeterministic_alert as expect_nondeterministic_alert,
    )
    from pytest_backends.effect import FlagEffect as FlagEffect
    from pytest_backends.effect import flag_effect as flag_effect
    from pytest_backends.flags import (
        diff_flags as diff_flags,
    )
    from pytest_backends.flags import (
        flag_names as flag_names,
    )
    from pytest_backends.flags import (
        override_flags as override_flags,
    )
    from pytest_backends.flags import (
        restore_flags as restore_flags,
    )
    from pytest_backends.flags import (
        snapshot_flags as snapshot_flags,
    )
    from pytest_backends.paths import PathsAgreement as PathsAgreement
    from pytest_backends.paths import PathsDisagreeError as PathsDisagreeError
    from pytest_backends.paths import assert_paths_agree as assert_paths_agree
    from pytest_backends.tolerance import Tolerance as Tolerance
    from pytest_backends.tolerance import assert_close as assert_close
    from pytest_backends.tolerance import reference as reference
    from pytest_backends.tolerance import tolerance_for as tolerance_for


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_backends' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"pytest_backends.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
