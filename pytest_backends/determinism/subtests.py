"""Subtests counted once when ``--backends-determinism`` runs a test's call phase N times.

Each determinism run executes the test body again, so every subtest (pytest's
``subtests`` fixture, or ``unittest.TestCase.subTest``) logs one report per
run: a test with two subtests checked over five runs would show "10
subtests passed", and a failing subtest would count five times.

The reports that a test makes during its call phase are tagged with the number
of the determinism run that made them (the report property :data:`RUN_PROPERTY`,
which travels with the report to the xdist controller).  Wherever reports are counted, a subtest
report of a later run that repeats the outcome of the same subtest in run 0 is
not counted again; one whose outcome differs is (that difference is news).
A failed subtest in run 0 fails the test, so the determinism plugin stops
after that run (:func:`failed_first_run`), as it does when run 0 raises.

A subtest that fails in a later run only (the test is not repeatable) is
reported with run 0's outcome, passed: the failure is taken by the
determinism plugin (:func:`take_rerun_failure`) as the run's exception, which
makes the test "not checked", exactly as a test without subtests whose later
run raises. So subtests keep their plain outcomes under the check.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping

import pytest

from pytest_backends import _shared

__all__ = [
    "RUN_KEY",
    "RUN_PROPERTY",
    "SubtestCounter",
    "failed_first_run",
    "run_of",
    "tag",
    "take_rerun_failure",
]

#: The determinism run in progress for an item (0 for the first).
RUN_KEY: pytest.StashKey[int] = pytest.StashKey()
#: Report property: the determinism run that made the report.
RUN_PROPERTY = "backends_determinism_run"
#: Whether a subtest failed in an item's first determinism run.
_FAILED_KEY: pytest.StashKey[bool] = pytest.StashKey()
#: The exception of a subtest that failed in a later determinism run only.
_RERUN_FAILURE_KEY: pytest.StashKey[BaseException] = pytest.StashKey()

_Key = tuple[str, object, tuple[tuple[str, str], ...]]


def _context(report: pytest.TestReport) -> tuple[object, tuple[tuple[str, str], ...]] | None:
    """``(msg, kwargs)`` of a subtest report (pytest >= 9 or pytest-subtests), else ``None``."""
    context = getattr(report, "context", None)
    if context is None:
        return None
    kwargs = getattr(context, "kwargs", {})
    items = kwargs.items() if isinstance(kwargs, Mapping) else ()
    return getattr(context, "msg", None), tuple(sorted((str(k), repr(v)) for k, v in items))


def tag(report: pytest.TestReport, run: int) -> None:
    """Tag ``report`` as made by determinism run ``run``."""
    _shared.attach(report, RUN_PROPERTY, run)


def run_of(report: pytest.TestReport) -> int | None:
    """The determinism run that made ``report`` (None: not made by one)."""
    run = _shared.read(report, RUN_PROPERTY)
    return run if isinstance(run, int) else None


def failed_first_run(item: pytest.Item) -> bool:
    """Whether a subtest of ``item`` failed during determinism run 0."""
    return item.stash.get(_FAILED_KEY, False)


def take_rerun_failure(item: pytest.Item) -> BaseException | None:
    """The first exception of a subtest that failed in a later run (and forget it)."""
    failure = item.stash.get(_RERUN_FAILURE_KEY, None)
    if failure is not None:
        del item.stash[_RERUN_FAILURE_KEY]
    return failure


class SubtestCounter:
    """Tags call-phase reports with their run; counts repeated subtests once."""

    def __init__(self) -> None:
        self._first: dict[_Key, str] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        run = item.stash.get(RUN_KEY, None)
        if run is not None and call.when == "call":
            tag(report, run)
            if run == 0 and report.failed:
                item.stash[_FAILED_KEY] = True
            elif run > 0 and report.failed:
                # Run 0 passed this far: the failure is the rerun's, not the subtest's.
                if _RERUN_FAILURE_KEY not in item.stash:
                    error = call.excinfo.value if call.excinfo is not None else None
                    item.stash[_RERUN_FAILURE_KEY] = (
                        error
                        if isinstance(error, BaseException)
                        else AssertionError(f"a subtest failed in determinism run {run}")
                    )
                report.outcome = "passed"
                report.longrepr = None
        return report

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        try:
            return (yield)
        finally:
            # The test's own call report (made after this) belongs to no single run.
            if RUN_KEY in item.stash:
                del item.stash[RUN_KEY]

    def _forget(self, nodeid: str) -> None:
        self._first = {key: v for key, v in self._first.items() if key[0] != nodeid}

    def pytest_runtest_logstart(self, nodeid: str, location: object) -> None:
        self._forget(nodeid)

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(
        self, report: pytest.TestReport, config: pytest.Config
    ) -> tuple[str, str, str] | None:
        run = run_of(report)
        context = _context(report)
        if run is None or context is None:
            return None
        key = (report.nodeid, *context)
        if run == 0:
            self._first.setdefault(key, report.outcome)
            return None
        if self._first.get(key) == report.outcome:
            return "", "", ""
        return None

    def pytest_runtest_logfinish(self, nodeid: str, location: object) -> None:
        self._forget(nodeid)
