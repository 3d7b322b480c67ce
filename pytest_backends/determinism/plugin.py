"""Suite-wide determinism checks: ``--backends-determinism``, census and baseline.

Registered by :mod:`pytest_backends.plugin` only when one of the options
(or its ini twin) is in use. A selected test's call phase runs ``N`` times:
the global RNGs are reset to the state they had when the call phase began,
and an :class:`~pytest_backends.determinism.recorder.OpRecorder` records every op. Setup
and teardown run once, so function-scoped fixture values are shared by all
runs. The runs are then compared op by op; an op that gave different outputs
from identical inputs fails the test (unless the baseline accepts it).

Each test's verdicts travel on its call-phase report (an attribute that
pytest-xdist serializes with the report), and whichever process logs the
report adds them to the census. So the census is built from the same stream
as the terminal results: a worker that crashes loses nothing that it had
already reported.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

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
REPORT_ATTR = "backends_census"
_VERDICTS_KEY = pytest.StashKey[list[dict[str, Any]]]()
_OFF = ("0", "off", "false", "no")


@dataclass(frozen=True)
class DeterminismSettings:
    """The resolved determinism options."""

    runs: int
    select_all: bool
    census: Path | None
    baseline: Path | None
    baseline_update: bool


SETTINGS_KEY = pytest.StashKey[DeterminismSettings]()


def addoption(parser: pytest.Parser, group: Any) -> None:
    """Register the determinism, census and baseline options with their ini twins."""
    group.addoption(
        "--backends-determinism",
        action="store",
        nargs="?",
        const="on",
        default=None,
        metavar="N",
        help="run each test marked @pytest.mark.backends(deterministic=...) N times "
        "(bare flag: 5) under an op recorder and fail it when an op's output differs "
        "between runs; 'off' disables. ini: backends_determinism",
    )
    parser.addini(
        "backends_determinism",
        "determinism runs per selected test: a number >= 2, 'on' (5) or 'off'",
        default="",
    )
    group.addoption(
        "--backends-determinism-all",
        action="store_true",
        default=False,
        help="check every test, not only marked ones (turns the check on). "
        "ini: backends_determinism_all",
    )
    parser.addini(
        "backends_determinism_all", "determinism check for every test", type="bool", default=False
    )
    group.addoption(
        "--backends-census",
        action="store",
        default=None,
        metavar="PATH",
        help="write the op census (verdict per op, device and dtype) as JSON to PATH "
        "(turns the check on). ini: backends_census",
    )
    parser.addini("backends_census", "op census JSON file to write", default="")
    group.addoption(
        "--backends-baseline",
        action="store",
        default=None,
        metavar="PATH",
        help="JSON file of accepted nondeterministic ops: the run fails only for ops "
        "not in it (turns the check on). ini: backends_baseline",
    )
    parser.addini("backends_baseline", "baseline JSON file of accepted ops", default="")
    group.addoption(
        "--backends-baseline-update",
        action="store_true",
        default=False,
        help="rewrite the --backends-baseline file with this run's nondeterministic ops "
        "instead of failing on them. ini: backends_baseline_update",
    )
    parser.addini(
        "backends_baseline_update", "rewrite the baseline file", type="bool", default=False
    )


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
    return runs


def _getini(config: pytest.Config, name: str) -> Any:
    """``config.getini(name)``; a value pytest cannot convert is a usage error naming the key."""
    try:
        return config.getini(name)
    except (ValueError, pytest.UsageError) as exc:  # "invalid truth value 'x'" (bool keys)
        raise pytest.UsageError(f"ini option {name}: {exc} (use true or false)") from None


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
    select_all = bool(config.getoption("backends_determinism_all", False)) or bool(
        _getini(config, "backends_determinism_all")
    )
    census = _cli_path(config, "backends_census", "--backends-census") or _ini_path(
        config, "backends_census"
    )
    baseline = _cli_path(config, "backends_baseline", "--backends-baseline") or _ini_path(
        config, "backends_baseline"
    )
    update = bool(config.getoption("backends_baseline_update", False)) or bool(
        _getini(config, "backends_baseline_update")
    )
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
    implied = select_all or census is not None or baseline is not None
    if runs is None:
        if not implied or (cli is not None and str(cli).strip().lower() in _OFF):
            return None
        runs = DEFAULT_RUNS
    return DeterminismSettings(runs, select_all, census, baseline, update)


_OPTION_NAMES = (
    "backends_determinism",
    "backends_determinism_all",
    "backends_census",
    "backends_baseline",
    "backends_baseline_update",
)


def configure(config: pytest.Config) -> None:
    """Resolve the settings and register the plugin when the feature is on."""
    # An empty value (as the CPU-level children get) means "off", not a bad path.
    if not any(config.getoption(name, None) or _getini(config, name) for name in _OPTION_NAMES):
        return
    settings = resolve_settings(config)
    if settings is None:
        return
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
    plugin = DeterminismPlugin(config, settings, baseline)
    config.pluginmanager.register(plugin, "backends-determinism")


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
        self._written: set[Path] = set()

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        if not _selected(item, self.settings.select_all):
            return (yield)
        from pytest_backends.determinism.api import RngState
        from pytest_backends.determinism.recorder import OpRecorder, RunLog, compare_runs

        runs = self.settings.runs
        start = RngState.capture()
        logs: list[RunLog] = []
        recorder = OpRecorder()
        try:
            with recorder:
                result = yield
        except BaseException:
            self._record(item, compare_runs([recorder.finish()]))
            raise
        logs.append(recorder.finish())
        for run in range(1, runs):
            start.restore()
            recorder = OpRecorder()
            try:
                with recorder:
                    item.runtest()
            except BaseException as exc:
                self._record(item, compare_runs([*logs, recorder.finish()]))
                if hasattr(exc, "add_note"):
                    exc.add_note(f"(raised in determinism run {run} of {runs}; run 0 passed)")
                raise
            logs.append(recorder.finish())
        comparison = compare_runs(logs)
        self._record(item, comparison)
        self._check(comparison)
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        rows = item.stash.get(_VERDICTS_KEY, None)
        if rows is not None and call.when == "call":
            setattr(report, REPORT_ATTR, rows)
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
        rows = getattr(report, REPORT_ATTR, None)
        if not rows or _is_worker(self.config) or str(report.outcome) == "rerun":
            return
        self.census.add_test(
            report.nodeid, {(r["op"], r["device"], r["dtype"]): r["verdict"] for r in rows}
        )

    def _check(self, comparison: Comparison) -> None:
        blamed = comparison.blamed
        runs = comparison.runs
        new = [d for d in blamed if not self.baseline.accepts((d.op, d.device, d.dtype))]
        if self.settings.baseline_update:
            new = []
        unexplained = comparison.unexplained
        if new:
            first = new[0]
            lines = [first.describe(runs)]
            lines += [f"  also: {d.describe(runs)}" for d in new[1:]]
            accepted = [d for d in blamed if d not in new]
            if accepted:
                ops = ", ".join(sorted({d.op for d in accepted}))
                lines.append(f"  accepted by the baseline: {ops}")
            _raise(lines, first)
        if unexplained is not None:
            _raise([f"not reproducible: {unexplained.describe(runs)}"], unexplained, blame=False)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        config = session.config
        if _is_worker(config):
            return
        settings = self.settings
        versions = Versions.current() if (settings.census or settings.baseline) else None
        if settings.census is not None and versions is not None:
            try:
                self.census.write(settings.census, runs=settings.runs, versions=versions)
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
            pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED
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
        if not (nondet or settings.census or settings.baseline):
            return
        terminalreporter.section("determinism", sep="=")
        for error in self._errors:
            write(f"ERROR: {error}", red=True)
        write(f"{len(self.census)} op keys (op, device, dtype) recorded over {settings.runs} runs")
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
                    write(f"baseline updated: {settings.baseline}")
            else:
                unaccepted = self._unaccepted()
                if unaccepted:
                    ops = ", ".join(_format_key(k) for k in unaccepted)
                    write(
                        f"FAILED: {len(unaccepted)} nondeterministic op(s) not in the baseline "
                        f"{settings.baseline}: {ops}",
                        red=True,
                    )
                else:
                    write(f"every nondeterministic op is in the baseline {settings.baseline}")


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
