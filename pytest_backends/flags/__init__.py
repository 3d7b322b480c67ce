"""The registry of torch's process-global backend state.

One declarative table (:mod:`.catalogue`, with the row groups of
:mod:`.rows`) has a row per piece of global state: cuDNN, oneDNN, cuBLAS,
the ``fp32_precision`` tree, SDPA, determinism, defaults and threads.  Each
row knows how to read the raw value cheaply, how to turn it into a plain
value, how to validate and write a new one, and whether it exists in the
running torch.  Everything else in the package goes through this package to
touch flags: :mod:`.row` defines a row and the checks rows share,
:mod:`.registry` snapshots, validates, applies, restores and diffs them, and
this module re-exports the public names.
"""

from __future__ import annotations

from pytest_backends.flags.registry import (
    FlagRegistry,
    diff_flags,
    flag_names,
    format_diff,
    override_flags,
    registry,
    restore_flags,
    snapshot_flags,
    torch_imported,
)
from pytest_backends.flags.row import MIXED, Flag

__all__ = [
    "MIXED",
    "Flag",
    "FlagRegistry",
    "diff_flags",
    "flag_names",
    "format_diff",
    "override_flags",
    "registry",
    "restore_flags",
    "snapshot_flags",
    "torch_imported",
]
