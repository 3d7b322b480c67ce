"""The contract every feature meets, so that the registrar can walk them all.

A feature is a module with three names:

* ``Settings``: a frozen class with ``from_config(config)``, which resolves
  the feature's options through :func:`pytest_backends._options.lookup` (the
  one resolver) and raises :class:`pytest.UsageError` on bad input.  A
  feature that is off still has settings that say so.  Settings may carry
  ``required_axes``: matrix axes every matrix test must then run along.
* ``SETTINGS_KEY``: the ``config.stash`` key the registrar stores them under.
* ``plugins(config, settings)``: the ``(plugin, name)`` pairs this process
  needs (none when the feature is off); the registrar registers them.

Optional: ``prepare(config, settings)`` runs in ``pytest_cmdline_main``,
before pytest-xdist starts workers; ``READS_REQUIRED_AXES = True`` makes the
feature resolve after those whose settings declare ``required_axes``;
``collected(config, settings, items)`` runs when collection finishes and
returns more ``(plugin, name)`` pairs, so that a feature registers per-test
hooks only when a collected test needs them; ``files(settings)`` lists the
``(option, path, written)`` files the settings name, so that the registrar
refuses two options naming one file where either writes it.

Nothing but :mod:`pytest_backends.plugin` resolves settings or registers.
"""

from __future__ import annotations

from typing import Any, Protocol

import pytest

__all__ = ["Feature", "FeatureSettings"]


class FeatureSettings(Protocol):
    """What the registrar needs of a feature's ``Settings`` class."""

    @classmethod
    def from_config(cls, config: pytest.Config) -> Any:
        """Resolve the feature's options for ``config`` (raises ``pytest.UsageError``)."""


class Feature(Protocol):
    """A feature module (see the module docstring)."""

    @property
    def Settings(self) -> type[FeatureSettings]:
        """The feature's settings class."""

    @property
    def SETTINGS_KEY(self) -> pytest.StashKey[Any]:
        """Where the registrar stores the settings."""

    def plugins(self, config: pytest.Config, settings: Any) -> list[tuple[object, str]]:
        """The plugins this process needs for ``settings`` (not registered)."""
