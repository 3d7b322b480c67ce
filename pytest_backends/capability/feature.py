"""CPU capability levels as a feature: its settings and the plugins each process needs.

``--backends-cpu-capability=LEVELS`` gives every test a ``cpu_capability``
axis (a test whose ``@pytest.mark.backends`` names levels keeps its own) and
runs each level this CPU can run in pytest-xdist workers of its own
(:mod:`~pytest_backends.capability.plan`).  The controller
(:mod:`~pytest_backends.capability.controller`) routes each level's items to
its workers; a worker (:mod:`~pytest_backends.capability.worker`) checks the
level torch really runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pytest_backends import _options, _xdist
from pytest_backends.capability import levels

__all__ = ["SETTINGS_KEY", "Settings", "parse_settings", "plugins", "prepare"]


@dataclass(frozen=True)
class Settings:
    """Resolved ``--backends-cpu-capability``: the levels, or ``None`` when off."""

    levels: tuple[str, ...] | None = None

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        """The command line wins over the ini key."""
        raw = _options.lookup(config, "backends_cpu_capability")
        return parse_settings(raw.text, raw.source)

    @property
    def required_axes(self) -> tuple[str, ...]:
        """The levels require the matrix's ``cpu_capability`` axis."""
        return () if self.levels is None else (levels.AXIS,)


SETTINGS_KEY: pytest.StashKey[Settings] = pytest.StashKey()


def parse_settings(value: str | None, source: str) -> Settings:
    """``default,avx2`` or ``all`` -> the levels; empty, ``off`` or ``none`` -> off."""
    text = (value or "").strip()
    if not text or _options.is_off(text):
        return Settings(None)
    return Settings(levels.parse_levels(text, source))


def prepare(config: pytest.Config, settings: Settings) -> None:
    """Plan the level workers before pytest-xdist starts any (it has read ``-n`` by now)."""
    from pytest_backends.capability.plan import plan_distribution

    plan_distribution(config, settings.levels)


def plugins(config: pytest.Config, settings: Settings) -> list[tuple[object, str]]:
    """The plugins this process needs for ``settings`` (the registrar registers them)."""
    found: list[tuple[object, str]] = []
    if settings.levels is None:
        return found
    # The controller and worker plugins are imported only when levels are asked for.
    from pytest_backends.capability.controller import ControllerPlugin
    from pytest_backends.capability.plan import INPUT_NOTES, WORKER_PLAN_KEY
    from pytest_backends.capability.worker import LevelAxisPlugin, WorkerPlugin

    found.append((LevelAxisPlugin(settings.levels), "backends-capability-axis"))
    if _xdist.is_worker(config):
        if _xdist.received(config, INPUT_NOTES) is not None:
            found.append((WorkerPlugin(config), "backends-capability-worker"))
        return found
    plan = config.stash.get(WORKER_PLAN_KEY, None)
    if plan is not None:
        found.append((ControllerPlugin(config, plan), "backends-capability"))
    return found
