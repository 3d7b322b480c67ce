"""The matrix report's hooks: collect each item's result, then write the grid and the files.

Registered in the process that writes the report (the xdist controller, or
the only process).  Results come from test reports alone; the axis registry
that parses and orders configuration ids is the run's
(:func:`pytest_backends.matrix.registry.axis_registry`), the items the
matrix collected come from :func:`pytest_backends.matrix.coverage.collected`
and, under pytest-xdist, from each worker through
:mod:`pytest_backends._xdist`.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Generator, Sequence
from typing import Any

import pytest

from pytest_backends import _files, _shared, _xdist
from pytest_backends._process import describe_exit, exit_status
from pytest_backends.matrix import coverage
from pytest_backends.matrix.configs import ConfigError, base_test_id
from pytest_backends.matrix.environment import ControllerEnvironment, combine
from pytest_backends.matrix.environment import lines as environment_lines
from pytest_backends.matrix.registry import axis_registry
from pytest_backends.matrix.report import (
    ConfigRow,
    Result,
    RunSummary,
    build_rows,
    config_in_nodeid,
    failure_detail,
    failure_message,
    is_crash,
    render_json,
    render_terminal,
    skip_reason,
    update,
)
from pytest_backends.matrix.report_html import render_html
from pytest_backends.matrix.settings import MatrixSettings

__all__ = ["ReportPlugin"]


def _session_problem(message: str, detail: str = "") -> dict[str, str]:
    """A problem of the run outside any test's report."""
    return {
        "nodeid": "(session)",
        "when": "session",
        "outcome": "failed",
        "message": message,
        "detail": detail,
    }


