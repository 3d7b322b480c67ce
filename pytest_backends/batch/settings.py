"""The batch-invariance settings: a leaf that the feature and its hook layer both import.

``--backends-batch-baseline`` and ``--backends-batch-baseline-update`` (and
their ini twins) are resolved once, through
:func:`pytest_backends._options.lookup`; a baseline given is read and
validated here too, so that a bad file is a usage error before any test runs.

Importing this module never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_backends import _options

if TYPE_CHECKING:
    from pytest_backends.determinism.census import Baseline

__all__ = ["SETTINGS_KEY", "Settings"]


@dataclass(frozen=True)
class Settings:
    """The resolved batch-invariance options, and the baseline they name (read once)."""

    baseline: Path | None = None
    baseline_update: bool = False
    #: The baseline file's contents (None: no baseline given).
    accepted: Baseline | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        """Resolve ``--backends-batch-baseline`` and ``--backends-batch-baseline-update`` once."""
        raw = _options.lookup(config, "backends_batch_baseline")
        baseline: Path | None = None
        if raw.text.strip():
            base = Path(config.invocation_params.dir) if raw.from_cli else config.rootpath
            baseline = base / raw.text.strip()
        elif raw.from_cli:
            raise pytest.UsageError(
                "--backends-batch-baseline: expected a file path, got an empty value"
            )
        update = bool(_options.lookup(config, "backends_batch_baseline_update").value)
        if update and baseline is None:
            raise pytest.UsageError(
                "--backends-batch-baseline-update: name the file to write with "
                "--backends-batch-baseline=PATH"
            )
        if baseline is None:
            return cls(None, update)
        from pytest_backends.determinism.census import load_baseline

        accepted = load_baseline(config, baseline, update, "--backends-batch-baseline")
        return cls(baseline, update, accepted)


#: Where the registrar stores the :class:`Settings`.
SETTINGS_KEY: pytest.StashKey[Settings] = pytest.StashKey()
