"""Batch invariance as a feature: its settings, and the plugin it needs.

The options resolve into :class:`~pytest_backends.batch.settings.Settings`
(which also reads the baseline). The feature is always on: a test marked
``@pytest.mark.batch_invariant`` is checked whether or not a baseline is
given. :func:`plugins` returns the hook layer
(:mod:`~pytest_backends.batch.plugin`) when it can apply: with a baseline,
or on the pytest-xdist controller (which sees the workers' reports but
collects no items), at once; otherwise :func:`collected` asks for it at the
end of collection only if a collected test carries the marker, so an unmarked
session runs none of its per-test hooks and never imports it.

Importing this module never imports torch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_backends import _xdist
from pytest_backends.batch.marker import MARKER
from pytest_backends.batch.settings import SETTINGS_KEY, Settings

__all__ = ["SETTINGS_KEY", "Settings", "batch_plugin", "collected", "files", "plugins"]


def files(settings: Settings) -> list[tuple[str, Path | None, bool]]:
    """The batch baseline the settings name: ``(option, path, written)``."""
    return [("--backends-batch-baseline", settings.baseline, settings.baseline_update)]


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
    """The hook layer, with the baseline :class:`Settings` read (empty when none is given)."""
    from pytest_backends.batch.plugin import BatchPlugin
    from pytest_backends.determinism.census import Baseline

    accepted = settings.accepted if settings.accepted is not None else Baseline()
    return BatchPlugin(config, settings, accepted)
