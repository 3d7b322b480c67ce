"""Merge matrix reports from several jobs (CI shards, machines) into one matrix.

Each input is a JSON report written by ``--backends-report`` (or an earlier
merge). The merged report lists its inputs under ``sources`` (file, label,
environment, settings, versions) and keeps, on every test row, the labels of
the sources that reported it. The same test under the same configuration
(the same node id) reported by two sources with different outcomes becomes
one ``conflict`` row, with every source's outcome under ``conflicts``; one
outcome never silently replaces another. A skip is not a competing outcome:
a CPU-only job skips the CUDA configurations a GPU job runs, so where some
sources ran an item and others skipped it, the row shows where it ran and
the skips are listed under ``skipped_elsewhere``. Merging a merged report
again gives the same result as merging its inputs.

Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import gc
import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_backends import _files
from pytest_backends._sources import MergeInputError, load_json, unique_label, version_warning
from pytest_backends.matrix.axes import builtin_registry
from pytest_backends.matrix.configs import ConfigError
from pytest_backends.matrix.coverage import (
    Coverage,
    CoverageGaps,
    find_gaps,
    missing_note,
    parse_coverage,
)
from pytest_backends.matrix.merge_copies import drop_contained, drop_copies
from pytest_backends.matrix.report import (
    OUTCOMES,
    REPORT_FORMAT,
    ConfigRow,
    Result,
    RunSummary,
    build_rows,
    render_json,
    render_terminal,
)
from pytest_backends.matrix.report_html import render_html

__all__ = ["MergedReport", "ReportInput", "merge_reports", "read_report"]

_KNOWN_FORMATS = {
    "pytest-backends-census": "a determinism census (merge it with --census OUT.json)",
    "pytest-backends-baseline": "a determinism baseline, which is not merged",
}


@dataclass
class ReportInput:
    """One report file as read: its sources and its results, one per source and node id."""

    path: Path
    sources: list[dict[str, Any]]
    configs: list[str]
    #: ``(source label, result)`` pairs; a conflict row of a merged input is split back.
    results: list[tuple[str, Result]]
    #: The collected items and what ran (``None``: a report without them).
    coverage: Coverage | None = None
    #: pytest's verdict on the run (``None``: a report written before it was recorded).
    session: RunSummary | None = None


def _fail(path: Path, message: str) -> MergeInputError:
    return MergeInputError(f"report file {path}: {message}")


def _check_header(path: Path, data: Mapping[str, Any]) -> None:
    fmt = data.get("format")
    if fmt is None and isinstance(data.get("tests"), list) and "configs" in data:
        fmt = REPORT_FORMAT  # written before reports carried a format name
    if fmt != REPORT_FORMAT:
        kind = _KNOWN_FORMATS.get(str(fmt))
        if kind:
            raise MergeInputError(f"{path} is {kind}, not a matrix report")
        raise _fail(
            path,
            f"'format' must be {REPORT_FORMAT!r}, got {fmt!r}; is it a report "
            "written by --backends-report?",
        )
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _fail(path, f"'version' must be a positive integer, got {version!r}")
    if version > 1:
        raise _fail(
            path,
            f"format version {version} is newer than this pytest-backends reads "
            "(1); upgrade pytest-backends",
        )


_RESULT_FIELDS = {f.name: f for f in dataclasses.fields(Result)}
_STR_FIELDS = ("nodeid", "test", "config", "outcome", "message", "verify_detail", "detail")


def _result(path: Path, i: int, row: object) -> Result:
    where = f"tests[{i}]"
    if not isinstance(row, dict):
        raise _fail(path, f"{where} must be an object, got {row!r}")
    for name in _STR_FIELDS:
        if name in row and not isinstance(row[name], str):
            raise _fail(path, f"{where}: {name!r} must be a string, got {row[name]!r}")
    for name in ("nodeid", "config", "outcome"):
        if not row.get(name):
            raise _fail(path, f"{where}: {name!r} is missing")
    if row["outcome"] not in OUTCOMES:
        raise _fail(
            path, f"{where}: 'outcome' must be one of {', '.join(OUTCOMES)}, got {row['outcome']!r}"
        )
    verify = row.get("verify")
    if verify is not None and not isinstance(verify, str):
        raise _fail(path, f"{where}: 'verify' must be a string or null, got {verify!r}")
    if not isinstance(row.get("crashed", False), bool):
        raise _fail(path, f"{where}: 'crashed' must be true or false, got {row['crashed']!r}")
    duration = row.get("duration", 0.0)
    if isinstance(duration, bool) or not isinstance(duration, (int, float)):
        raise _fail(path, f"{where}: 'duration' must be a number, got {duration!r}")
    sources = row.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise _fail(path, f"{where}: 'sources' must be a list of labels")
    values = {k: v for k, v in row.items() if k in _RESULT_FIELDS}
    values.setdefault("test", row["nodeid"])
    values["duration"] = float(duration)
    values["sources"] = list(sources)
    return Result(**values)


def _is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_source_fields(path: Path, where: str, data: Mapping[str, Any]) -> None:
    """The fields a source (a report's header, or a merged report's ``sources[i]``) may have."""
    label = data.get("label")
    if label is not None and not isinstance(label, str):
        raise _fail(path, f"{where}'label' must be a string, got {label!r}")
    for name in ("torch", "cuda", "file", "run"):
        value = data.get(name)
        if value is not None and not isinstance(value, str):
            raise _fail(path, f"{where}{name!r} must be a string or null, got {value!r}")
    environment = data.get("environment")
    if environment is not None and not _is_str_list(environment):
        raise _fail(path, f"{where}'environment' must be a list of strings, got {environment!r}")
    settings = data.get("settings")
    if settings is not None and not isinstance(settings, dict):
        raise _fail(path, f"{where}'settings' must be an object, got {settings!r}")


def _check_schema(path: Path, data: Mapping[str, Any]) -> None:
    """Check every field merge reads, so a bad input is refused before anything is written."""
    _check_source_fields(path, "", data)
    configs = data.get("configs")
    if configs is not None:
        if not isinstance(configs, list):
            raise _fail(path, f"'configs' must be a list, got {configs!r}")
        for i, config in enumerate(configs):
            if not isinstance(config, dict) or not isinstance(config.get("id"), str):
                raise _fail(path, f"configs[{i}] must be an object with an 'id' string")
            counts = config.get("counts", {})
            if not isinstance(counts, dict) or not all(_is_count(n) for n in counts.values()):
                raise _fail(path, f"configs[{i}].counts must map outcomes to non-negative counts")
    nested = data.get("sources")
    if nested is not None:
        if not isinstance(nested, list):
            raise _fail(path, f"'sources' must be a list, got {nested!r}")
        for i, src in enumerate(nested):
            if not isinstance(src, dict) or not isinstance(src.get("label"), str):
                raise _fail(path, f"sources[{i}] must be an object with a 'label' string")
            _check_source_fields(path, f"sources[{i}]: ", src)
            tests = src.get("tests", 0)
            if not _is_count(tests):
                raise _fail(path, f"sources[{i}].tests must be a non-negative count, got {tests!r}")


def _source(path: Path, data: Mapping[str, Any], tests: int) -> dict[str, Any]:
    label = data.get("label")
    return {
        "file": str(path),
        "label": label if isinstance(label, str) and label else Path(path).stem,
        "run": data.get("run"),
        "torch": data.get("torch"),
        "cuda": data.get("cuda"),
        "environment": list(data.get("environment") or []),
        "settings": data.get("settings") or {},
        "tests": tests,
    }


def read_report(path: Path) -> ReportInput:
    """Read and check one report file (a run's or a merged one)."""
    path = Path(path)
    data = load_json(path, "report file")
    _check_header(path, data)
    _check_schema(path, data)
    rows = data.get("tests")
    if not isinstance(rows, list):
        raise _fail(path, "'tests' must be a list")
    results = [_result(path, i, row) for i, row in enumerate(rows)]
    configs = [c.get("id") for c in data.get("configs") or [] if isinstance(c, dict)]
    nested = data.get("sources")
    if isinstance(nested, list) and nested:
        sources = [{"file": str(path), **s} for s in nested]
    else:
        sources = [_source(path, data, len(results))]
    default = str(sources[0]["label"])
    details = _conflict_details(path, data.get("conflicts"))
    skips = _conflict_details(path, data.get("skipped_elsewhere"), "skipped_elsewhere")
    pairs: list[tuple[str, Result]] = []
    for result in results:
        for label, outcome, message in skips.get(result.nodeid, ()):
            pairs.append(
                (
                    label,
                    dataclasses.replace(
                        result,
                        outcome=outcome,
                        message=message,
                        verify=None,
                        verify_detail="",
                        sources=[label],
                    ),
                )
            )
        if result.outcome == "conflict" and result.nodeid in details:
            for label, outcome, message in details[result.nodeid]:
                pairs.append(
                    (
                        label,
                        dataclasses.replace(
                            result, outcome=outcome, message=message, sources=[label]
                        ),
                    )
                )
            continue
        for label in result.sources or [default]:
            pairs.append((label, dataclasses.replace(result, sources=[label])))
    coverage = None
    if "coverage" in data:
        parsed = parse_coverage(data["coverage"])
        if isinstance(parsed, str):
            raise _fail(path, parsed)
        coverage = parsed
    session = None
    if "session" in data:
        summary = RunSummary.from_plain(data["session"])
        if isinstance(summary, str):
            raise _fail(path, summary)
        session = summary
    return ReportInput(
        path, sources, [c for c in configs if isinstance(c, str)], pairs, coverage, session
    )


def _conflict_details(
    path: Path, value: object, name: str = "conflicts"
) -> dict[str, list[tuple[str, str, str]]]:
    details: dict[str, list[tuple[str, str, str]]] = {}
    if value is None:
        return details
    if not isinstance(value, list):
        raise _fail(path, f"{name!r} must be a list")
    for i, entry in enumerate(value):
        ok = (
            isinstance(entry, dict)
            and isinstance(entry.get("nodeid"), str)
            and isinstance(entry.get("outcomes"), list)
            and bool(entry.get("outcomes"))
        )
        outcomes = entry.get("outcomes") if isinstance(entry, dict) else None
        if not ok or not all(
            isinstance(o, dict)
            and isinstance(o.get("source"), str)
            and o.get("outcome") in OUTCOMES
            and isinstance(o.get("message", ""), str)
            for o in outcomes or ()
        ):
            raise _fail(
                path,
                f"{name}[{i}] must name a 'nodeid' and list at least one of its 'outcomes' "
                "(source, outcome, message)",
            )
        assert isinstance(entry, dict) and isinstance(outcomes, list)
        details[entry["nodeid"]] = [
            (o["source"], o["outcome"], o.get("message", "")) for o in outcomes
        ]
    return details


@dataclass
class MergedReport:
    """The merged matrix: rows per config, one result per node id, its sources and conflicts."""

    sources: list[dict[str, Any]]
    results: list[Result]
    order: list[str]
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: Items some sources skipped and others ran (same schema as ``conflicts``).
    skipped_elsewhere: list[dict[str, Any]] = field(default_factory=list)
    #: Every source's collected items and what ran (``None``: no source listed them).
    coverage: Coverage | None = None
    #: The sources' pytest verdicts added up (``None``: no source recorded one).
    session: RunSummary | None = None
    #: ``merge --strict``: coverage gaps fail the merge, and its outputs say so.
    strict: bool = False

    def errors(self) -> list[str]:
        """What fails the merge itself (``--strict`` and a gap), for its outputs."""
        gaps = self.gaps.strict if self.strict else []
        if not gaps:
            return []
        return [
            f"merge --strict failed: {len(gaps)} test(s), configuration(s) or item(s) "
            "ran in no job (listed under Warnings)"
        ]

    @property
    def gaps(self) -> CoverageGaps:
        """The tests, configurations and items that ran in no source."""
        return find_gaps(self.coverage) if self.coverage is not None else CoverageGaps()

    def all_warnings(self) -> list[str]:
        """The merge's warnings, the coverage gaps (what ran in no job) included."""
        gaps = self.gaps
        return [*self.warnings, *(["\n".join(gaps.lines())] if gaps else [])]

    @property
    def verify(self) -> bool:
        """Whether any source ran with kernel-path verification."""
        return any((s.get("settings") or {}).get("verify", "off") != "off" for s in self.sources)

    def rows(self) -> list[ConfigRow]:
        """One row per configuration, as after a run."""
        return build_rows(self.results, self.order)

    def environment(self) -> list[str]:
        """The environment lines every source shares."""
        lists = [list(s.get("environment") or []) for s in self.sources]
        if not lists:
            return []
        return [line for line in lists[0] if all(line in other for other in lists[1:])]

    def to_json(self) -> str:
        """The merged report as JSON text (the same schema as a run's report)."""
        # Like merging, rendering builds one small acyclic dict per row and test.
        paused = gc.isenabled()
        gc.disable()
        try:
            return self._to_json()
        finally:
            if paused:
                gc.enable()

    def _to_json(self) -> str:
        header = {"label": "merged", "sources": self.sources}
        return render_json(
            self.rows(),
            self.results,
            environment=self.environment(),
            settings={},
            header=header,
            session=self.session,
            extra={
                "conflicts": self.conflicts,
                "skipped_elsewhere": self.skipped_elsewhere,
                "warnings": self.all_warnings(),
                "merge_errors": self.errors(),
                **({"coverage": self.coverage.to_plain()} if self.coverage is not None else {}),
            },
        )

    def to_html(self) -> str:
        """The merged HTML grid, with a badge per source on every cell."""
        return render_html(
            self.rows(),
            self.results,
            environment=self.environment(),
            verify=self.verify,
            sources=self.sources,
            session=self.session,
            warnings=self.all_warnings(),
            errors=self.errors(),
        )

    def terminal_lines(self) -> list[str]:
        """The sources, the grid as after a run, and the conflicts."""
        lines = [f"merged {len(self.sources)} source(s):"]
        for i, src in enumerate(self.sources, 1):
            versions = f"torch {src.get('torch') or 'unknown'}"
            if src.get("cuda"):
                versions += f", CUDA {src['cuda']}"
            lines.append(
                f"  [{i}] {src['label']}: {src.get('tests', '?')} tests from "
                f"{src.get('file')} ({versions})"
            )
        if self.session is not None:
            lines.append(
                f"pytest, all sources: {self.session.closing_line()}; exit status "
                f"{self.session.exitstatus} ({self.session.exit})"
                + (", interrupted" if self.session.interrupted else "")
            )
        lines.append("")
        lines += render_terminal(self.rows(), self.verify)
        if self.conflicts:
            lines += [
                "",
                f"{len(self.conflicts)} conflict(s): the same test and config "
                "gave different outcomes in different sources:",
            ]
            for entry in self.conflicts:
                lines.append(f"  {entry['nodeid']}")
                lines += [
                    f"    {o['source']}: {o['outcome']}"
                    + (f" - {o['message']}" if o["message"] else "")
                    for o in entry["outcomes"]
                ]
        if self.skipped_elsewhere:
            lines += [
                "",
                f"{len(self.skipped_elsewhere)} item(s) ran in some sources and were "
                "skipped in others; the grid shows where they ran "
                "(skipped_elsewhere in the JSON report)",
            ]
        return lines

    def write_json(self, path: Path) -> None:
        """Write the merged JSON report atomically (never over a file the plugin did not write)."""
        _files.write_output(Path(path), self.to_json(), _files.JSON_REPORT)

    def write_html(self, path: Path) -> None:
        """Write the merged HTML grid atomically (never over a file the plugin did not write)."""
        _files.write_output(Path(path), self.to_html(), _files.HTML_REPORT)


def merge_reports(paths: Sequence[Path]) -> MergedReport:
    """Merge the report files ``paths`` (raises :class:`MergeInputError` naming a bad file)."""
    if not paths:
        raise MergeInputError("no report files to merge")
    # Merging builds millions of small acyclic objects at 10^5 configs; the cyclic
    # collector would rescan them over and over (half the time), and finds nothing.
    paused = gc.isenabled()
    gc.disable()
    try:
        return _merge_reports(paths)
    finally:
        if paused:
            gc.enable()


def _merge_reports(paths: Sequence[Path]) -> MergedReport:
    inputs, contained = drop_contained([read_report(Path(p)) for p in paths])
    inputs, copies = drop_copies(inputs)
    copies = [*contained, *copies]
    taken: set[str] = set()
    sources: list[dict[str, Any]] = []
    by_nodeid: dict[str, list[tuple[str, Result]]] = {}
    first_label: dict[Path, dict[str, Any]] = {}
    for item in inputs:
        renamed: dict[str, str] = {}
        for src in item.sources:
            label = unique_label(str(src["label"]), taken, str(src.get("file", item.path)))
            renamed[str(src["label"])] = label
            sources.append({**src, "label": label})
            first_label.setdefault(item.path, sources[-1])
        for label, result in item.results:
            new = renamed.get(label, label)
            result.sources = [new]
            by_nodeid.setdefault(result.nodeid, []).append((new, result))
    results: list[Result] = []
    conflicts: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for nodeid in sorted(by_nodeid):
        reports = by_nodeid[nodeid]
        ran = [(label, r) for label, r in reports if r.outcome != "skipped"]
        if ran and len(ran) < len(reports):
            skipped.append(
                {
                    "nodeid": nodeid,
                    "config": reports[0][1].config,
                    "outcomes": [
                        {"source": label, "outcome": r.outcome, "message": r.message}
                        for label, r in reports
                        if r.outcome == "skipped"
                    ],
                }
            )
            reports = ran
        labels = list(dict.fromkeys(label for label, _ in reports))
        outcomes = {r.outcome for _, r in reports}
        first = reports[0][1]
        if len(outcomes) == 1:
            results.append(dataclasses.replace(first, sources=labels))
            continue
        entries = [
            {"source": label, "outcome": r.outcome, "message": r.message} for label, r in reports
        ]
        conflicts.append({"nodeid": nodeid, "config": first.config, "outcomes": entries})
        message = "; ".join(
            f"{e['outcome']} on {e['source']}" + (f" ({e['message']})" if e["message"] else "")
            for e in entries
        )
        results.append(
            dataclasses.replace(
                first,
                outcome="conflict",
                message=message,
                verify=None,
                verify_detail="",
                sources=labels,
                duration=sum(r.duration for _, r in reports),
            )
        )
    order = _config_order([item.configs for item in inputs] + [[r.config for r in results]])
    coverage = None
    for item in inputs:
        if item.coverage is not None:
            coverage = coverage or Coverage()
            coverage.update(item.coverage)
    note = missing_note({str(item.path): item.coverage is not None for item in inputs})
    if coverage is None:
        note = "no input lists its collected tests: coverage is not checked"
    warnings = [*copies, *(w for w in [version_warning(sources, "reports"), note] if w)]
    summaries = [
        (str(src["label"]), item.session)
        for item, src in zip(inputs, (first_label[item.path] for item in inputs))
        if item.session is not None
    ]
    session = RunSummary.merged(summaries) if summaries else None
    return MergedReport(sources, results, order, conflicts, warnings, skipped, coverage, session)


def _config_order(lists: Iterable[Sequence[str]]) -> list[str]:
    """One order for the configs of all inputs, keeping each input's (sorted) order.

    Ties are broken by the built-in axes' order, then by first appearance.
    """
    first: dict[str, int] = {}
    after: dict[str, set[str]] = {}
    for ids in lists:
        for i, config in enumerate(ids):
            first.setdefault(config, len(first))
            after.setdefault(config, set())
            if i:
                after[ids[i - 1]].add(config)
    registry = builtin_registry()

    def key(config: str) -> tuple[int, tuple[tuple[int, int], ...], int]:
        try:
            return (0, registry.sort_key(registry.parse_id(config)), first[config])
        except (ConfigError, KeyError, ValueError):
            return (1, (), first[config])

    waiting = {c: 0 for c in first}
    for successors in after.values():
        for c in successors:
            waiting[c] += 1
    keys = {c: key(c) for c in first}
    order: list[str] = []
    # A heap keeps the topological sort O(n log n) (10^5 configs merge in seconds).
    ready = [(keys[c], c) for c, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    while ready:
        _, config = heapq.heappop(ready)
        order.append(config)
        for c in after[config]:
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, (keys[c], c))
    # Inputs that disagree on the order (a cycle) keep first appearance for the rest.
    placed = set(order)
    order += sorted((c for c in first if c not in placed), key=lambda c: first[c])
    return order
