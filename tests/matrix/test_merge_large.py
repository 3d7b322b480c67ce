"""Large merged reports: recognised by their header, rewritten to the same bytes.

The 10^5-configuration run of the same scenario is in
``benchmarks/bench_merge.py`` (it takes seconds of CPU); here the size limit
up to which an existing file is parsed whole is lowered, so a report of a
few thousand configurations is "large" in the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_backends import _files
from pytest_backends.__main__ import main
from pytest_backends.matrix.coverage import Coverage
from pytest_backends.matrix.report import Result, build_rows, dumps_report, render_json


def _write_job(path: Path, label: str, configs: list[str]) -> None:
    results = [
        Result(f"t.py::test_x[{c}]", "t.py::test_x", c, "passed", sources=[label]) for c in configs
    ]
    coverage = Coverage({r.nodeid: r.config for r in results}, {r.nodeid for r in results}, {})
    path.write_text(
        render_json(
            build_rows(results, configs),
            results,
            environment=[f"host {label}"],
            settings={"verify": "off"},
            header={"label": label, "torch": "2.13.0+cpu", "cuda": None},
            extra={"coverage": coverage.to_plain()},
        )
    )


def test_a_merge_larger_than_the_parse_limit_runs_twice_to_the_same_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_files, "_RECOGNISE_LIMIT", 64 << 10)
    configs = [f"cfg{i:05d}" for i in range(2000)]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    _write_job(a, "job-a", configs[::2])
    _write_job(b, "job-b", configs[1::2])
    out = tmp_path / "merged.json"
    argv = ["merge", "--report", str(out), str(a), str(b)]
    assert main(argv) == 0, capsys.readouterr().err
    first = out.read_bytes()
    assert len(first) > 4 * _files._RECOGNISE_LIMIT
    assert main(argv) == 0, capsys.readouterr().err
    assert out.read_bytes() == first
    merged = json.loads(first)
    assert merged["format"] == _files.REPORT_FORMAT
    assert len(merged["tests"]) == len(configs)


def _report_text(**members: object) -> str:
    return json.dumps(members)


@pytest.mark.parametrize(
    ("head", "kind", "expected"),
    [
        ('{"format": "pytest-backends-report", "tests": [', _files.JSON_REPORT, True),
        ('\ufeff \n{\n  "format" :"pytest-backends-report"', _files.JSON_REPORT, True),
        ('{"format": "pytest-backends-census"}', _files.JSON_REPORT, False),
        ('{"format": "pytest-backends-census", "entries": [', _files.CENSUS, True),
        ('{"format": "pytest-backends-baseline"}', _files.BASELINE, True),
        ('{"format": "pytest-backends-report\\"x"}', _files.JSON_REPORT, False),
        ('{"formats": "pytest-backends-report"}', _files.JSON_REPORT, False),
        ('{"tests": [], "format": "pytest-backends-report"}', _files.JSON_REPORT, False),
        ('["format", "pytest-backends-report"]', _files.JSON_REPORT, False),
        ("def test_x():\n    pass\n", _files.JSON_REPORT, False),
    ],
)
def test_json_kinds_are_told_from_the_first_member(
    head: str, kind: _files.OutputKind, expected: bool
) -> None:
    assert kind.header(head) is expected


def test_large_files_are_judged_by_their_header_small_ones_by_their_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_files, "_RECOGNISE_LIMIT", 1 << 10)
    filler = ["x" * 100] * 20  # past the lowered limit
    path = tmp_path / "r.json"
    # Ours, any size: the header says so.
    path.write_text(_report_text(format=_files.REPORT_FORMAT, tests=filler))
    _files.write_output(path, "{}", _files.JSON_REPORT)
    # Keys reordered (an editor sorted them): recognised when small enough to parse...
    path.write_text(_report_text(configs=[], format=_files.REPORT_FORMAT))
    _files.write_output(path, "{}", _files.JSON_REPORT)
    # ...but a large file is never judged by a truncated body: refused.
    big = _report_text(configs=filler, format=_files.REPORT_FORMAT)
    path.write_text(big)
    with pytest.raises(_files.OutputFileError, match="refusing to overwrite"):
        _files.write_output(path, "{}", _files.JSON_REPORT)
    assert path.read_text() == big


def test_report_json_has_one_line_per_list_element_and_round_trips() -> None:
    data = {
        "format": _files.REPORT_FORMAT,
        "version": 1,
        "label": 'a "quoted" \u00e9 label',
        "empty": [],
        "configs": [{"id": "cpu", "counts": {"passed": 1}}],
        "tests": [{"nodeid": f"t.py::test[{i}]", "sources": ["a"]} for i in range(3)],
        "totals": {"passed": 3},
    }
    text = dumps_report(data)
    assert json.loads(text) == data
    lines = text.splitlines()
    assert lines[:2] == ["{", f'  "format": "{_files.REPORT_FORMAT}",']
    assert sum(line.startswith('    {"nodeid"') for line in lines) == 3
    assert _files.JSON_REPORT.header(text)