class ReportPlugin:
    """Collects matrix results (controller side) and writes the terminal/JSON/HTML report."""

    def __init__(self, config: pytest.Config, settings: MatrixSettings) -> None:
        self.config = config
        self.settings = settings
        #: This run's identity in its report: merge takes a run once, however often given.
        self.run_id = uuid.uuid4().hex
        self.results: dict[str, Result] = {}
        self.written: list[str] = []
        self.write_errors: list[str] = []
        self.workers = ControllerEnvironment()
        #: Items collected by xdist workers (node id -> config id), deselected ones included.
        self.collected: dict[str, str] = {}
        #: Items the xdist workers deselected.
        self.deselected: set[str] = set()
        #: Items that ran (an outcome other than a skip), whether or not they have a config.
        self.ran: set[str] = set()
        #: Items that were skipped, with the reason.
        self.skipped: dict[str, str] = {}
        #: Items whose xdist worker died, and how (``killed by signal SIGSEGV``).
        self.crashes: dict[str, str] = {}
        #: pytest's verdict on the whole session (every item, not only matrix ones).
        self.session = RunSummary()
        #: Matrix items whose setup passed and whose call phase has not been reported.
        self.started: set[str] = set()

    def _count(self, category: str, n: int = 1) -> None:
        if category and n:
            self.session.outcomes[category] = self.session.outcomes.get(category, 0) + n

    def _problem(self, report: Any, category: str, config: str | None) -> None:
        problem = {
            "nodeid": report.nodeid,
            "when": str(getattr(report, "when", "collect") or "collect"),
            "outcome": category if category in ("failed", "error") else "failed",
            "message": failure_message(report),
            "detail": failure_detail(report),
        }
        if config:
            problem["config"] = config
        how = self.crashes.get(report.nodeid)
        if how is not None:
            problem["message"] = f"crashed ({how}): {problem['message']}"
        self.session.problems.append(problem)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """Count and list a collection error as pytest's closing line does."""
        if report.failed:
            self._count("error")
            self._problem(report, "error", None)
        elif report.skipped:
            self._count("skipped")

    def pytest_deselected(self, items: Sequence[pytest.Item]) -> None:
        """Count deselected items as pytest's closing line does.

        Items dropped by ``-k``, ``-m``, ``--lf`` or ``--backends-config`` are
        counted, so the report of a narrowed run never reads as the whole suite.
        """
        self._count("deselected", len(items))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """Keep a finished xdist worker's environment lines and collected items."""
        self.workers.pytest_testnodedown(node, error)
        collected = _xdist.collected(node, coverage.COLLECTED_CHANNEL)
        if isinstance(collected, dict):
            self.collected.update((str(k), str(v)) for k, v in collected.items())
        dropped = _xdist.collected(node, coverage.DESELECTED_CHANNEL)
        if isinstance(dropped, list):
            self.deselected.update(map(str, dropped))

    def coverage(self) -> coverage.Coverage:
        """What this run collected and what of it ran, for ``pytest-backends merge``."""
        collected = {**coverage.collected(self.config), **self.collected}
        dropped = coverage.deselected(self.config) | self.deselected
        selected = {n for n in collected if n not in dropped}
        return coverage.Coverage(
            collected, set(self.ran), dict(self.skipped), selected, lists_selection=True
        )

    @pytest.hookimpl(optionalhook=True, trylast=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """Note how the worker died (its signal), for the item's cell."""
        how = "worker died"
        node = getattr(report, "node", None)
        with contextlib.suppress(Exception):
            # execnet caches the worker's facts (pid included) when xdist starts it.
            pid = int(node.gateway._rinfo().pid)  # type: ignore[union-attr]
            status = exit_status(pid, wait_s=0.5)
            if status is not None:
                how = describe_exit(status)
        self.crashes[crashitem] = how

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        status = self.config.hook.pytest_report_teststatus(report=report, config=self.config)
        category = str(status[0]) if isinstance(status, tuple) and status else ""
        self._count(category)  # "rerun" too, as pytest's closing line counts it
        if str(report.outcome) == "rerun":  # pytest-rerunfailures: a later attempt follows
            return
        if report.failed:
            config = _shared.read(report, _shared.PROPERTY_CONFIG, text=True)
            self._problem(report, category, config)
        xfail = hasattr(report, "wasxfail")
        if report.failed or (report.when == "call" and (xfail or not report.skipped)):
            self.ran.add(report.nodeid)
        elif report.skipped and not xfail:
            self.skipped[report.nodeid] = skip_reason(report)
        config_id = _shared.read(report, _shared.PROPERTY_CONFIG, text=True)
        if config_id is None and is_crash(report):
            known = self.results.get(report.nodeid)
            config_id = (
                known.config
                if known is not None
                else (
                    config_in_nodeid(report.nodeid, axis_registry(self.config).parse_id)
                    if self.settings.enabled
                    else None
                )
            )
        if config_id is None:
            return
        if report.nodeid not in self.results:
            self.results[report.nodeid] = Result(
                report.nodeid, base_test_id(report.nodeid, str(config_id)), str(config_id)
            )
        result = self.results[report.nodeid]
        update(result, report)
        if report.when == "setup" and report.passed:
            self.started.add(report.nodeid)
        elif report.when != "setup":
            self.started.discard(report.nodeid)
        how = self.crashes.get(report.nodeid)
        if how is not None and report.failed:
            result.crashed = True
            result.message = (
                f"crashed ({how}) under {result.config}: "
                + result.message.removeprefix("crashed: ")
            )

    def _order(self) -> list[str]:
        registry = axis_registry(self.config)
        ids = {r.config for r in self.results.values()}

        def key(config_id: str) -> tuple[int, tuple[tuple[int, int], ...], str]:
            try:
                return (0, registry.sort_key(registry.parse_id(config_id)), config_id)
            except ConfigError:
                return (1, (), config_id)

        return sorted(ids, key=key)

    def rows(self) -> list[ConfigRow]:
        """The per-config rows of the results so far."""
        return build_rows(self.results.values(), self._order())

    def _environment(self) -> list[str]:
        # Under xdist the controller ran no test: it probes its own facts here.
        return combine(environment_lines(), self.workers.workers)

    def _header(self) -> dict[str, Any]:
        from pytest_backends.matrix.availability import probe, run_label

        avail = probe()
        return {
            "label": run_label(self.config),
            "run": self.run_id,
            "torch": avail.torch_version,
            "cuda": avail.cuda_built,
        }

    @pytest.hookimpl(tryfirst=True, specname="pytest_sessionfinish")
    def pytest_sessionfinish_skipped(self, session: pytest.Session) -> None:
        """Say (and fail under ``--backends-strict``) when a CPU level, or the whole
        matrix, ran nothing because every item was skipped."""
        results = list(self.results.values())
        if not results:
            return
        from pytest_backends import _selected
        from pytest_backends.capability.levels import AXIS

        by_level: dict[str, list[Result]] = {}
        for result in results:
            try:
                choices = dict(axis_registry(self.config).parse_id(result.config))
            except ConfigError:
                continue
            if AXIS in choices:
                by_level.setdefault(choices[AXIS], []).append(result)
        for level, items in sorted(by_level.items()):
            if all(r.outcome == "skipped" for r in items):
                _selected.record_all_skipped(
                    self.config,
                    f"CPU capability level {level}",
                    f"skipped ({len(items)} item(s)): {items[0].message}",
                )
        if self.settings.enabled and all(r.outcome == "skipped" for r in results):
            source = self.settings.select_source if self.settings.select else "the matrix"
            configs = sorted({r.config for r in results})
            shown = ", ".join(configs[:5]) + (f", ... ({len(configs)})" if len(configs) > 5 else "")
            _selected.record_all_skipped(
                self.config,
                f"{source} ({shown})",
                f"skipped ({len(results)} item(s)): {results[0].message}",
            )

    def _finish_session(self, session: pytest.Session) -> None:
        """Fix the run's verdict: exit status, why the run fails outside any test's
        report, and items a Ctrl-C left unfinished."""
        status = int(session.exitstatus)
        self.session.exitstatus = status
        self.session.interrupted = status == int(pytest.ExitCode.INTERRUPTED)
        problems = self.session.problems
        for title, message in _shared.session_failures(self.config):
            first = message.splitlines()[0] if message else ""
            problems.append(_session_problem(f"{title}: {first}", message))
        quiet = (int(pytest.ExitCode.OK), int(pytest.ExitCode.NO_TESTS_COLLECTED))
        if status not in quiet and not self.session.interrupted and not problems:
            # Never greener than the run: a failing exit status always shows a reason.
            problems.append(
                _session_problem(
                    f"the run failed (exit status {status}) outside any test; "
                    "the terminal summary says why"
                )
            )
        if not self.session.interrupted:
            return
        for nodeid in sorted(self.started):
            result = self.results.get(nodeid)
            if result is not None and result.outcome == "passed":
                result.outcome = "interrupted"
                result.message = "interrupted: the run stopped before this test finished"
                self.session.problems.append(
                    {
                        "nodeid": nodeid,
                        "when": "call",
                        "outcome": "interrupted",
                        "message": result.message,
                        "config": result.config,
                    }
                )
        self.started.clear()

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, None, None]:
        # Written after every other sessionfinish hook: they may still fail the run.
        yield
        self._finish_session(session)
        if self.settings.report_json is None and self.settings.report_html is None:
            return
        rows = self.rows()
        header = self._header()
        results = list(self.results.values())
        for result in results:
            result.sources = [header["label"]]
        verify = self.settings.verify != "off"
        environment = self._environment()
        outputs: list[tuple[Any, Callable[[], str], _files.OutputKind]] = []
        if self.settings.report_json is not None:
            settings = {
                "axes": list(self.settings.axes) if self.settings.axes else None,
                "sample": self.settings.sample,
                "seed": self.settings.seed,
                "verify": self.settings.verify,
                "select": [",".join(g) for g in self.settings.select],
            }
            outputs.append(
                (
                    self.settings.report_json,
                    lambda: render_json(
                        rows,
                        results,
                        environment=environment,
                        settings=settings,
                        header=header,
                        extra={"coverage": self.coverage().to_plain()},
                        session=self.session,
                    ),
                    _files.JSON_REPORT,
                )
            )
        if self.settings.report_html is not None:
            outputs.append(
                (
                    self.settings.report_html,
                    lambda: render_html(
                        rows,
                        results,
                        environment=[f"label: {header['label']}", *environment],
                        verify=verify,
                        session=self.session,
                    ),
                    _files.HTML_REPORT,
                )
            )
        self._write_all(outputs)
        if self.write_errors and session.exitstatus in (
            pytest.ExitCode.OK,
            pytest.ExitCode.NO_TESTS_COLLECTED,
        ):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _write_all(self, outputs: list[tuple[Any, Callable[[], str], _files.OutputKind]]) -> None:
        """Write every output; when one fails, the others say so.

        A file that could not be written fails the run, so the files that
        were written must not read as green: they are written again with the
        failure as a session problem and a failing exit status.
        """
        for path, render, kind in outputs:
            self._write(path, render(), kind)
        if not self.write_errors:
            return
        if self.session.exitstatus in (
            int(pytest.ExitCode.OK),
            int(pytest.ExitCode.NO_TESTS_COLLECTED),
        ):
            self.session.exitstatus = int(pytest.ExitCode.TESTS_FAILED)
        self.session.problems += [
            _session_problem(message.removeprefix("ERROR: ")) for message in self.write_errors
        ]
        for path, render, kind in outputs:
            if str(path) in self.written:
                try:
                    _files.write_output(path, render(), kind)
                except OSError as exc:
                    self.written.remove(str(path))
                    self.write_errors.append(f"ERROR: the matrix report was not written: {exc}")

    def _write(self, path: Any, text: str, kind: _files.OutputKind) -> None:
        try:
            _files.write_output(path, text, kind)
        except OSError as exc:
            self.write_errors.append(f"ERROR: the matrix report was not written: {exc}")
        else:
            self.written.append(str(path))

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        if config.option.collectonly or (not self.results and not self.settings.enabled):
            # The matrix is off, but a report file asked for is still said to be written.
            for path in self.written:
                terminalreporter.line(f"report written to {path}")
            for message in self.write_errors:
                terminalreporter.line(message, red=True)
            return
        terminalreporter.section("backends matrix")
        for line in render_terminal(self.rows(), self.settings.verify != "off"):
            terminalreporter.line(line)
        if self.settings.sample and not self.settings.seed_given:
            terminalreporter.line(f"sampled with --backends-seed={self.settings.seed}")
        for path in self.written:
            terminalreporter.line(f"report written to {path}")
        for message in self.write_errors:
            terminalreporter.line(message, red=True)
