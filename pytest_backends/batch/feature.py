"""Batch invariance as a feature: its settings, and the plugin it needs.

``--backends-batch-baseline`` and ``--backends-batch-baseline-update`` (and
their ini twins) are resolved once, through
:func:`pytest_backends._options.lookup`, into :class:`Settings`. The feature
is always on: a test marked ``@pytest.mark.batch_invariant`` is checked
whether or not a baseline is given. :func:`plugins` loads the baseline and
returns the hook layer (:mod:`~pytest_backends.batch.plugin`) when it can
apply: with a baseline, or on the pytest-xdist controller (which sees the
workers' reports but collects no items), at once; otherwise :func:`collected`
asks for it at the end of collection only if a collected test carries the
marker, so an unmarked session runs none of its per-test hooks and never
imports it.

Importing this module never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_backends import _options, _xdist
from pytest_backends.batch.marker import MARKER

__all__ = ["SETTINGS_KEY", "Settings", "batch_plugin", "collected", "plugins"]


@dataclass(frozen=True)
class Settings:
    """The resolved batch-invariance options."""

    baseline: Path | None = None
    baseline_update: bool = False

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
        return cls(baseline, update)


#: Where the registrar stores the :class:`Settings`.
SETTINGS_KEY: pytest.StashKey[Settings] = pytest.StashKey()


def plugins(config: pytest.Config, settings: Settings) -> list[tuple[object, str]]:
    """The batch plugin if it can already apply (a baseline; the xdist controller), else none."""
    if settings.baseline is not None or _xdist.is_controller(config):
        return [(batch_plugin(config, settings), "backends-batch")]
    return []


def collected(
    config: pytest.Config, settings: Settings, items: list[pytest.Item]
) -> list[tuple[object, str]]:
    """The batch plugin, once collection ends, if a collected test carries the marker."""
    if config.pluginmanager.has_plugin("backends-batch"):
        return []
    if any(item.get_closest_marker(MARKER) is not None for item in items):
        return [(batch_plugin(config, settings), "backends-batch")]
    return []


def batch_plugin(config: pytest.Config, settings: Settings) -> object:
    """Load the baseline (warning when it was recorded under other versions); the plugin."""
    from pytest_backends.batch.plugin import BatchPlugin
    from pytest_backends.determinism.census import (
        Baseline,
        BaselineVersionWarning,
        CensusFileError,
        Versions,
    )

    baseline = Baseline()
    if settings.baseline is not None:
        try:
            baseline = Baseline.load(settings.baseline)
        except CensusFileError as exc:
            missing = not settings.baseline.exists()
            if not (missing and settings.baseline_update):
                hint = " (create it with --backends-batch-baseline-update)" if missing else ""
                raise pytest.UsageError(f"--backends-batch-baseline: {exc}{hint}") from None
        if not _xdist.is_worker(config) and baseline.versions is not None:
            message = baseline.version_mismatch(settings.baseline, Versions.current())
            if message:
                config.issue_config_time_warning(BaselineVersionWarning(message), stacklevel=2)
    return BatchPlugin(config, settings, baseline)
