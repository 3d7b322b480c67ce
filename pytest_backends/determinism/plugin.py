"""Suite-wide determinism checks: ``--backends-determinism``, census and baseline.

Registered by :mod:`pytest_backends.plugin` only when one of the options
(or its ini twin) is in use. A selected test's call phase runs ``N`` times:
the global RNGs are reset to the state they had when the call phase began,
and the op recorder records every op (the native one of
:mod:`~pytest_backends.determinism.native_recorder` where the extension is
built, else :class:`~pytest_backends.determinism.recorder.OpRecorder`). Setup
and teardown run once, so function-scoped fixture values are shared by all
runs. The runs are then compared op by op; an op that gave different outputs
from identical inputs fails the test (unless the baseline accepts it).

The check never changes the outcome of a test whose ops are deterministic
(see :mod:`~pytest_backends.determinism.boundary`): runs that differ only
because their inputs differ (Python state outside torch ops), reruns that
raise where run 0 passed, and failures of the harness's own machinery give
the verdict "not checked" with the reason, and the test keeps run 0's
outcome. ``--backends-determinism-repeatable`` fails such tests instead.

Each test's verdicts travel on its call-phase report (an attribute that
pytest-xdist serializes with the report), and whichever process logs the
report adds them to the census. So the census is built from the same stream
as the terminal results: a worker that crashes loses nothing that it had
already reported.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_backends import _keys, _options
from pytest_backends.determinism import subtests
from pytest_backends.determinism.api import DEFAULT_RUNS, NondeterministicOpError
from pytest_backends.determinism.census import (
    Baseline,
    BaselineVersionWarning,
    Census,
    CensusFileError,
    Key,
    Versions,
)

if TYPE_CHECKING:
    from pytest_backends.determinism.recorder import Comparison, Divergence

__all__ = [
    "SETTINGS_KEY",
    "DeterminismPlugin",
    "DeterminismSettings",
    "configure",
    "parse_runs",
    "resolve_settings",
]

#: Report attribute carrying one test's census rows (plain JSON-ready data).
REPORT_ATTR = _keys.REPORT_ATTR_CENSUS
_VERDICTS_KEY = _keys.VERDICTS_KEY
_OFF = _options.OFF_WORDS
#: The largest N accepted by ``--backends-determinism``.
MAX_RUNS = 1000
#: Report attribute carrying one test's check: ``{"check", "reason", "boundary"}``.
CHECK_ATTR = _keys.REPORT_ATTR_CHECK
_CHECK_KEY = _keys.CHECK_KEY


@dataclass(frozen=True)
class DeterminismSettings:
    """The resolved determinism options."""

    runs: int
    select_all: bool
    census: Path | None
    baseline: Path | None
    baseline_update: bool
    #: Fail tests that are not repeatable instead of reporting them as not checked.
    repeatable: bool = False


SETTINGS_KEY = _keys.DETERMINISM_KEY


def parse_runs(value: str, source: str) -> int | None:
    """Parse ``--backends-determinism``'s ``N``: an int >= 2, ``on`` (default) or ``off`` (None)."""
    text = value.strip().lower()
    if text in ("", "default", "on", "true", "yes"):
        return DEFAULT_RUNS
    if text in _OFF:
        return None
    try:
        runs = int(text)
    except ValueError:
        raise pytest.UsageError(
            f"{source}: expected a number of runs (an integer >= 2), 'on' or 'off', got "
            f"{value!r}. Write --backends-determinism=N: a bare --backends-determinism "
            "takes the next argument as N."
        ) from None
    if runs < 2:
        raise pytest.UsageError(
            f"{source}: the determinism check needs at least 2 runs, got {runs} "
            "(use 'off' to disable it)"
        )
    if runs > MAX_RUNS:
        raise pytest.UsageError(
            f"{source}: at most {MAX_RUNS} runs, got {runs}: every selected test runs N times "
            "under the op recorder, so a larger N only multiplies the session's time (a "
            "nondeterministic kernel usually shows within 2 to 10 runs); pick N <= "
            f"{MAX_RUNS}"
        )
    return runs


def _ini_path(config: pytest.Config, name: str) -> Path | None:
    value = str(config.getini(name) or "").strip()
    if not value:
        return None
    return config.rootpath / value


def _cli_path(config: pytest.Config, option: str, flag: str) -> Path | None:
    value = config.getoption(option, None)
    if value is None:
        return None
    if not str(value).strip():
        raise pytest.UsageError(f"{flag}: expected a file path, got an empty value")
    return Path(config.invocation_params.dir) / str(value)


