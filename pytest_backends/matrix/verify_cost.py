"""What ``--backends-verify`` costs, said in the terminal summary.

Verification profiles every op of a verified test's call phase, which can make
a suite many times slower.  :class:`TimedVerifyPlugin` is the verifier with
its call-phase wrapper timed: the time spent in the wrapper itself (starting
and stopping the profiler, collecting its events, checking the promises), not
in the test it wraps.  That time travels on the call report as the
property :data:`SECONDS_PROPERTY`, so the xdist controller sums it, and the summary gives
the total, the mean per verified test and the slowest test, beside the call
time of those tests (which includes the profiler's per-op cost).

The profiler's one-time start-up (seconds, more on a loaded machine) is paid
before the first test of each process that will verify one, so no test's
duration carries it; the summary gives it on a line of its own
(:data:`STARTUP_PROPERTY`).
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_backends import _shared, _xdist
from pytest_backends.matrix.configs import BackendConfig
from pytest_backends.matrix.verify import VerifyPlugin, promises_for

__all__ = [
    "SECONDS_KEY",
    "SECONDS_PROPERTY",
    "STARTUP_PROPERTY",
    "CostSummary",
    "TimedVerifyPlugin",
    "warm_up",
]

#: Report property: seconds the verifier itself spent around one test's call phase.
SECONDS_PROPERTY = "backends_verify_seconds"
#: Report property (first verified test of a process): the profiler's one-time start-up.
STARTUP_PROPERTY = "backends_verify_startup_seconds"
#: Those seconds on the item, until its call report is made.
SECONDS_KEY: pytest.StashKey[float] = pytest.StashKey()


def _drive(
    inner: Generator[None, object, object], item: pytest.Item
) -> Generator[None, object, object]:
    """Run the hook wrapper ``inner`` as a wrapper, timing everything but its ``yield``."""
    own = 0.0
    started = time.perf_counter()
    try:
        next(inner)
    except StopIteration as stop:  # pragma: no cover - a wrapper must yield once
        item.stash[SECONDS_KEY] = time.perf_counter() - started
        return stop.value
    own += time.perf_counter() - started
    try:
        try:
            result = yield
        except BaseException as exc:
            started = time.perf_counter()
            inner.throw(exc)
        else:
            started = time.perf_counter()
            inner.send(result)
    except StopIteration as stop:
        return stop.value
    finally:
        item.stash[SECONDS_KEY] = own + time.perf_counter() - started
    raise RuntimeError("the verifier's hook wrapper yielded twice")  # pragma: no cover


def warm_up() -> float:
    """Start and stop the profiler once, so its one-time start-up is paid here; the seconds."""
    from pytest_backends.matrix.op_recorder import ProfilerOpRecorder

    started = time.perf_counter()
    recorder = ProfilerOpRecorder(shapes=True, cuda=False)
    if recorder.start():
        recorder.stop()
    return time.perf_counter() - started


class TimedVerifyPlugin(VerifyPlugin):
    """:class:`~pytest_backends.matrix.verify.VerifyPlugin` with its own time measured."""

    startup: float | None = None
    _startup_told = False

    # Before the run loop (xdist's worker loop included), not inside any test's phases.
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        if session.config.option.collectonly or self.startup is not None:
            return
        if any(self._verifies(item) for item in session.items):
            self.startup = warm_up()

    def _verifies(self, item: pytest.Item) -> bool:
        config = item.stash.get(_shared.CONFIG_KEY, None)
        return isinstance(config, BackendConfig) and bool(promises_for(config, self.table))

    # trylast like the verifier it times: inside pytest's capture wrapper, so that the
    # oneDNN primitive log can redirect file descriptor 1 after pytest has.
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        config = item.stash.get(_shared.CONFIG_KEY, None)
        if not isinstance(config, BackendConfig) or not promises_for(config, self.table):
            return (yield)  # nothing to verify, nothing to time
        return (yield from _drive(super().pytest_runtest_call(item), item))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        seconds = item.stash.get(SECONDS_KEY, None)
        if seconds is not None and call.when == "call" and not hasattr(report, "context"):
            _shared.attach(report, SECONDS_PROPERTY, seconds)
            if self.startup is not None and not self._startup_told:
                self._startup_told = True
                _shared.attach(report, STARTUP_PROPERTY, self.startup)
        return report


@dataclass(eq=False)  # pytest keeps plugins in a set: identity hashing
class CostSummary:
    """The verifier's time over the reports of a run (controller side)."""

    tests: int = 0
    own: float = 0.0
    calls: float = 0.0
    slowest: tuple[float, str] = (0.0, "")
    startups: list[float] = field(default_factory=list)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        seconds = _shared.read(report, SECONDS_PROPERTY)
        if seconds is None or report.when != "call":
            return
        startup = _shared.read(report, STARTUP_PROPERTY)
        if startup is not None:
            self.startups.append(float(startup))
        if str(report.outcome) == "rerun":
            return
        self.tests += 1
        self.own += float(seconds)
        self.calls += float(report.duration)
        self.slowest = max(self.slowest, (float(seconds), report.nodeid))

    def lines(self) -> list[str]:
        """The summary lines (empty when nothing was verified)."""
        if not self.tests:
            return []
        mean = self.own / self.tests
        slowest, nodeid = self.slowest
        startup = []
        if self.startups:
            each = "process" if len(self.startups) == 1 else "processes"
            startup = [
                f"the profiler's one-time start-up: {sum(self.startups):.2f} s in "
                f"{len(self.startups)} {each}, before the first test (in no test's time)"
            ]
        return [
            f"verified {self.tests} test(s): the verifier's own time {self.own:.2f} s "
            f"(mean {mean * 1000:.1f} ms per test, slowest {slowest * 1000:.1f} ms in {nodeid})",
            f"call phases of the verified tests: {self.calls:.2f} s, the profiler's per-op "
            "cost included; run without --backends-verify to compare",
            *startup,
        ]

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        if _xdist.is_worker(config):
            return
        lines = self.lines()
        if lines:
            terminalreporter.section("backends verify cost")
            for line in lines:
                terminalreporter.line(line)
