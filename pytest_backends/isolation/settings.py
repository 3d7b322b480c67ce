"""The leak guard's settings: a leaf that the feature and its hook layer both import."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pytest_backends import _options
from pytest_backends.isolation.markers import parse_leak_mode

__all__ = ["SETTINGS_KEY", "Settings"]


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