def resolve_settings(config: pytest.Config) -> DeterminismSettings | None:
    """Resolve the options once (command line over ini); None when the feature is off.

    ``--backends-determinism-all``, ``--backends-census`` and
    ``--backends-baseline`` turn the check on with the default number of runs.
    """
    select_all = bool(_options.lookup(config, "backends_determinism_all").value)
    census = _cli_path(config, "backends_census", "--backends-census") or _ini_path(
        config, "backends_census"
    )
    baseline = _cli_path(config, "backends_baseline", "--backends-baseline") or _ini_path(
        config, "backends_baseline"
    )
    update = bool(_options.lookup(config, "backends_baseline_update").value)
    if update and baseline is None:
        raise pytest.UsageError(
            "--backends-baseline-update: name the file to write with --backends-baseline=PATH"
        )
    cli = config.getoption("backends_determinism", None)
    if cli is not None:
        runs = parse_runs(str(cli), "--backends-determinism")
    else:
        ini = str(config.getini("backends_determinism") or "").strip()
        runs = parse_runs(ini, "ini option backends_determinism") if ini else None
    repeatable = bool(_options.lookup(config, "backends_determinism_repeatable").value)
    implied = select_all or census is not None or baseline is not None
    if runs is None:
        if not implied or (cli is not None and str(cli).strip().lower() in _OFF):
            return None
        runs = DEFAULT_RUNS
    return DeterminismSettings(runs, select_all, census, baseline, update, repeatable)


_OPTION_NAMES = (
    "backends_determinism",
    "backends_determinism_all",
    "backends_census",
    "backends_baseline",
    "backends_baseline_update",
)


def configure(config: pytest.Config) -> list[tuple[object, str]]:
    """Resolve the settings; the plugin to register when the feature is on (else none)."""
    # An empty value means "off", not a bad path.
    if not any(_options.lookup(config, name).value for name in _OPTION_NAMES):
        return []
    settings = resolve_settings(config)
    if settings is None:
        return []
    config.stash[SETTINGS_KEY] = settings
    baseline = Baseline()
    if settings.baseline is not None:
        try:
            baseline = Baseline.load(settings.baseline)
        except CensusFileError as exc:
            missing = not settings.baseline.exists()
            if not (missing and settings.baseline_update):
                hint = " (create it with --backends-baseline-update)" if missing else ""
                raise pytest.UsageError(f"--backends-baseline: {exc}{hint}") from None
        if not _is_worker(config):
            message = baseline.version_mismatch(settings.baseline, Versions.current())
            if message:
                config.issue_config_time_warning(BaselineVersionWarning(message), stacklevel=2)
    if not _is_worker(config):
        _check_outputs(settings)
    return [
        (DeterminismPlugin(config, settings, baseline), "backends-determinism"),
        (subtests.SubtestCounter(), "backends-subtests"),
    ]


