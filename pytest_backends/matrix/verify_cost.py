"""What ``--backends-verify`` costs, said in the terminal summary.

Verification profiles every op of a verified test's call phase, which can make
a suite many times slower.  :class:`TimedVerifyPlugin` is the verifier with
its call-phase wrapper timed: the time spent in the wrapper itself (starting
and stopping the profiler, collecting its events, checking the promises), not
in the test it wraps.  That time travels on the call report as the
property :data:`SECONDS_PROPERTY`, so the xdist controller sums it, and the summary gives
the total, the mean per verified test and the slowest test, beside the call
time of those tests (which includes the profiler's per-op cost).
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_backends import _shared, _xdist
from pytest_backends.matrix.configs import BackendConfig
from pytest_backends.matrix.verify import VerifyPlugin, promises_for

__all__ = ["SECONDS_KEY", "SECONDS_PROPERTY", "CostSummary", "TimedVerifyPlugin"]

#: Report property: seconds the verifier itself spent around one test's call phase.
SECONDS_PROPERTY = "backends_verify_seconds"
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


class TimedVerifyPlugin(VerifyPlugin):
    """:class:`~pytest_backends.matrix.verify.VerifyPlugin` with its own time measured."""

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
        return report


@dataclass(eq=False)  # pytest keeps plugins in a set: identity hashing
class CostSummary:
    """The verifier's time over the reports of a run (controller side)."""

    tests: int = 0
    own: float = 0.0
    calls: float = 0.0
    slowest: tuple[float, str] = (0.0, "")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        seconds = _shared.read(report, SECONDS_PROPERTY)
        if seconds is None or report.when != "call" or str(report.outcome) == "rerun":
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
        return [
            f"verified {self.tests} test(s): the verifier's own time {self.own:.2f} s "
            f"(mean {mean * 1000:.1f} ms per test, slowest {slowest * 1000:.1f} ms in {nodeid})",
            f"call phases of the verified tests: {self.calls:.2f} s, the profiler's per-op "
            "cost included; run without --backends-verify to compare",
        ]

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        if _xdist.is_worker(config):
            return
        lines = self.lines()
        if lines:
            terminalreporter.section("backends verify cost")
            for line in lines:
                terminalreporter.line(line)
