"""A CPU capability level's pytest-xdist worker, and the level axis every process adds.

The worker checks, before its first test, that torch really runs the level
it was started for; refuses items of another level; and leaves notes
(:mod:`~pytest_backends.capability.notes`) for the controller in case it
dies.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import unittest
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import IO

import pytest

from pytest_backends import _shared, _xdist
from pytest_backends.capability import levels
from pytest_backends.capability.notes import Notes
from pytest_backends.capability.plan import (
    INPUT_ASKED,
    INPUT_LEVEL,
    INPUT_LEVELS,
    INPUT_NOTES,
    INPUT_WARN,
    OUTPUT_DESELECTED,
)
from pytest_backends.capability.scheduler import level_in_nodeid

__all__ = ["CapabilityWarning", "LevelAxisPlugin", "WorkerPlugin"]

_MARKER = "backends"


class CapabilityWarning(pytest.PytestWarning):
    """A test does not run at every CPU capability level that was asked for."""


class LevelAxisPlugin:
    """Gives every test without a ``cpu_capability`` marker value the option's levels.

    Registered in every process, so collection is identical everywhere.
    """

    def __init__(self, wanted: tuple[str, ...]) -> None:
        self.levels = wanted

    @pytest.hookimpl(tryfirst=True)
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        for mark in metafunc.definition.iter_markers(_MARKER):
            if levels.AXIS in mark.kwargs or levels.AXIS in mark.args:
                return
        metafunc.definition.add_marker(pytest.mark.backends(**{levels.AXIS: list(self.levels)}))


class WorkerPlugin:
    """A level's worker: verifies its level and leaves notes for the controller."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        raw = _xdist.received(config, INPUT_LEVEL)
        self.level: str | None = None if raw is None else str(raw)
        self.worker_levels = tuple(str(lv) for lv in _xdist.received(config, INPUT_LEVELS, ()))
        self.asked = tuple(str(lv) for lv in _xdist.received(config, INPUT_ASKED, ()))
        self.warn = bool(_xdist.received(config, INPUT_WARN))
        self.worker = _xdist.worker_id(config) or "gw"
        self.notes = Notes(Path(str(_xdist.received(config, INPUT_NOTES))))
        self._fault: IO[str] | None = None
        self._mismatch: str | None = None
        self._checked = False
        self._deselected = 0
        self._homeless: list[str] = []

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        with contextlib.suppress(OSError):
            self.notes.pid(self.worker).write_text(str(os.getpid()))
            self._fault = self.notes.fault(self.worker).open("w")
            faulthandler.enable(file=self._fault, all_threads=True)
        _die_with_parent()

    def pytest_deselected(self, items: Sequence[pytest.Item]) -> None:
        self._deselected += len(items)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # After collection_modifyitems has finished, wrappers included: the matrix
        # gives items their configs there, after every other implementation.
        if not self.warn or self.level is None:
            return
        for item in session.items:
            # Runs at one level: no config, or one without the level axis (a TestCase
            # method marked with other axes, which the level axis never reaches).
            config = item.stash.get(_shared.CONFIG_KEY, None)
            if config is None or levels.AXIS not in config.axes:
                self._homeless.append(item.nodeid)
                item.warn(CapabilityWarning(self._why_once(item)))

    def _why_once(self, item: pytest.Item) -> str:
        cls = getattr(item, "cls", None)
        if isinstance(cls, type) and issubclass(cls, unittest.TestCase):
            what = "it is a unittest.TestCase method, and pytest runs those without parametrization"
            named = ", ".join(repr(lv) for lv in self.asked)
            fix = (
                f"name the levels in its marker, @pytest.mark.backends(cpu_capability=[{named}]), "
                "or write it as a pytest test function (or a method of a plain class)"
            )
        else:
            what = f"pytest cannot parametrize a {type(item).__name__} item"
            fix = "run it separately with ATEN_CPU_CAPABILITY=<level> if it depends on the level"
        others = [lv for lv in self.asked if lv != self.level]
        return (
            f"{item.nodeid} runs once, at CPU capability level {self.level}, not at "
            f"{', '.join(others) or 'the other levels'}: {what}; {fix}"
        )

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self.level is not None and not self._checked:
            self._checked = True
            self._mismatch = levels.verify_level(self.level) or levels.verify_onednn(self.level)
        if self._mismatch is not None:
            pytest.fail(self._mismatch, pytrace=False)
        config = item.stash.get(_shared.CONFIG_KEY, None)
        wanted = None if config is None else config.axes.get(levels.AXIS)
        if wanted in self.worker_levels and wanted != self.level:
            pytest.fail(
                f"{levels.level_id(str(wanted))} item sent to a worker of level {self.level}; "
                "its id does not name its level the way the scheduler reads it "
                f"({level_in_nodeid(item.nodeid)!r}): rename the parameter id that "
                "contains 'cap-<level>'",
                pytrace=False,
            )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        # The controller reads this note if the worker dies during the test.
        config = item.stash.get(_shared.CONFIG_KEY, None)
        note = {"nodeid": item.nodeid, "config": None if config is None else config.id}
        with contextlib.suppress(OSError):
            self.notes.current(self.worker).write_text(json.dumps(note))
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, object, object]:
        _xdist.put(self.config, OUTPUT_DESELECTED, self._deselected)
        return (yield)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._fault is not None:
            with contextlib.suppress(Exception):
                faulthandler.disable()
            self._fault.close()


def _die_with_parent() -> None:
    """Ask Linux to end this worker if the controller dies without tearing it down."""
    if not hasattr(os, "getppid") or not Path("/proc/self").exists():
        return
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