def _check_outputs(settings: DeterminismSettings) -> None:
    """Refuse, before any test runs, output paths that would be refused at the end."""
    from pytest_backends import _files

    outputs = [("--backends-census", settings.census, _files.CENSUS)]
    if settings.baseline_update:
        outputs.append(("--backends-baseline-update", settings.baseline, _files.BASELINE))
    for flag, path, kind in outputs:
        if path is not None:
            try:
                _files.check_output(path, kind)
            except _files.OutputFileError as exc:
                raise pytest.UsageError(f"{flag}: {exc}") from None


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


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

    def __init__(
        self, config: pytest.Config, settings: DeterminismSettings, baseline: Baseline
    ) -> None:
        self.config = config
        self.settings = settings
        self.baseline = baseline
        self.census = Census()
        self._errors: list[str] = []
        self._compile_watch: Any = None
        self._checked = 0
        self._unchecked: dict[str, str] = {}
        self._boundary: dict[str, list[str]] = {}
        self._written: set[Path] = set()
        self._recorders: set[str] = set()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        from pytest_backends._selected import record

        option = "--backends-determinism"
        if self.config.getoption("backends_determinism", None) is None:
            option = (
                "--backends-census"
                if self.settings.census
                else ("--backends-baseline" if self.settings.baseline else option)
            )
        selected = sum(1 for item in session.items if _selected(item, self.settings.select_all))
        record(
            self.config,
            option,
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
        from pytest_backends.determinism.api import RngState
        from pytest_backends.determinism.generators import GeneratorStates, roots_of

        start = _Start(RngState.capture(), GeneratorStates.capture(roots_of(item)))
        runner = _Runs(self._watch())
        runner.begin()
        item.stash[subtests.RUN_KEY] = 0
        try:
            result = yield
        except BaseException as exc:
            runner.end(exc)
            self._settle(item, runner, None, first=exc)
            raise
        # A unittest.TestCase stores its failure, skip or xfail instead of raising it.
        stored = _stored_outcome(item, 0)
        runner.end(stored)
        if stored is not None or subtests.failed_first_run(item):
            self._settle(item, runner, None, first=stored)
            return result
        # A run that compiled is a warm-up: one more run is compared in its place.
        total = self.settings.runs + (1 if runner.records[0].compiled else 0)
        for run in range(1, total):
            item.stash[subtests.RUN_KEY] = run
            if runner.failure is not None:
                break
            start.restore()
            runner.begin()
            try:
                _run_again(item)
            except (KeyboardInterrupt, SystemExit) as exc:
                runner.end(exc)
                raise
            except BaseException as exc:  # pytest.fail and pytest.skip included
                runner.end(exc)
                if self._settle(item, runner, (run, exc)):
                    if hasattr(exc, "add_note"):
                        exc.add_note(f"(raised in determinism run {run} of {total}; run 0 passed)")
                    raise
                return result
            runner.end()
        self._settle(item, runner, None, check=True, locate_with=(start, lambda: _run_again(item)))
        return result

    def _watch(self) -> Any:
        if self._compile_watch is None:
            from pytest_backends.determinism.boundary import CompileWatch

            self._compile_watch = CompileWatch()
        return self._compile_watch

    def _settle(
        self,
        item: pytest.Item,
        runner: _Runs,
        raised: tuple[int, BaseException] | None,
        check: bool = False,
        locate_with: tuple[Any, Callable[[], object]] | None = None,
        first: BaseException | None = None,
    ) -> bool:
        """Compare the runs, record the verdicts and fail the test where the check says so.

        ``raised`` is a rerun's exception (run 0 passed). Returns whether that
        exception is the test's outcome: it is when an op is blamed or when
        non-repeatable tests fail by option; otherwise the test is not checked
        and keeps run 0's outcome.
        """
        from pytest_backends.determinism.boundary import boundary_notes, explain_unchecked
        from pytest_backends.determinism.recorder import compare_runs, locate

        records = runner.compared()
        reason: str | None = None
        single = len(records) < 2
        comparison = None
        notes: list[str] = []
        try:
            comparison = compare_runs([r.log for r in records])
            notes = boundary_notes(runner.records)
            if runner.failure is None:
                if (
                    locate_with is not None
                    and comparison.unexplained is not None
                    and comparison.unexplained.kind == "unproven"
                    and not (comparison.blamed or comparison.uninitialized)
                ):
                    start, run_again = locate_with
                    start.restore()
                    comparison = locate(comparison, run_again, runner.native())
                    locate_with = None
                reason = explain_unchecked(comparison, records)
                blind = next((r.blind for r in runner.records if r.blind), None)
                if blind and not (comparison.blamed or comparison.uninitialized):
                    reason = blind
                if single:
                    reason = _first_run_reason(first, item)
        except Exception as exc:  # the harness's own failure is never the test's
            runner.fail(exc)
        if runner.failure is not None:
            reason = f"the determinism recorder failed: {runner.failure}"
            comparison = None
        elif raised is not None and (comparison is None or not comparison.blamed):
            run, error = raised
            text = str(error).strip().splitlines()
            reason = (
                f"run {run} raised {type(error).__name__}"
                + (f" ({text[0][:200]})" if text else "")
                + " where run 0 passed: the test is not repeatable"
            )
        if (
            comparison is not None
            and locate_with is not None
            and reason is None
            and (comparison.blamed or comparison.uninitialized or comparison.unexplained)
        ):
            start, run_again = locate_with
            start.restore()
            comparison = locate(comparison, run_again, runner.native())  # one more run, with lines
        if comparison is not None:
            self._record(item, comparison)
        repeatable = self.settings.repeatable and runner.failure is None and not single
        if repeatable:
            reason = None  # not repeatable is a failure here, reported as such
        item.stash[_CHECK_KEY] = {
            "check": "not checked" if reason else "checked",
            "reason": reason,
            "boundary": notes,
            "recorder": runner.described,
        }
        if raised is not None:
            return bool(comparison is not None and comparison.blamed) or repeatable
        if check and comparison is not None and reason is None:
            self._check(comparison, notes)
        return False

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        rows = item.stash.get(_VERDICTS_KEY, None)
        if rows is not None and call.when == "call":
            setattr(report, REPORT_ATTR, rows)
        check = item.stash.get(_CHECK_KEY, None)
        if check is not None and call.when == "call":
            setattr(report, CHECK_ATTR, check)
        if call.excinfo is not None and isinstance(call.excinfo.value, NondeterministicOpError):
            # The harness's own frames say nothing useful: show the finding alone.
            report.longrepr = str(call.excinfo.value)
        return report

    def _record(self, item: pytest.Item, comparison: Comparison) -> None:
        item.stash[_VERDICTS_KEY] = [
            {"op": op, "device": device, "dtype": dtype, "verdict": verdict}
            for (op, device, dtype), verdict in comparison.verdicts.items()
        ]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        check = getattr(report, CHECK_ATTR, None)
        if (
            isinstance(check, dict)
            and not _is_worker(self.config)
            and str(report.outcome) != "rerun"
        ):
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
        rows = getattr(report, REPORT_ATTR, None)
        if not rows or _is_worker(self.config) or str(report.outcome) == "rerun":
            return
        self.census.add_test(
            report.nodeid, {(r["op"], r["device"], r["dtype"]): r["verdict"] for r in rows}
        )

    def _check(self, comparison: Comparison, notes: list[str] | None = None) -> None:
        blamed = comparison.blamed
        runs = comparison.runs
        new = [d for d in blamed if not self.baseline.accepts((d.op, d.device, d.dtype))]
        if self.settings.baseline_update:
            new = []
        unexplained = comparison.unexplained
        if comparison.uninitialized:
            # Never accepted by a baseline: the test reads garbage.
            lines = [d.describe(runs) for d in comparison.uninitialized]
            lines[1:] = [f"  also: {line}" for line in lines[1:]]
            _raise(lines, comparison.uninitialized[0])
        if new:
            first = new[0]
            lines = [first.describe(runs)]
            lines += [f"  also: {d.describe(runs)}" for d in new[1:]]
            accepted = [d for d in blamed if d not in new]
            if accepted:
                ops = ", ".join(sorted({d.op for d in accepted}))
                lines.append(f"  accepted by the baseline: {ops}")
            lines += [f"  checked only at their boundary: {note}" for note in notes or ()]
            if self.settings.baseline is not None:
                lines.append(f"  {_accept_hint(self.settings.baseline)}")
            _raise(lines, first)
        if unexplained is not None:
            lines = [f"not reproducible: {unexplained.describe(runs)}"]
            lines += [f"  checked only at their boundary: {note}" for note in notes or ()]
            _raise(lines, unexplained, blame=False)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        config = session.config
        if _is_worker(config):
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
        if settings.baseline is not None and versions is not None:
            if settings.baseline_update:
                updated = self.baseline.updated(self.census)
                try:
                    updated.write(settings.baseline, versions)
                except CensusFileError as exc:
                    self._errors.append(f"--backends-baseline-update: {exc}")
                else:
                    self._written.add(settings.baseline)
            elif self._unaccepted() and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
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
        if _is_worker(config):
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
            write(f"{_format_key(key)}: {status}; in {shown}")
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
                    ops = ", ".join(_format_key(k) for k in unaccepted)
                    write(
                        f"FAILED: {len(unaccepted)} nondeterministic op(s) not in the baseline "
                        f"{settings.baseline}: {ops}",
                        red=True,
                    )
                    write(_accept_hint(settings.baseline))
                else:
                    write(f"every nondeterministic op is in the baseline {settings.baseline}")


def _accept_hint(baseline: Path) -> str:
    """The commands that accept new nondeterministic ops into ``baseline``."""
    return (
        f"accept with: pytest --backends-baseline={baseline} --backends-baseline-update "
        "(this job), or across jobs: pytest-backends baseline --census MERGED_CENSUS.json "
        f"{baseline}"
    )


class _Runs:
    """The runs of one test: recorders started and stopped safely, and what they saw."""

    def __init__(self, watch: Any) -> None:
        from pytest_backends.determinism.boundary import RunRecord

        self.records: list[RunRecord] = []
        self.failure: str | None = None
        self._watch = watch
        self._recorder: Any = None
        self._previous: Any = None
        self._compiles = 0
        # The native recorder's module, False for the Python recorder, None before the first run.
        self._native: Any = None
        #: Which recorder recorded the runs, and why not the native one, in words.
        self.described: str | None = None

    def begin(self) -> None:
        """Start recording a run (a recorder that cannot start leaves the run unrecorded)."""
        from pytest_backends.determinism.boundary import BoundaryRecorder

        self._watch.arm()
        self._compiles = self._watch.total()
        self._recorder = None
        if self.failure is not None:
            return
        try:
            if self._native is None:
                from pytest_backends.determinism.native_recorder import recorder_choice

                module, self.described = recorder_choice()
                self._native = module or False
            if self._native:
                from pytest_backends.determinism.native_recorder import NativeRecorder

                recorder: Any = NativeRecorder(self._native, self._previous)
            else:
                recorder = BoundaryRecorder(self._previous)
            recorder.__enter__()
        except Exception as exc:
            self.fail(exc)
            return
        self._recorder = recorder

    def end(self, raised: BaseException | None = None) -> None:
        """Stop recording the run and keep its record; ``raised`` is the run's exception."""
        from pytest_backends.determinism.boundary import RunRecord
        from pytest_backends.determinism.recorder import RunLog

        recorder, self._recorder = self._recorder, None
        compiled = self._watch.total() != self._compiles
        if recorder is None:
            self.records.append(RunRecord(RunLog([]), compiled=compiled))
            return
        try:
            recorder.__exit__(None, None, None)
        except Exception as exc:
            self.fail(exc)
        log = recorder.finish(raised)
        self._previous = recorder  # keys of tensors from outside the run are reused
        if recorder.failure is not None and self.failure is None:
            self.failure = recorder.failure
        blind = getattr(recorder, "blind", None)
        self.records.append(
            RunRecord(log, recorder.first_uses, compiled, recorder.keep(), blind=blind)
        )

    def native(self) -> Any:
        """The extension module when the native recorder recorded the runs, else None."""
        return self._native or None

    def fail(self, exc: BaseException) -> None:
        """Note the harness's own failure (the first one is kept)."""
        if self.failure is None:
            text = str(exc).strip().splitlines()
            self.failure = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")

    def compared(self) -> list[Any]:
        """The runs to compare: all, or all but a compiling run 0 when others follow."""
        records = self.records
        if len(records) > 2 and records[0].compiled:
            return records[1:]
        return records


@dataclass
class _Start:
    """What every run starts from: the global RNGs and the test's explicit generators."""

    rng: Any
    generators: Any

    def restore(self) -> None:
        self.rng.restore()
        self.generators.restore()


def _unittest_excinfo(item: pytest.Item) -> list[Any] | None:
    """The outcomes pytest's unittest support stored for ``item`` (a TestCase test), if any.

    A ``unittest.TestCase`` reports its failure, skip, expected failure or
    unexpected success to its result object, which pytest's unittest support
    stores on the item (``_excinfo``) and turns into the call's outcome later.
    """
    excinfo = item.__dict__.get("_excinfo")
    return excinfo if isinstance(excinfo, list) else None


def _stored_outcome(item: pytest.Item, keep_from: int) -> BaseException | None:
    """The exception of the first outcome stored for ``item`` (TestCase tests), or None."""
    excinfo = _unittest_excinfo(item)
    if not excinfo or len(excinfo) <= keep_from:
        return None
    value = getattr(excinfo[keep_from], "value", None)
    return value if isinstance(value, BaseException) else None


def _run_again(item: pytest.Item) -> None:
    """Run the test body again; raise what the run stored instead of raising.

    Outcomes a later run stores (a TestCase's result, a subtest's failure) are
    taken away, so that only run 0's outcome is the test's.
    """
    excinfo = _unittest_excinfo(item)
    before = len(excinfo) if excinfo is not None else 0
    subtests.take_rerun_failure(item)
    item.runtest()
    excinfo = _unittest_excinfo(item)
    stored = _stored_outcome(item, before)
    if excinfo is not None:
        del excinfo[before:]
    failure = subtests.take_rerun_failure(item)
    if stored is not None:
        raise stored
    if failure is not None:
        raise failure


def _first_run_reason(first: BaseException | None, item: pytest.Item) -> str:
    """Why a test was run once only, from run 0's exception (or its stored outcome)."""
    import unittest

    if isinstance(first, pytest.xfail.Exception):
        return "it xfailed in its first run, so it was not run again"
    if isinstance(first, (pytest.skip.Exception, unittest.SkipTest)):
        return "it was skipped in its first run, so it was not run again"
    if first is None and subtests.failed_first_run(item):
        return "a subtest failed in its first run, so it was not run again"
    return "it failed in its first run, so it was not run again"


def _format_key(key: Key) -> str:
    op, device, dtype = key
    where = ", ".join(x for x in (device, dtype) if x)
    return f"{op} ({where})" if where else op


def _raise(lines: list[str], d: Divergence, blame: bool = True) -> None:
    raise NondeterministicOpError(
        "\n".join(lines),
        op=d.op if blame else None,
        run=d.run,
        output_index=d.output_index,
        op_index=d.op_index,
    )
