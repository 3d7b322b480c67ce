"""The leak guard as a feature: its settings (``--backends-leaks``) and its plugin."""

from __future__ import annotations

import pytest

from pytest_backends.isolation.guard import IsolationPlugin
from pytest_backends.isolation.settings import SETTINGS_KEY, Settings

__all__ = ["SETTINGS_KEY", "Settings", "plugins"]


def plugins(config: pytest.Config, settings: Settings) -> list[tuple[object, str]]:
    """The guard's plugin; it runs in every process, also with ``--backends-leaks=off``.

    Off, it still applies the flags the matrix gives an item and restores them.
    """
    return [(IsolationPlugin(settings), "backends-isolation")]
