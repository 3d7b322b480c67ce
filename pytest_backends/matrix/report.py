"""The matrix report's data and rendering: a terminal grid, a JSON file, an HTML grid.

Results are read from test reports only (the ``backend_config`` and
``backends_verify`` report properties travel with every report), so the same
code merges results from all xdist workers in the controller, and
``pytest-backends merge`` renders merged reports with it.  The hooks that
collect results and write the files are
:class:`pytest_backends.matrix.report_plugin.ReportPlugin`.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import pytest

from pytest_backends import _files, _shared
from pytest_backends.matrix.configs import DEFAULT_ID, ConfigError, base_test_id

__all__ = [
    "FAILING",
    "OUTCOMES",
    "REPORT_FORMAT",
    "ConfigRow",
    "Result",
    "RunSummary",
    "base_test_id",
    "build_rows",
    "grid_cell",
    "grid_columns",
    "render_json",
    "render_terminal",
    "skip_reason",
]

#: Outcome columns, in display order. ``conflict``: sources of a merged report disagree.
#: ``interrupted``: the item started and the run stopped (Ctrl-C) before it finished.
OUTCOMES = (
    "passed",
    "failed",
    "error",
    "skipped",
    "xfailed",
    "xpassed",
    "interrupted",
    "conflict",
)
#: The ``format`` name of a matrix report file.
REPORT_FORMAT = _files.REPORT_FORMAT
#: Outcomes listed under the grid as failures.
FAILING = ("failed", "error", "xpassed", "interrupted", "conflict")
#: The categories of pytest's closing line that make a run fail.
SESSION_FAILING = ("failed", "error")
NOT_EXERCISED = "not exercised"
_ALWAYS = ("passed", "failed", "skipped")


@dataclass
class Result:
    """The final outcome of one matrix item."""

    nodeid: str
    test: str
    config: str
    outcome: str = "passed"
    message: str = ""
    verify: str | None = None
    verify_detail: str = ""
    duration: float = 0.0
    #: The labels of the runs that reported this item (one, unless merged).
    sources: list[str] = field(default_factory=list)
    crashed: bool = False
    #: The whole failure text (``message`` is its first line).
    detail: str = ""


@dataclass
class ConfigRow:
    """Outcome counts and notable tests of one configuration."""

    config: str
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    not_exercised: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    unexercised: list[tuple[str, str]] = field(default_factory=list)
    skip_reasons: list[str] = field(default_factory=list)


_EXIT_NAMES = {int(code): code.name.lower().replace("_", " ") for code in pytest.ExitCode}


@dataclass
class RunSummary:
    """What pytest said of the whole session: its closing-line counts, exit status and problems.

    ``outcomes`` counts reports the way pytest's terminal summary does (a test
    that passes and then errors at teardown counts once as passed and once as
    an error); ``problems`` lists every failed, errored or crashed item of the
    session, with or without a backend configuration, and failed collections.
    """

    outcomes: dict[str, int] = field(default_factory=dict)
    exitstatus: int = 0
    interrupted: bool = False
    #: ``{"nodeid", "when", "outcome", "message"}`` (``"source"`` in a merged report).
    problems: list[dict[str, str]] = field(default_factory=list)

    @property
    def exit(self) -> str:
        """The exit status's name (``tests failed``)."""
        return _EXIT_NAMES.get(self.exitstatus, f"exit status {self.exitstatus}")

    def closing_line(self) -> str:
        """pytest's closing line: ``1 failed, 2 passed, 1 error`` (``2 errors``, as pytest says)."""
        first = ("failed", "passed", "skipped", "deselected", "xfailed", "xpassed", "error")
        order = sorted(
            self.outcomes.items(),
            key=lambda kv: (first.index(kv[0]) if kv[0] in first else len(first), kv[0]),
        )
        parts = [f"{n} {k}{'s' if k == 'error' and n != 1 else ''}" for k, n in order if n]
        return ", ".join(parts) or "no tests ran"

    def to_plain(self) -> dict[str, Any]:
        """The JSON report's ``session`` section."""
        return {
            "exitstatus": self.exitstatus,
            "exit": self.exit,
            "interrupted": self.interrupted,
            "outcomes": dict(self.outcomes),
            "problems": [dict(p) for p in self.problems],
        }

    @classmethod
    def from_plain(cls, value: object) -> RunSummary | str:
        """Parse a ``session`` section; a string says what is wrong with it."""
        if not isinstance(value, dict):
            return f"'session' must be an object, got {value!r}"
        status = value.get("exitstatus", 0)
        if isinstance(status, bool) or not isinstance(status, int) or status < 0:
            return f"session.exitstatus must be a non-negative integer, got {status!r}"
        outcomes = value.get("outcomes", {})
        if not isinstance(outcomes, dict) or not all(
            isinstance(k, str) and isinstance(n, int) and not isinstance(n, bool) and n >= 0
            for k, n in outcomes.items()
        ):
            return "session.outcomes must map outcomes to non-negative counts"
        problems = value.get("problems", [])
        if not isinstance(problems, list) or not all(
            isinstance(p, dict)
            and isinstance(p.get("nodeid"), str)
            and all(isinstance(v, str) for v in p.values())
            for p in problems
        ):
            return "session.problems must be a list of objects with a 'nodeid' string"
        interrupted = value.get("interrupted", False)
        if not isinstance(interrupted, bool):
            return f"session.interrupted must be true or false, got {interrupted!r}"
        return cls(dict(outcomes), status, interrupted, [dict(p) for p in problems])

    @classmethod
    def merged(cls, parts: Sequence[tuple[str, RunSummary]]) -> RunSummary:
        """The sources' summaries added up (the order of ``parts`` does not matter).

        Counts are summed, problems joined (each names its source), and the
        exit status is the highest non-zero one: a merged run is green only
        if every source was.
        """
        outcomes: dict[str, int] = {}
        problems: list[dict[str, str]] = []
        for label, part in parts:
            for k, n in part.outcomes.items():
                outcomes[k] = outcomes.get(k, 0) + n
            problems += [{**p, "source": p.get("source", label)} for p in part.problems]
        problems.sort(key=lambda p: (p["nodeid"], p.get("when", ""), p.get("source", "")))
        statuses = [part.exitstatus for _, part in parts]
        return cls(
            dict(sorted(outcomes.items(), key=lambda kv: _order_key(kv[0]))),
            max(statuses, default=0),
            any(part.interrupted for _, part in parts),
            problems,
        )


