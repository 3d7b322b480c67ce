"""The leak guard as a feature: its settings (``--backends-leaks``) and its plugin."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pytest_backends import _options
from pytest_backends.isolation.guard import IsolationPlugin
from pytest_backends.isolation.markers import parse_leak_mode

__all__ = ["SETTINGS_KEY", "Settings", "plugins"]


@dataclass(frozen=True)
class Settings:
    """The resolved ``--backends-leaks`` mode (``fail``, ``warn`` or ``off``)."""

    mode: str

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        """Resolve the leak mode once: command line wins over ini (``fail`` by default)."""
        raw = _options.lookup(config, "backends_leaks")
        return cls(parse_leak_mode(raw.text or "fail", raw.source))


#: Where the registrar stores the :class:`Settings`.
SETTINGS_KEY: pytest.StashKey[Settings] = pytest.StashKey()


def plugins(config: pytest.Config, settings: Settings) -> list[tuple[object, str]]:
    """The guard's plugin; it runs in every process, also with ``--backends-leaks=off``.

    Off, it still applies the flags the matrix gives an item and restores them.
    """
    return [(IsolationPlugin(settings), "backends-isolation")]
