"""The determinism check's hooks: they adapt pytest to the check, and add up the verdicts.

Registered by the registrar (:mod:`pytest_backends.plugin`) through
:func:`pytest_backends.determinism.feature.plugins` when the check is on. A
selected test's call phase runs ``N`` times (:mod:`~pytest_backends.determinism.runs`):
the global RNGs are reset to the state they had when the call phase began, and
every op is recorded (natively where the extension is built, else by
:class:`~pytest_backends.determinism.record_python.PythonRecorder`). Setup
and teardown run once, so function-scoped fixture values are shared by all
runs. What the runs left goes to :func:`~pytest_backends.determinism.check.check`,
which runs the pipeline (compare, locate, verdict, census entry) and gives the
verdict; this module attaches it to the test's reports and raises its failure.

The check never changes the outcome of a test whose ops are deterministic:
runs that differ only because their inputs differ (Python state outside torch
ops), reruns that raise where run 0 passed, and failures of the harness's own
machinery give the verdict "not checked" with the reason, and the test keeps
run 0's outcome. ``--backends-determinism-repeatable`` fails such tests instead.
When a rerun raises after the runs differed at an op, the op decides: one the
baseline does not accept fails the test (the rerun's exception is the
failure's cause), an accepted one leaves it not checked with run 0's outcome.

Each test's verdicts travel on its call and teardown reports as properties
(:data:`pytest_backends._shared.PROPERTY_CENSUS` and
:data:`~pytest_backends._shared.PROPERTY_CHECK`; JUnit XML writes the
teardown report's), and whichever process logs the call report adds them to
the census. So the census is built from the same
stream as the terminal results: a worker that crashes loses nothing that it
had already reported.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_backends import _shared, _xdist
from pytest_backends.determinism import verdict
from pytest_backends.determinism.api import NondeterministicOpError
from pytest_backends.determinism.census import (
    Baseline,
    Census,
    CensusFileError,
    Key,
    Versions,
    entry_verdicts,
)

if TYPE_CHECKING:
    from pytest_backends.determinism.check import Verdict
    from pytest_backends.determinism.runs import CompileWatch, Runs
    from pytest_backends.determinism.settings import Settings

__all__ = ["DeterminismPlugin"]

#: One item's determinism verdict, until its reports are made.
_VERDICT_KEY: pytest.StashKey[Verdict] = pytest.StashKey()


def _selected(item: pytest.Item, select_all: bool) -> bool:
    if not isinstance(item, pytest.Function):
        return False
    if select_all:
        return True
    return any(
        "deterministic" in marker.kwargs or "deterministic" in marker.args
        for marker in item.iter_markers("backends")
    )


class DeterminismPlugin:
    """Re-runs selected tests, records the census and enforces the baseline."""

    def __init__(self, config: pytest.Config, settings: Settings, baseline: Baseline) -> None:
        self.config = config
        self.settings = settings
        self.baseline = baseline
        self.census = Census()
        self._errors: list[str] = []
        self._compile_watch: CompileWatch | None = None
        self._checked = 0
        self._unchecked: dict[str, str] = {}
        self._boundary: dict[str, list[str]] = {}
        self._written: set[Path] = set()
        self._recorders: set[str] = set()

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        import sys

        from pytest_backends.determinism.runs import note_session

        # The threads running now, from code outside the rootdir, are pytest's plugins'.
        note_session(session.config.rootpath)
        if "torch" in sys.modules:
            # Wrap the exports to NumPy and DLPack before test modules bind them.
            from pytest_backends.determinism import outside

            outside.install()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        from pytest_backends._selected import record

        selected = sum(1 for item in session.items if _selected(item, self.settings.select_all))
        if self.settings.census is not None:
            # The census has a batch-invariance section too: its tests are a selection.
            selected += sum(
                1 for item in session.items if item.get_closest_marker("batch_invariant")
            )
        record(
            self.config,
            self.settings.option,
            selected,
            (
                "no collected test is marked @pytest.mark.backends(deterministic=...); mark the "
                "tests to check, or check every test with --backends-determinism-all"
            ),
        )

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        if not _selected(item, self.settings.select_all):
            return (yield)
        from pytest_backends.determinism.runs import (
            RUN_KEY,
            Runs,
            Start,
            failed_first_run,
            repeat,
            run_again,
            stored_outcome,
        )

        start = Start.capture(item)
        runs = Runs(self._watch())
        runs.begin()
        item.stash[RUN_KEY] = 0
        try:
            result = yield
        except BaseException as exc:
            runs.end(exc)
            self._check(item, runs, first=exc, expected_failure=_xfail_expected(item, exc))
            raise
        # A unittest.TestCase stores its failure, skip or xfail instead of raising it.
        stored = stored_outcome(item, 0)
        runs.end(stored)
        if stored is not None or failed_first_run(item):
            self._check(item, runs, first=stored)
            return result
        # A run that compiled is a warm-up: one more run is compared in its place.
        total = self.settings.runs + (1 if runs.records[0].compiled else 0)
        raised = repeat(item, runs, start, total)
        found = self._check(
            item,
            runs,
            raised=raised,
            complete=raised is None,
            restore=start.restore,
            run_again=lambda: run_again(item),
        )
        if raised is not None and found.rerun_is_outcome:
            run, error = raised
            if hasattr(error, "add_note"):
                error.add_note(f"(raised in determinism run {run} of {total}; run 0 passed)")
            raise error
        if found.failure is not None:
            # An op decided the verdict; a later run's exception is only its context.
            raise found.failure from (None if raised is None else raised[1])
        return result

    def _watch(self) -> CompileWatch:
        if self._compile_watch is None:
            from pytest_backends.determinism.runs import CompileWatch

            self._compile_watch = CompileWatch()
        return self._compile_watch

    def _check(self, item: pytest.Item, runs: Runs, **stopped: Any) -> Verdict:
        """Check ``item``'s runs with :func:`~pytest_backends.determinism.check.check`.

        The verdict is kept for the test's reports and returned.

        ``stopped`` are the :class:`~pytest_backends.determinism.check.Recorded`
        fields that say how the runs ended.
        """
        from pytest_backends.determinism.carried import carried_state
        from pytest_backends.determinism.check import Recorded, check
        from pytest_backends.determinism.rng_objects import reached
        from pytest_backends.determinism.runs import failed_first_run

        recorded = Recorded(
            runs.records,
            runs.failure,
            runs.described,
            runs.native(),
            subtest_failed=failed_first_run(item),
            carried=lambda: carried_state(item, reached(item)),
            **stopped,
        )
        found = check(recorded, self.settings, self.baseline)
        item.stash[_VERDICT_KEY] = found
        return found

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        found = item.stash.get(_VERDICT_KEY, None)
        if found is not None:
            if found.census is not None:
                _shared.attach(report, _shared.PROPERTY_CENSUS, found.census)
            _shared.attach(report, _shared.PROPERTY_CHECK, found.as_property())
        if call.excinfo is not None and isinstance(call.excinfo.value, NondeterministicOpError):
            # The harness's own frames say nothing useful: show the finding alone.
            report.longrepr = str(call.excinfo.value)
            if hasattr(report, "wasxfail"):
                # A finding is not the failure an xfail marker expects: the test fails.
                del report.wasxfail
                report.outcome = "failed"
                report.longrepr += (
                    "\n  (the test is marked xfail, but a finding of the determinism check is "
                    "not the failure the marker expects, so the test fails)"
                )
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if _xdist.is_worker(self.config):
            return
        check = _shared.read(report, _shared.PROPERTY_CHECK, call=True)
        if isinstance(check, dict):
            reason, notes = check.get("reason"), list(check.get("boundary") or [])
            if check.get("recorder"):
                self._recorders.add(str(check["recorder"]))
            if reason:
                self._unchecked[report.nodeid] = str(reason)
            else:
                self._checked += 1
            if notes:
                self._boundary[report.nodeid] = [str(n) for n in notes]
            self.census.add_check(report.nodeid, reason, notes)
        rows = _shared.read(report, _shared.PROPERTY_CENSUS, call=True)
        if not rows:
            return
        self.census.add_test(report.nodeid, entry_verdicts(rows))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        config = session.config
        if _xdist.is_worker(config):
            return
        settings = self.settings
        versions = Versions.current() if (settings.census or settings.baseline) else None
        if settings.census is not None and versions is not None:
            try:
                from pytest_backends.matrix.availability import run_label

                self.census.write(
                    settings.census, runs=settings.runs, versions=versions, label=run_label(config)
                )
            except CensusFileError as exc:
                self._errors.append(f"--backends-census: {exc}")
            else:
                self._written.add(settings.census)
                config.stash[_shared.CENSUS_WRITTEN_KEY] = settings.census
        if settings.baseline is not None and versions is not None:
            if settings.baseline_update:
                updated = self.baseline.updated(self.census)
                try:
                    updated.write(settings.baseline, versions)
                except CensusFileError as exc:
                    self._errors.append(f"--backends-baseline-update: {exc}")
                else:
                    self._written.add(settings.baseline)
            elif unaccepted := self._unaccepted():
                ops = ", ".join(verdict.format_key(k) for k in unaccepted)
                _shared.fail_session(
                    config,
                    "nondeterministic ops not in the baseline",
                    f"{len(unaccepted)} op(s) not in {settings.baseline}: {ops}",
                )
                if session.exitstatus == pytest.ExitCode.OK:
                    session.exitstatus = pytest.ExitCode.TESTS_FAILED
        for error in self._errors:
            _shared.fail_session(config, "pytest-backends determinism", error)
        if self._errors and session.exitstatus in (
            pytest.ExitCode.OK,
            pytest.ExitCode.NO_TESTS_COLLECTED,
        ):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _unaccepted(self) -> dict[Key, list[str]]:
        """Nondeterministic ops of the census that the baseline does not accept."""
        return {
            key: tests
            for key, tests in self.census.nondeterministic().items()
            if not self.baseline.accepts(key)
        }

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        if _xdist.is_worker(config):
            return
        settings = self.settings
        nondet = self.census.nondeterministic()
        write = terminalreporter.write_line
        if not (nondet or settings.census or settings.baseline or self._unchecked or self._checked):
            return
        terminalreporter.section("determinism", sep="=")
        for error in self._errors:
            write(f"ERROR: {error}", red=True)
        for recorder in sorted(self._recorders):
            write(f"recorder: {recorder}")
        write(f"{len(self.census)} op keys (op, device, dtype) recorded over {settings.runs} runs")
        unchanged = sum(
            1 for key in self.census.op_keys() if self.census.verdict(key) == "deterministic"
        )
        if unchanged:
            write(
                f"{unchanged} op key(s) showed no difference in {settings.runs} runs (a sample, "
                "not a proof: a race can show only now and then)"
            )
        write(
            f"{self._checked} test(s) checked, {len(self._unchecked)} not checked, "
            f"{len(self._boundary)} checked partly at a boundary"
        )
        for nodeid, reason in sorted(self._unchecked.items()):
            write(f"not checked: {nodeid}: {reason}", yellow=True)
        for key, tests in nondet.items():
            if settings.baseline is None:
                status = "NONDETERMINISTIC"
            elif self.baseline.accepts(key):
                status = "accepted by the baseline"
            elif settings.baseline_update:
                status = "added to the baseline"
            else:
                status = "NEW, not in the baseline"
            shown = ", ".join(tests[:3]) + (f" (+{len(tests) - 3} more)" if len(tests) > 3 else "")
            write(f"{verdict.format_key(key)}: {status}; in {shown}")
        if settings.census is not None and settings.census in self._written:
            write(f"census written to {settings.census}")
        if settings.baseline is not None:
            if settings.baseline_update:
                if settings.baseline in self._written:
                    write(
                        f"baseline updated: {settings.baseline} (a run only adds ops; remove "
                        "fixed ones with: pytest-backends baseline --census WHOLE_SUITE_CENSUS "
                        f"{settings.baseline})"
                    )
            else:
                unaccepted = self._unaccepted()
                if unaccepted:
                    ops = ", ".join(verdict.format_key(k) for k in unaccepted)
                    write(
                        f"FAILED: {len(unaccepted)} nondeterministic op(s) not in the baseline "
                        f"{settings.baseline}: {ops}",
                        red=True,
                    )
                    write(verdict.accept_hint(settings.baseline))
                else:
                    write(f"every nondeterministic op is in the baseline {settings.baseline}")


def _xfail_expected(item: pytest.Item, exc: BaseException) -> bool:
    """Whether ``exc`` is the failure an ``xfail`` marker on ``item`` expects."""
    try:
        from _pytest.skipping import xfailed_key
    except ImportError:
        return False
    xfailed = item.stash.get(xfailed_key, None)
    if xfailed is None or not isinstance(exc, Exception):
        return False
    raises: Any = xfailed.raises
    if raises is None:
        return True
    if isinstance(raises, (type, tuple)):
        return isinstance(exc, raises)
    matches = getattr(raises, "matches", None)  # pytest.RaisesExc
    return bool(matches(exc)) if callable(matches) else False
