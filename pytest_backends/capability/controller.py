"""The pytest-xdist controller's side of the CPU capability levels.

It hands each new worker its level, routes each level's items to that
level's workers, names the signal and the config of a test that crashed its
worker, and turns SIGTERM into an orderly shutdown that takes the workers
down.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from pytest_backends import _shared, _xdist
from pytest_backends._process import describe_exit, exit_status
from pytest_backends.capability import levels
from pytest_backends.capability.notes import Notes, fault_tail
from pytest_backends.capability.plan import (
    INPUT_ASKED,
    INPUT_LEVEL,
    INPUT_LEVELS,
    INPUT_NOTES,
    INPUT_WARN,
    OUTPUT_DESELECTED,
    WorkerPlan,
)
from pytest_backends.capability.scheduler import LevelScheduling, level_in_nodeid, node_level

__all__ = ["ControllerPlugin"]


class ControllerPlugin:
    """The xdist controller's side of the CPU levels."""

    def __init__(self, config: pytest.Config, plan: WorkerPlan) -> None:
        self.config = config
        self.plan = plan
        self.notes = Notes(Path(tempfile.mkdtemp(prefix="pytest-backends-levels-")))
        self._warned_home = False
        self._deselected = 0
        self._previous_sigterm: Any = None
        self._failures = 0
        self._terminated = False

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        plan = self.plan
        each = "worker" if plan.per_level == 1 else "workers"
        line = (
            f"backends: CPU capability levels {', '.join(plan.levels)}; "
            f"{plan.per_level} xdist {each} per level"
        )
        if plan.marker_only:
            line += (
                f"; 1 worker each for {', '.join(plan.marker_only)}, for the tests whose "
                "marker names them"
            )
        if plan.unsupported:
            line += f" (no workers for {', '.join(plan.unsupported)}: this CPU cannot run them)"
        isas = [(level, levels.onednn_isa_of(level)) for level in plan.runnable]
        if any(isa for _, isa in isas):
            line += "; oneDNN ISA per level: " + ", ".join(
                f"{level} {isa or 'not capped'}" for level, isa in isas
            )
        fake = os.environ.get(levels.FAKE_FEATURES_ENV)
        if fake:
            line += f" (CPU features edited by {levels.FAKE_FEATURES_ENV}={fake})"
        return [line]

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """Tell a new worker its level, the levels that have workers and where to leave notes."""
        level = node_level(node)
        _xdist.send(node, INPUT_LEVEL, level)
        _xdist.send(node, INPUT_LEVELS, [lv for lv in self.plan.worker_levels if lv])
        _xdist.send(node, INPUT_ASKED, list(self.plan.runnable))
        _xdist.send(node, INPUT_NOTES, str(self.notes.root))
        home = level == self.plan.worker_levels[0] and not self._warned_home
        _xdist.send(node, INPUT_WARN, home)
        self._warned_home = self._warned_home or home

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> LevelScheduling:
        """Route each level's items to that level's workers."""
        return LevelScheduling(config, self.plan.worker_levels, len(self.plan.specs))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """Every worker deselects the same items: keep the count once, not per worker."""
        deselected = int(_xdist.collected(node, OUTPUT_DESELECTED, 0) or 0)
        self._deselected = max(self._deselected, deselected)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """Say which level's worker died, how, in which config, and what happens next."""
        node = getattr(report, "node", None)
        worker = str(node.gateway.id) if node is not None else "?"
        level = (node_level(node) if node is not None else None) or level_in_nodeid(crashitem)
        tag = f"the {levels.level_id(level)} worker" if level else "the worker"
        how = "died"
        with contextlib.suppress(OSError, ValueError):
            pid = int(self.notes.pid(worker).read_text())
            status = exit_status(pid)
            if status is not None:
                how = describe_exit(status)
        config_id = None
        with contextlib.suppress(OSError, ValueError):
            current = json.loads(self.notes.current(worker).read_text())
            if current.get("nodeid") == crashitem:
                config_id = current.get("config")
        dump = ""
        with contextlib.suppress(OSError):
            dump = fault_tail(self.notes.fault(worker).read_text(errors="replace"))
        message = (
            f"crashed {tag} {worker} ({how}) while running this test. "
            "The level's remaining tests run on a replacement worker."
        )
        if dump:
            message += f" The worker's last output:\n{dump}"
        report.longrepr = message
        report.when = "call"
        path, _, name = crashitem.partition("::")
        report.location = (path, None, name.replace("::", ".") or path)
        if config_id is not None:
            _shared.attach(report, _shared.PROPERTY_CONFIG, str(config_id))

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # SIGTERM would end the controller at once and leave its workers behind;
        # as an interrupt, xdist tears them down first.
        with contextlib.suppress(ValueError):  # not the main thread
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._interrupt)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self._failures += 1

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # xdist ends a run that -x/--maxfail stops as interrupted (exit code 2);
        # without workers pytest says "tests failed" (1), and so does a level run.
        maxfail = int(self.config.getoption("maxfail", 0) or 0)
        if (
            session.exitstatus == pytest.ExitCode.INTERRUPTED
            and not self._terminated
            and maxfail
            and self._failures >= maxfail
        ):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self._deselected and not terminalreporter.stats.get("deselected"):
            terminalreporter.write_line(
                f"backends: {self._deselected} deselected (the same items in every worker, "
                "counted once)"
            )

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        self._terminated = True
        raise KeyboardInterrupt(f"pytest received {signal.Signals(signum).name}")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._previous_sigterm is not None:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, self._previous_sigterm)
        shutil.rmtree(self.notes.root, ignore_errors=True)