def _order_key(outcome: str) -> tuple[int, str]:
    return (OUTCOMES.index(outcome) if outcome in OUTCOMES else len(OUTCOMES), outcome)


def _short(text: str, limit: int = 300) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    return first if len(first) <= limit else first[: limit - 3] + "..."


def failure_message(report: pytest.TestReport) -> str:
    """One line: the exception's message, or the report's first line.

    A report given as text with a traceback (a module that fails to import:
    ``python.py:528: in importtestmodule``, or "ImportError while importing test
    module ...") is summed up by its last ``E`` line instead: the exception
    (``SyntaxError: invalid syntax``, ``ModuleNotFoundError: No module named 'x'``).
    """
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    if isinstance(message, str):
        return _short(message)
    text = str(report.longrepr or "")
    raised = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    return _short(raised[-1] if raised and raised[-1] else text)


def failure_detail(report: pytest.TestReport) -> str:
    """The whole failure text: the exception's full message, else the whole report."""
    crash = getattr(report.longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    if isinstance(message, str) and message.strip():
        return message.strip()
    return str(report.longreprtext or report.longrepr or "").strip()


def skip_reason(report: pytest.TestReport) -> str:
    """Why ``report`` was skipped (the reason without pytest's ``Skipped:`` prefix)."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return _short(str(longrepr or ""))


def is_crash(report: pytest.TestReport) -> bool:
    """Whether ``report`` stands for a test whose process died (pytest-xdist's crash report).

    xdist reports an item whose worker died with a failed report of no
    phase (``when`` is ``"???"``) and without the item's user properties.
    """
    return bool(report.failed) and report.when not in ("setup", "call", "teardown")


def config_in_nodeid(nodeid: str, parse: Callable[[str], object]) -> str | None:
    """The longest run of ``-``-separated parameter-id parts that ``parse`` accepts.

    For a crash report, which carries no properties: ``t.py::test_x[3-mkldnn-off]``
    -> ``mkldnn-off`` when ``parse`` (a registry's ``parse_id``) accepts it.
    """
    start = nodeid.find("[", nodeid.rfind("::") + 1)
    if start < 0 or not nodeid.endswith("]"):
        return None
    parts = nodeid[start + 1 : -1].split("-")
    best: str | None = None
    for i in range(len(parts)):
        for j in range(len(parts), i, -1):
            candidate = "-".join(parts[i:j])
            if best is not None and len(candidate) <= len(best):
                break
            if candidate == DEFAULT_ID:
                continue
            try:
                parse(candidate)
            except ConfigError:
                continue
            best = candidate
            break
    return best


def update(result: Result, report: pytest.TestReport) -> None:
    """Fold one phase's report into ``result`` (reruns start over at setup)."""
    result.duration += report.duration
    xfail = hasattr(report, "wasxfail")
    if report.failed:
        result.detail = failure_detail(report)
    if is_crash(report):
        result.outcome, result.crashed = "failed", True
        result.message = "crashed: " + failure_message(report)
    elif report.when == "setup":
        result.verify, result.verify_detail, result.message = None, "", ""
        result.detail = failure_detail(report) if report.failed else ""
        if report.failed:
            result.outcome, result.message = "error", failure_message(report)
        elif report.skipped:
            result.outcome = "xfailed" if xfail else "skipped"
            result.message = skip_reason(report) if not xfail else str(report.wasxfail)
        else:
            result.outcome = "passed"
    elif report.when == "call":
        result.verify = _shared.read(report, _shared.PROPERTY_VERIFY_STATUS, text=True)
        result.verify_detail = _shared.read(report, _shared.PROPERTY_VERIFY_DETAIL, text=True) or ""
        if xfail:
            result.outcome = "xfailed" if report.skipped else "xpassed"
            result.message = str(report.wasxfail)
        elif report.failed:
            result.outcome, result.message = "failed", failure_message(report)
            parted = _shared.read(report, _shared.PROPERTY_DIVERGE, text=True)
            if parted:
                result.message += f" ({parted})"
                result.detail += f"\n{parted}"
        elif report.skipped:
            result.outcome, result.message = "skipped", skip_reason(report)
    elif report.failed and result.outcome not in ("failed", "error"):
        result.outcome, result.message = "error", failure_message(report)


def build_rows(results: Iterable[Result], order: Sequence[str]) -> list[ConfigRow]:
    """One row per config, in ``order`` (config ids); counts and notable tests filled in."""
    rows = {config: ConfigRow(config) for config in order}
    for result in sorted(results, key=lambda r: r.nodeid):
        row = rows.get(result.config)
        if row is None:  # a config missing from ``order``
            row = rows[result.config] = ConfigRow(result.config)
        row.counts[result.outcome] = row.counts.get(result.outcome, 0) + 1
        if result.outcome in FAILING:
            row.failures.append((result.nodeid, result.message))
        if result.outcome == "skipped" and result.message not in row.skip_reasons:
            row.skip_reasons.append(result.message)
        if result.verify == NOT_EXERCISED:
            row.not_exercised += 1
            row.unexercised.append((result.nodeid, result.verify_detail))
    return list(rows.values())


def grid_columns(rows: Sequence[ConfigRow], verify: bool) -> list[str]:
    columns = [o for o in OUTCOMES if o in _ALWAYS or any(r.counts.get(o) for r in rows)]
    if verify or any(r.not_exercised for r in rows):
        columns.append(NOT_EXERCISED)
    return columns


def grid_cell(row: ConfigRow, column: str) -> int:
    return row.not_exercised if column == NOT_EXERCISED else row.counts.get(column, 0)


def render_terminal(rows: Sequence[ConfigRow], verify: bool) -> list[str]:
    """The grid and the notable tests, as terminal lines."""
    if not rows:
        return ["no test ran under a backend configuration"]
    columns = grid_columns(rows, verify)
    width = max(len("config"), *(len(r.config) for r in rows), len("total"))
    lines = ["config".ljust(width) + "".join(f"  {c:>{max(len(c), 6)}}" for c in columns)]
    for row in rows:
        lines.append(
            row.config.ljust(width)
            + "".join(f"  {grid_cell(row, c):>{max(len(c), 6)}}" for c in columns)
        )
    totals = [sum(grid_cell(r, c) for r in rows) for c in columns]
    lines.append(
        "total".ljust(width) + "".join(f"  {t:>{max(len(c), 6)}}" for c, t in zip(columns, totals))
    )
    failing = [r for r in rows if r.failures]
    if failing:
        lines += ["", "failing tests per config:"]
        for row in failing:
            lines.append(f"  {row.config}")
            lines += [
                f"    {nodeid} - {message}" if message else f"    {nodeid}"
                for nodeid, message in row.failures
            ]
    unexercised = [r for r in rows if r.unexercised]
    if unexercised:
        lines += [
            "",
            "not exercised (the config's kernel path never ran; "
            "--backends-verify=strict fails these):",
        ]
        for row in unexercised:
            lines.append(f"  {row.config}")
            lines += [f"    {nodeid}: {detail}" for nodeid, detail in row.unexercised]
    skipped = [r for r in rows if r.skip_reasons]
    if skipped:
        lines += ["", "skip reasons per config:"]
        for row in skipped:
            lines += [
                f"  {row.config} ({row.counts['skipped']}): {reason}" for reason in row.skip_reasons
            ]
    return lines


def render_json(
    rows: Sequence[ConfigRow],
    results: Sequence[Result],
    *,
    environment: Sequence[str],
    settings: dict[str, Any],
    header: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    session: RunSummary | None = None,
) -> str:
    """The report as JSON text (the same counts as the terminal grid).

    ``header`` (label, torch and CUDA versions, merged sources) goes before
    the results, ``extra`` (a merged report's conflicts) after them.
    ``session`` (pytest's counts, exit status and every problem of the run)
    goes first, so a reader sees the run's verdict before the matrix.
    """
    grid_totals = {o: sum(r.counts.get(o, 0) for r in rows) for o in OUTCOMES} | {
        "not_exercised": sum(r.not_exercised for r in rows)
    }
    data = {
        "format": _files.REPORT_FORMAT,
        "version": 1,
        **(header or {}),
        **({"session": session.to_plain()} if session is not None else {}),
        "environment": list(environment),
        "settings": settings,
        "configs": [
            {
                "id": row.config,
                "counts": {o: row.counts.get(o, 0) for o in OUTCOMES},
                "not_exercised": row.not_exercised,
                "failures": [{"nodeid": n, "message": m} for n, m in row.failures],
                "not_exercised_tests": [{"nodeid": n, "detail": d} for n, d in row.unexercised],
                "skip_reasons": row.skip_reasons,
            }
            for row in rows
        ],
        "tests": [_result_data(r) for r in sorted(results, key=lambda r: r.nodeid)],
        "grid_totals": grid_totals,
        # pytest's own counts when the run's session is known: never greener than the run.
        "totals": dict(session.outcomes) if session is not None else grid_totals,
        **(extra or {}),
    }
    return dumps_report(data)


_RESULT_FIELDS = tuple(f.name for f in fields(Result))
_result_values = operator.attrgetter(*_RESULT_FIELDS)


def _result_data(result: Result) -> dict[str, Any]:
    """``asdict(result)`` without its deep copy: every field is a scalar or a list of str."""
    data = dict(zip(_RESULT_FIELDS, _result_values(result)))
    data["sources"] = list(result.sources)
    return data


def _line_encoder() -> Callable[[Any], str]:
    """``json.dumps`` for many small values: the C encoder built once, not once per call.

    Falls back to ``json.dumps`` itself where the interpreter's private C
    encoder is missing or does not produce exactly the same text.
    """
    try:
        from json import encoder as json_encoder

        make = getattr(json_encoder, "c_make_encoder", None)
        if make is None:
            return json.dumps
        c_encode = make(
            None,  # no circular-reference check: reports are trees
            json.JSONEncoder().default,
            json_encoder.encode_basestring_ascii,
            None,
            ": ",
            ", ",
            False,
            False,
            True,
        )

        def encode(value: Any) -> str:
            return "".join(c_encode(value, 0))

        probe = {"a": [1, -2.5, None, '\u00e9\n"', 1e300], "b": {"c": True, "d": []}, "e": ""}
        if encode(probe) == json.dumps(probe):
            return encode
    except Exception:  # any surprise in a private API: the public one
        pass
    return json.dumps


_encode_line = _line_encoder()


def dumps_report(data: Mapping[str, Any]) -> str:
    """JSON text of a report: one line per member, and one per element of a list member.

    Each line is encoded by the C encoder (``json.dumps`` without ``indent``
    falls back to the pure-Python one), so a report with 10^5 configurations is
    written about as fast as a plain ``json.dump``, and stays readable and
    diffable line by line. ``"format"`` stays the first member, which is how
    an earlier report is recognised from its first bytes.
    """
    dumps = _encode_line
    lines = ["{"]
    last = len(data) - 1
    for i, (key, value) in enumerate(data.items()):
        comma = "," if i < last else ""
        if isinstance(value, list) and value:
            lines.append(f"  {dumps(key)}: [")
            lines.append(",\n".join(["    " + dumps(item) for item in value]))
            lines.append(f"  ]{comma}")
        else:
            lines.append(f"  {dumps(key)}: {dumps(value)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"
